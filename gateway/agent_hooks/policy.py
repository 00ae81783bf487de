"""What the gateway says about one tool call of a Claude Code agent.

Four kinds of call:

* a raw call to a governed system (``kubectl apply``, ``curl https://api.stripe.com/…``,
  ``sendmail``), wherever it stands in the line (inside ``if``, ``bash -c``, ``$(…)``…):
  **deny**, naming the gateway tool to use instead; a command whose program name is computed
  when it runs (``$TOOL``, ``$(echo kube)ctl``) is denied too;
* a call of one of the gateway's own MCP tools (``mcp__effect-gateway__…``): **ask** when the
  contract needs a human approver for that payload (with the console link), else **allow** —
  the gateway itself validates, deduplicates and audits it;
* a Bash command that is not a plain sequence of simple commands (control flow, functions,
  ``eval``/``source``, substitutions, here-documents into a shell, a pattern or braces in a
  command word, ``find -exec``, ``xargs``, an interpreter whose ``-c`` code names a governed
  tool or SDK — gateway.agent_hooks.shell lists them): **ask**, with the reason. What such
  a line runs is decided only when it runs, so an unknown shell line is a human's call;
* anything else: **no decision**, so Claude Code's own permission rules apply. Answering
  "allow" there would switch off the user's prompts for every shell command.

Pure functions over plain data; the view does the I/O (auth, tenant patterns, links).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

from effect_gateway_client.models import tool_name

from gateway.agent_hooks import patterns, shell
from gateway.contracts import CONTRACTS, EffectContract
from gateway.submission import without_nulls

MCP_SERVER = "effect-gateway"
# A command is a line or two; a hook input beyond this is not matched at all (the view asks a
# human instead). With the tokeniser below the work is linear anyway; the cap bounds it.
MAX_SUBJECT = 8 * 1024
# A command word longer than this is not matched as a pattern against program names.
MAX_PATTERN = 64


@dataclass(frozen=True)
class Call:
    """One tool call as the rules see it: the Bash command read by gateway.agent_hooks.shell,
    the fetched URL's host, and the text tenant patterns are searched in."""

    tool: str
    commands: tuple[shell.SimpleCommand, ...] = ()
    host: str = ""
    texts: tuple[str, ...] = ()
    too_deep: bool = False
    unknown: tuple[str, ...] = ()  # why the command is not a plain sequence of simple commands


@dataclass(frozen=True)
class Rule:
    """A governed call: built in (``match`` over the parsed call, no regex) or a tenant's
    ``GovernedPattern`` row (``regex``, searched in each simple command / the URL).

    A built-in rule also says, as data, what it governs: ``programs``, the ``verbs`` that
    change something (``*`` is any word) or ``samples`` of arguments that make a call
    governed, and the words (``mentions``) whose appearance in an interpreter's code means
    the code may reach the same system. The hook and its tests read these, not copies."""

    name: str
    tools: str
    regex: str
    gateway_tool: str
    reason: str
    enabled: bool = True
    match: Callable[[Call], bool] | None = field(default=None, compare=False)
    programs: frozenset[str] = frozenset()
    verbs: tuple[tuple[str, ...], ...] = ()
    samples: tuple[str, ...] = ()
    mentions: frozenset[str] = frozenset()

    def matches(self, call: Call) -> bool:
        if self.match is not None:
            return self.match(call)
        try:
            # Tenant patterns run on RE2 (linear time, gateway.agent_hooks.patterns), each in
            # one simple command of at most MAX_SUBJECT characters.
            return patterns.fullmatch(self.tools, call.tool) and any(
                patterns.search(self.regex, text) for text in call.texts
            )
        except patterns.PatternError:
            return False  # validated on save; a bad row must not take the hook down

    def runs(self, command: shell.SimpleCommand) -> bool:
        return _runs(self.programs, command)


def _runs(programs: frozenset[str], command: shell.SimpleCommand) -> bool:
    """Whether ``command`` runs one of ``programs`` (a pattern matching one counts:
    ``/usr/local/bin/kube*l`` is kubectl)."""
    if command.program in programs:
        return True
    return (
        command.glob
        and len(command.program) <= MAX_PATTERN
        and any(fnmatchcase(program, command.program) for program in programs)
    )


def _mcp(effect_type: str) -> str:
    return f"mcp__{MCP_SERVER}__{tool_name(effect_type)}"


PAYMENT_HOSTS = ("api.stripe.com", "api.paypal.com", "api-m.paypal.com", "api.braintreegateway.com")
PAYMENT_DOMAINS = (".adyen.com",)


def is_payment_host(host: str) -> bool:
    host = host.lower().rstrip(".")
    return host in PAYMENT_HOSTS or host.endswith(PAYMENT_DOMAINS)


