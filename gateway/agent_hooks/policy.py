"""What the gateway says about one tool call of a Claude Code agent.

Three kinds of call:

* a raw call to a governed system (``kubectl apply``, ``curl https://api.stripe.com/…``,
  ``sendmail``): **deny**, naming the gateway tool to use instead;
* a call of one of the gateway's own MCP tools (``mcp__effect-gateway__…``): **ask** when the
  contract needs a human approver for that payload (with the console link), else **allow** —
  the gateway itself validates, deduplicates and audits it;
* anything else: **no decision**, so Claude Code's own permission rules apply. Answering
  "allow" there would switch off the user's prompts for every shell command.

Pure functions over plain data; the view does the I/O (auth, tenant patterns, links).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from effect_gateway_client.models import tool_name

from gateway.contracts import CONTRACTS, EffectContract

MCP_SERVER = "effect-gateway"
MAX_SUBJECT = 100_000


@dataclass(frozen=True)
class Rule:
    """A governed pattern: built in, or a tenant's ``GovernedPattern`` row."""

    name: str
    tools: str
    regex: str
    gateway_tool: str
    reason: str
    enabled: bool = True

    def matches(self, tool: str, subject: str) -> bool:
        try:
            return bool(
                re.fullmatch(self.tools, tool) and re.search(self.regex, subject, re.IGNORECASE)
            )
        except re.error:
            return False  # validated on save; a bad row must not take the hook down


def _mcp(effect_type: str) -> str:
    return f"mcp__{MCP_SERVER}__{tool_name(effect_type)}"


_PAYMENT_HOSTS = (
    r"api\.stripe\.com|api(-m)?\.paypal\.com|[a-z0-9-]+\.adyen\.com|api\.braintreegateway\.com"
)
# A command word: at the start, or after a separator, a quote, a pipe, `sudo`/`env`/`xargs`.
_CMD = r"(?:^|[;&|(`'\"\s])"

DEFAULT_RULES: tuple[Rule, ...] = (
    Rule(
        "kubectl",
        "Bash",
        rf"{_CMD}kubectl\b[^;&|\n]*\b(apply|delete|replace|patch|scale|set\s+image|"
        rf"rollout\s+(undo|restart|resume))\b",
        _mcp("deployment.release.promote"),
        "Changing a cluster with kubectl bypasses the release process.",
    ),
    Rule(
        "helm",
        "Bash",
        rf"{_CMD}helm\s+(upgrade|install|rollback|uninstall)\b",
        _mcp("deployment.release.promote"),
        "Helm releases go through the gateway's deployment contracts.",
    ),
    Rule(
        "psql-production",
        "Bash",
        rf"{_CMD}(psql|pg_dump|pg_restore)\b[^;&|\n]*\bprod(uction)?\b",
        "",
        "Agents do not connect to production databases; ask an operator.",
    ),
    Rule(
        "payment-api",
        "Bash",
        rf"{_CMD}(curl|wget|http|https|xh|httpie)\b[^;&|\n]*({_PAYMENT_HOSTS})",
        _mcp("billing.refund.create"),
        "Payment provider APIs are called only by the gateway (exactly once, with approval).",
    ),
    Rule(
        "payment-api-fetch",
        "WebFetch",
        rf"^https?://({_PAYMENT_HOSTS})(/|$|:)",
        _mcp("billing.refund.create"),
        "Payment provider APIs are called only by the gateway (exactly once, with approval).",
    ),
    Rule(
        "mail",
        "Bash",
        rf"{_CMD}(sendmail|mailx|mutt|msmtp|ssmtp|swaks)\b|{_CMD}mail\s+-s\b|smtps?://",
        _mcp("email.message.send"),
        "Email to customers is sent by the gateway (irreversible, audited).",
    ),
    Rule(
        "gh-release",
        "Bash",
        rf"{_CMD}gh\s+release\s+(create|edit|delete|upload)\b",
        _mcp("deployment.release.promote"),
        "Releases are promoted through the gateway.",
    ),
)


def effective_rules(tenant_rules: Iterable[Rule]) -> list[Rule]:
    """The defaults, each replaced by a tenant row of the same name, plus the tenant's own."""
    by_name = {rule.name: rule for rule in DEFAULT_RULES}
    for rule in tenant_rules:
        by_name[rule.name] = rule
    return [rule for rule in by_name.values() if rule.enabled]


def subject_of(tool: str, tool_input: Mapping[str, Any]) -> str:
    """The text a rule is searched in: the command, the URL, or the whole input."""
    if tool == "Bash":
        value = tool_input.get("command", "")
    elif tool == "WebFetch":
        value = tool_input.get("url", "")
    else:
        value = json.dumps(tool_input, sort_keys=True, default=str)
    return str(value)[:MAX_SUBJECT]


def governed(rules: Iterable[Rule], tool: str, tool_input: Mapping[str, Any]) -> Rule | None:
    subject = subject_of(tool, tool_input)
    for rule in rules:
        if rule.matches(tool, subject):
            return rule
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
    payload = tool_input.get("payload")
    if not isinstance(payload, dict):
        return False  # the gateway will refuse it with the field errors
    return contract.requires_approval(payload)
