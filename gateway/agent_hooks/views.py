"""``POST /hooks/claude-code/pre-tool-use`` and ``/hooks/claude-code/permission-request``.

Claude Code's ``http`` hook posts the hook input JSON and reads the decision from a 2xx JSON
answer; a non-2xx answer or a timeout is a *non-blocking error*, i.e. the tool call goes on.
So these views answer **200 with valid hook JSON, always**, and decide what a failure means:

* unreadable body (not JSON, no ``tool_name``): nothing can be matched, so PreToolUse answers
  ``ask`` — a human decides — and PermissionRequest gives no decision (the dialog is shown);
* missing/invalid token: ``ask`` — a human decides — answered *before* the body is read or
  any matching is done, so an anonymous caller cannot make the gateway do work (the hook was
  a CPU sink for anonymous 20 KB bodies);
* an internal error: the tenant's patterns cannot be read, so the built-in patterns still
  deny governed calls (fail closed), and anything else is ``ask``;
* a command longer than ``policy.MAX_SUBJECT`` is not matched: ``ask``.

Headless runs (``claude -p``, the Agent SDK, CI) turn ``ask`` into "permission denied", so a
command needing the gateway's approver would never reach the gateway. With ``?mode=headless``
in the hook URL the gateway's own approval is the gate: the tool call is *allowed*, the command
is submitted and waits in AWAITING_APPROVAL, and the reason tells the model to wait for it.

``POST /hooks/claude-code/post-tool-use`` records what each gateway tool call returned (the
effect id and status) or that a call failed, per session and tool-use id.

The token travels in ``Authorization: Bearer …`` (the http hook's ``headers`` with
``allowedEnvVars``). ``?token=`` is refused on purpose: URLs end up in access logs, proxies and
shell history.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.urls import NoReverseMatch, reverse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions

from gateway.agent_hooks import policy
from gateway.agent_hooks.models import GovernedPattern
from gateway.agent_hooks.outcomes import record_outcome
from gateway.api.auth import BearerTokenAuthentication
from gateway.lib import jsonin
from gateway.models import Command, Principal

logger = logging.getLogger(__name__)

# The hook input is a command plus a few ids; 64 KB leaves room for tool inputs that carry a
# payload, and the command itself is matched only up to policy.MAX_SUBJECT.
MAX_BODY = 64 * 1024
PRE_TOOL_USE = "PreToolUse"
PERMISSION_REQUEST = "PermissionRequest"
POST_TOOL_USE = "PostToolUse"


class Unreadable(Exception):
    """The hook input is not a JSON object with a tool name."""


def _pre_tool_use(decision: str | None, reason: str = "", updated_input: Any = None) -> dict:
    if decision is None:
        return {}
    output: dict[str, Any] = {
        "hookEventName": PRE_TOOL_USE,
        "permissionDecision": decision,
        "permissionDecisionReason": reason,
    }
    if updated_input is not None:
        output["updatedInput"] = updated_input
    return {"hookSpecificOutput": output}


def _permission_request(behavior: str | None, message: str = "") -> dict:
    if behavior is None:
        return {}
    decision: dict[str, Any] = {"behavior": behavior}
    if behavior == "deny":
        decision["message"] = message
    return {"hookSpecificOutput": {"hookEventName": PERMISSION_REQUEST, "decision": decision}}


def _read(request: HttpRequest) -> dict[str, Any]:
    raw = request.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise Unreadable(f"the hook input is larger than {MAX_BODY} bytes")
    try:
        body = jsonin.loads(raw)
    except jsonin.JsonInputError as exc:
        raise Unreadable(f"the hook input is not JSON ({exc})") from None
    if not isinstance(body, dict) or not isinstance(body.get("tool_name"), str):
        raise Unreadable("the hook input has no tool_name")
    if not isinstance(body.get("tool_input", {}), dict):
        raise Unreadable("tool_input is not an object")
    return body


def _principal(request: HttpRequest) -> Principal:
    if "token" in request.GET:
        raise exceptions.AuthenticationFailed(
            "send the token in the Authorization header, not in the URL (URLs are logged)"
        )
    result = BearerTokenAuthentication().authenticate(request)
    if result is None:
        raise exceptions.NotAuthenticated("Authorization: Bearer TOKEN is missing")
    principal = result[0].principal
    if principal.frozen:
        raise exceptions.AuthenticationFailed(f"principal {principal.name} is frozen")
    return principal


def _tenant_rules(principal: Principal) -> list[policy.Rule]:
    rows = GovernedPattern.objects.filter(tenant_id=principal.tenant_id)
    return policy.effective_rules(
        policy.Rule(r.name, r.tools, r.regex, r.gateway_tool, r.reason, r.enabled) for r in rows
    )


def _console_link(request: HttpRequest, principal: Principal, key: Any) -> str:
    """The effect's console page when this key was already submitted, else the approvals."""
    base = getattr(settings, "GATEWAY_CONSOLE_URL", "") or request.build_absolute_uri("/")
    effect_id = None
    if isinstance(key, str) and key:
        effect_id = (
            Command.objects.filter(tenant_id=principal.tenant_id, idempotency_key=key)
            .values_list("effect_id", flat=True)
            .first()
        )
    try:
        path = (
            reverse("console:effect", args=[effect_id])
            if effect_id
            else reverse("console:approvals")
        )
    except NoReverseMatch:
        path = f"/effects/{effect_id}" if effect_id else "/approvals"
    return base.rstrip("/") + path