def _host_of(text: str) -> str:
    candidate = text if "://" in text else f"//{text}"
    try:
        return urlsplit(candidate).hostname or ""
    except ValueError:
        return ""


def _positionals(args: tuple[str, ...], value_flags: frozenset[str]) -> list[str]:
    """The arguments that are not options, skipping the values of options that take one."""
    result: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-") and arg != "-":
            skip = arg in value_flags
        else:
            result.append(arg.lower())
    return result


def _verbs(positionals: list[str], verbs: Iterable[tuple[str, ...]], within: int) -> bool:
    """True when a verb sequence (``*`` = any word) starts at one of the first ``within``
    positionals: sub-commands come first, after global options."""
    for verb in verbs:
        for start in range(min(within, len(positionals))):
            window = positionals[start : start + len(verb)]
            if len(window) == len(verb) and all(
                v in ("*", w) for v, w in zip(verb, window, strict=True)
            ):
                return True
    return False


# Global options that take a value, per tool family: their value is not a sub-command.
_KUBE_FLAGS = frozenset(
    {"-n", "--namespace", "--context", "--cluster", "--user", "--kubeconfig", "-s", "--server",
     "--token", "--as", "--as-group", "--kube-context", "--request-timeout", "-R", "--repo",
     "--auth-token", "--api-key", "-p", "--project-name", "--grpc-web-root-path", "--config"}
)  # fmt: skip


Verbs = tuple[tuple[str, ...], ...]


def _program(programs: frozenset[str], verbs: Verbs, within: int = 2) -> Callable[[Call], bool]:
    def match(call: Call) -> bool:
        return call.tool == "Bash" and any(
            _runs(programs, c) and _verbs(_positionals(c.args, _KUBE_FLAGS), verbs, within)
            for c in call.commands
        )

    return match


def _any_arg(programs: frozenset[str], predicate: Callable[[str], bool]) -> Callable[[Call], bool]:
    def match(call: Call) -> bool:
        return call.tool == "Bash" and any(
            _runs(programs, c) and any(predicate(a) for a in c.args) for c in call.commands
        )

    return match


MAIL_PROGRAMS = frozenset({"sendmail", "mailx", "mutt", "msmtp", "ssmtp", "swaks", "neomutt"})
_MAIL_SDKS = frozenset({"mail", "smtplib", "aiosmtplib", "sendgrid", "mailgun", "postmark"})


def _mail(call: Call) -> bool:
    if call.tool != "Bash":
        return False
    for c in call.commands:
        if _runs(MAIL_PROGRAMS, c):
            return True
        if _runs(frozenset({"mail"}), c) and "-s" in c.args:
            return True
        if any(a.lower().startswith(("smtp://", "smtps://")) for a in c.args):
            return True
    return False


def _verb_rule(
    name: str, gateway_tool: str, reason: str, programs: Iterable[str], verbs: Verbs, **extra: Any
) -> Rule:
    """A rule over a CLI's sub-commands: ``programs`` followed by one of ``verbs``."""
    names = frozenset(programs)
    mentions = frozenset(extra.pop("mentions", ())) | names
    return Rule(
        name, "Bash", "", gateway_tool, reason, match=_program(names, verbs),
        programs=names, verbs=verbs, mentions=mentions, **extra,
    )  # fmt: skip


_STRIPE_VERBS = (
    "create", "update", "delete", "cancel", "capture", "confirm", "pay", "void", "finalize",
    "close", "reverse", "approve", "decline", "send", "refund", "reject",
)  # fmt: skip
_STRIPE_WRITES = (*(("*", verb) for verb in _STRIPE_VERBS), ("post",), ("delete",), ("trigger",))
_KUBE_WRITES: Verbs = (
    ("apply",), ("create",), ("edit",), ("patch",), ("delete",), ("replace",), ("scale",),
    ("autoscale",), ("set",), ("label",), ("annotate",), ("drain",), ("cordon",),
    ("uncordon",), ("taint",), ("expose",), ("run",), ("rollout", "undo"),
    ("rollout", "restart"), ("rollout", "resume"), ("rollout", "pause"),
)  # fmt: skip
_PROMOTE = _mcp("deployment.release.promote")
_REFUND = _mcp("billing.refund.create")
_HTTP_CLIENTS = frozenset({"curl", "wget", "http", "https", "xh", "httpie", "curlie", "aria2c"})
_PSQL = frozenset({"psql", "pg_dump", "pg_restore", "pg_dumpall"})
# Payment SDKs and hosts: an interpreter's code naming one may call a payment provider.
_PAYMENT_WORDS = ("stripe", "paypal", "paypalrestsdk", "braintree", "braintreegateway", "adyen")