def _with_context(body: dict[str, Any]) -> dict[str, Any]:
    """The gateway tool's input with Claude Code's correlation ids added to ``context``."""
    tool_input = dict(body.get("tool_input") or {})
    context = dict(tool_input.get("context") or {})
    context.setdefault("runtime", "claude-code")
    for key, source in (("session_id", "session_id"), ("call_id", "tool_use_id")):
        if isinstance(body.get(source), str) and body[source]:
            context.setdefault(key, body[source])
    tool_input["context"] = context
    return tool_input


def _headless(request: HttpRequest) -> bool:
    mode = request.GET.get("mode") or request.headers.get("X-Effect-Gateway-Mode", "")
    return mode.lower() == "headless"


def _decide(
    request: HttpRequest, principal: Principal, body: dict[str, Any]
) -> tuple[str | None, str, Any]:
    """(decision: deny | ask | allow | None, reason, updated input) for one tool call."""
    tool = body["tool_name"]
    tool_input = body.get("tool_input") or {}
    if policy.subject_size(tool, tool_input) > policy.MAX_SUBJECT:
        return (
            "ask",
            f"The command is longer than {policy.MAX_SUBJECT} characters: a human reads it.",
            None,
        )
    answer = policy.verdict(_tenant_rules(principal), tool, tool_input)
    if answer is not None:
        return answer[0], answer[1], None
    is_gateway_tool, contract = policy.gateway_contract(tool)
    if not is_gateway_tool:
        return None, "", None
    if contract is not None and policy.needs_approval(contract, tool_input):
        link = _console_link(request, principal, tool_input.get("idempotency_key"))
        if _headless(request):
            reason = (
                f"{contract.type} needs a human approver for this payload "
                f"({contract.approval.description}). Submitting it: the gateway holds it in "
                f"AWAITING_APPROVAL until an approver signs off ({link}); then call "
                "wait_for_effect with the effect id and report the outcome. Do not resubmit."
            )
            return "allow", reason, _with_context(body)
        reason = (
            f"{contract.type} needs a human approver for this payload "
            f"({contract.approval.description}). Nothing has been submitted yet: if this call "
            "is allowed, the gateway records the command and holds it until an approver signs "
            f"off in the console ({link}); if it is refused, nothing was sent. A headless run "
            "(claude -p) refuses it: point the hook at ?mode=headless there."
        )
        return "ask", reason, _with_context(body)
    updated = _with_context(body) if contract is not None else None
    return "allow", "The Effect Gateway validates, deduplicates and audits this call.", updated


UNAUTHENTICATED = (
    "The Effect Gateway could not decide (hook authentication failed: {why}); a human decides."
)


def _fallback(body: dict[str, Any] | None, why: str) -> tuple[str, str]:
    """When the tenant cannot be known: the built-in patterns still deny, else a human asks."""
    if body is not None:
        rule = policy.governed(
            policy.effective_rules([]), body["tool_name"], body.get("tool_input") or {}
        )
        if rule is not None:
            return "deny", policy.deny_reason(rule)
    return "ask", f"The Effect Gateway could not decide ({why}); a human decides."


@csrf_exempt
def pre_tool_use(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        principal = _principal(request)
    except exceptions.APIException as exc:
        # No body is read and nothing is matched for an unknown caller (module doc).
        return JsonResponse(_pre_tool_use("ask", UNAUTHENTICATED.format(why=exc.detail)))
    body = None
    try:
        body = _read(request)
        decision, reason, updated = _decide(request, principal, body)
        return JsonResponse(_pre_tool_use(decision, reason, updated))
    except Unreadable as exc:
        return JsonResponse(
            _pre_tool_use(
                "ask", f"The Effect Gateway could not read this hook call ({exc}); a human decides."
            )
        )
    except Exception:
        logger.exception("claude-code pre-tool-use hook failed")
        decision, reason = _fallback(body, "internal error")
        return JsonResponse(_pre_tool_use(decision, reason))


@csrf_exempt
def permission_request(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        principal = _principal(request)
    except exceptions.APIException:
        return JsonResponse(_permission_request(None))  # the dialog is shown: a human decides
    body = None
    try:
        body = _read(request)
        decision, reason, _updated = _decide(request, principal, body)
    except Unreadable:
        return JsonResponse(_permission_request(None))  # the dialog is shown: a human decides
    except Exception:
        logger.exception("claude-code permission-request hook failed")
        decision, reason = _fallback(body, "internal error")
    # "ask" is the dialog itself: no decision lets the human see it.
    behavior = decision if decision in ("allow", "deny") else None
    return JsonResponse(_permission_request(behavior, reason))


@csrf_exempt
def post_tool_use(request: HttpRequest) -> HttpResponse:
    """Record what a tool call returned; for a gateway command still waiting, tell the model
    to wait for it instead of resubmitting."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        principal = _principal(request)
        body = _read(request)
    except (exceptions.APIException, Unreadable):
        return JsonResponse({})  # nothing to record for an unknown caller or an unreadable body
    outcome = record_outcome(principal=principal, body=body)
    if outcome is not None and outcome.status == "AWAITING_APPROVAL":
        return JsonResponse(
            {
                "hookSpecificOutput": {
                    "hookEventName": POST_TOOL_USE,
                    "additionalContext": (
                        f"Effect {outcome.effect_id} waits for a human approver. Call "
                        "wait_for_effect with this effect id; do not submit it again."
                    ),
                }
            }
        )
    return JsonResponse({})