DEFAULT_RULES: tuple[Rule, ...] = (
    _verb_rule(
        "kubectl", _PROMOTE, "Changing a cluster with kubectl bypasses the release process.",
        ("kubectl", "oc", "kubectl.exe"), _KUBE_WRITES, mentions=("kubernetes",),
    ),
    _verb_rule(
        "helm", _PROMOTE, "Helm releases go through the gateway's deployment contracts.",
        ("helm",), (("upgrade",), ("install",), ("rollback",), ("uninstall",), ("delete",)),
        mentions=("pyhelm",),
    ),
    _verb_rule(
        "terraform", _PROMOTE, "Infrastructure changes are released through the gateway.",
        ("terraform", "tofu", "terragrunt"),
        (("apply",), ("destroy",), ("import",), ("taint",), ("state", "rm"), ("state", "mv")),
        mentions=("python_terraform", "cdktf"),
    ),
    _verb_rule(
        "gh-workflow", _PROMOTE, "Deployment workflows are started through the gateway.",
        ("gh",), (("workflow", "run"), ("run", "rerun")),
    ),
    _verb_rule(
        "argocd", _PROMOTE,
        "Argo CD syncs and rollbacks are releases: they go through the gateway.",
        ("argocd",),
        (("app", "sync"), ("app", "rollback"), ("app", "delete"), ("app", "set"),
         ("app", "create"), ("app", "patch")),
    ),
    _verb_rule(
        "stripe-cli", _REFUND,
        "Payment provider writes are made only by the gateway (exactly once, with approval).",
        ("stripe",), _STRIPE_WRITES, mentions=_PAYMENT_WORDS,
    ),
    Rule(
        "psql-production", "Bash", "", "",
        "Agents do not connect to production databases; ask an operator.",
        match=_any_arg(_PSQL, lambda arg: "prod" in arg.lower()),
        programs=_PSQL, samples=("db.prod.internal", "postgres://app@prod-db/shop"),
        mentions=_PSQL,
    ),
    Rule(
        "payment-api", "Bash", "", _REFUND,
        "Payment provider APIs are called only by the gateway (exactly once, with approval).",
        match=_any_arg(_HTTP_CLIENTS, lambda arg: is_payment_host(_host_of(arg))),
        programs=_HTTP_CLIENTS,
        samples=("https://api.stripe.com/v1/refunds", "api-m.paypal.com/v2/payments"),
        mentions=frozenset(_PAYMENT_WORDS),
    ),
    Rule(
        "payment-api-fetch", "WebFetch", "", _REFUND,
        "Payment provider APIs are called only by the gateway (exactly once, with approval).",
        match=lambda call: call.tool == "WebFetch" and is_payment_host(call.host),
    ),
    Rule(
        "mail", "Bash", "", _mcp("email.message.send"),
        "Email to customers is sent by the gateway (irreversible, audited).",
        match=_mail, programs=MAIL_PROGRAMS | {"mail"}, samples=("-s",),
        mentions=MAIL_PROGRAMS | _MAIL_SDKS,
    ),
    _verb_rule(
        "gh-release", _PROMOTE, "Releases are promoted through the gateway.",
        ("gh",),
        (("release", "create"), ("release", "edit"), ("release", "delete"),
         ("release", "upload")),
    ),
)  # fmt: skip
DYNAMIC_REASON = (
    "Blocked by the Effect Gateway: the program this command runs is computed when it runs "
    "({program!r}), so the gateway cannot tell whether it reaches a governed system. Write the "
    "program name literally."
)
TOO_DEEP_REASON = (
    "Blocked by the Effect Gateway: the command nests shells or substitutions deeper than "
    f"{shell.MAX_NESTING} levels (or is too long once unfolded); write it plainly."
)

ASK_REASON = (
    "The Effect Gateway cannot tell from its text what this command runs ({reasons}); a "
    "human decides. Written as plain commands (no control flow, substitutions, eval or "
    "wrappers around a governed tool), the gateway can judge it."
)
_WORD = re.compile(r"[a-z0-9_]+")


def effective_rules(tenant_rules: Iterable[Rule]) -> list[Rule]:
    """The defaults, each replaced by a tenant row of the same name, plus the tenant's own."""
    by_name = {rule.name: rule for rule in DEFAULT_RULES}
    for rule in tenant_rules:
        by_name[rule.name] = rule
    return [rule for rule in by_name.values() if rule.enabled]


def call_of(tool: str, tool_input: Mapping[str, Any]) -> Call:
    """Read one tool call (the caller has capped its size at MAX_SUBJECT)."""
    if tool == "Bash":
        parsed = shell.parse(str(tool_input.get("command", ""))[:MAX_SUBJECT])
        texts = tuple(
            " ".join((c.raw_program or c.program, *c.args))[:MAX_SUBJECT] for c in parsed.commands
        )
        return Call(
            tool, parsed.commands, texts=texts, too_deep=parsed.too_deep, unknown=parsed.unknown
        )
    if tool == "WebFetch":
        url = str(tool_input.get("url", ""))[:MAX_SUBJECT]
        return Call(tool, host=_host_of(url), texts=(url,))
    text = json.dumps(tool_input, sort_keys=True, default=str)[:MAX_SUBJECT]
    return Call(tool, texts=(text,))


def subject_size(tool: str, tool_input: Mapping[str, Any]) -> int:
    if tool == "Bash":
        return len(str(tool_input.get("command", "")))
    if tool == "WebFetch":
        return len(str(tool_input.get("url", "")))
    return 0  # other tools: only tenant patterns read them, over a truncated text


def governed(rules: Iterable[Rule], tool: str, tool_input: Mapping[str, Any]) -> Rule | None:
    call = call_of(tool, tool_input)
    for rule in rules:
        if rule.matches(call):
            return rule
    return None


def unknowable(tool: str, tool_input: Mapping[str, Any]) -> str:
    """Why a Bash command cannot be judged (a computed program name, too deep), or ''."""
    if tool != "Bash":
        return ""
    return _unknowable(call_of(tool, tool_input))


def _unknowable(call: Call) -> str:
    if call.tool != "Bash":
        return ""
    if call.too_deep:
        return TOO_DEEP_REASON
    for command in call.commands:
        if command.dynamic:
            return DYNAMIC_REASON.format(program=command.raw_program[:60])
    return ""


def undecidable(rules: Iterable[Rule], call: Call) -> str:
    """Why the gateway cannot tell from the text whether a Bash command reaches a governed
    system — it is not a plain sequence of simple commands, an interpreter's code names a
    governed tool or SDK, or a governed program's arguments are computed — or ''."""
    if call.tool != "Bash":
        return ""
    reasons = list(call.unknown)
    rules = [rule for rule in rules if rule.programs or rule.mentions]
    mentions = {word for rule in rules for word in rule.mentions}
    for command in call.commands:
        named = sorted(mentions.intersection(_WORD.findall(command.script.lower())))
        if named:
            reasons.append(f"{command.program} runs code that names {', '.join(named[:3])}")
        if command.dynamic_args and any(rule.runs(command) for rule in rules):
            reasons.append(f"{command.program}'s arguments are computed when it runs")
    if not reasons:
        return ""
    shown = "; ".join(dict.fromkeys(reasons[:4]))
    return ASK_REASON.format(reasons=shown)


def verdict(
    rules: Iterable[Rule], tool: str, tool_input: Mapping[str, Any]
) -> tuple[str, str] | None:
    """The hook's answer for a tool call that is not one of the gateway's own tools:
    ("deny", why) for a governed call or one whose program is computed, ("ask", why) for a
    command whose effect cannot be read from its text, None for the rest (Claude Code's own
    permission rules then apply)."""
    rules = list(rules)
    call = call_of(tool, tool_input)
    for rule in rules:
        if rule.matches(call):
            return "deny", deny_reason(rule)
    why = _unknowable(call)
    if why:
        return "deny", why
    why = undecidable(rules, call)
    if why:
        return "ask", why
    return None


def deny_reason(rule: Rule) -> str:
    reason = f"Blocked by the Effect Gateway ({rule.name}): {rule.reason}"
    if rule.gateway_tool:
        reason += (
            f" Use the gateway tool {rule.gateway_tool} instead: it is validated, approved "
            "where policy says so, executed exactly once and audited."
        )
    return reason


def gateway_contract(tool: str) -> tuple[bool, EffectContract | None]:
    """(is it one of the gateway's MCP tools, the contract it submits — None for read tools)."""
    prefix = f"mcp__{MCP_SERVER}__"
    if not tool.startswith(prefix):
        return False, None
    suffix = tool.removeprefix(prefix)
    for contract in CONTRACTS.values():
        if tool_name(contract.type) == suffix:
            return True, contract
    return True, None


def needs_approval(contract: EffectContract, tool_input: Mapping[str, Any]) -> bool:
    """Whether the gateway will hold this call for an approver. A payload the contract's schema
    refuses is not: the gateway answers it with the field errors, and the agent fixes it."""
    payload = without_nulls(tool_input.get("payload"))
    if not isinstance(payload, dict) or next(contract.payload_validator.iter_errors(payload), None):
        return False
    return contract.requires_approval(payload)
