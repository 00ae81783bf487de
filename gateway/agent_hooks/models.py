"""Per-tenant patterns of raw tool calls that must go through the gateway instead."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from gateway.agent_hooks import patterns
from gateway.models import Tenant

MAX_REGEX_LENGTH = 500


def validate_regex(value: str) -> None:
    if len(value) > MAX_REGEX_LENGTH:
        raise ValidationError(f"at most {MAX_REGEX_LENGTH} characters")
    try:
        patterns.compiled(value)
    except patterns.PatternError as exc:
        raise ValidationError(
            f"not a pattern the gateway runs (RE2 syntax: no back-references or look-around): {exc}"
        ) from None


class GovernedPattern(models.Model):
    """A raw call (a Bash command, a fetched URL) that bypasses the gateway for a governed
    system; the hook denies it and names the gateway tool to use. A row named like a built-in
    default (``kubectl``, ``stripe-api``, …) replaces that default for the tenant, and
    ``enabled=False`` switches it off."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="governed_patterns")
    name = models.SlugField(max_length=64)
    # Which of the agent's tools it applies to: a regex on Claude Code's tool name.
    tools = models.CharField(max_length=200, default="Bash|WebFetch", validators=[validate_regex])
    # Searched in the Bash command, the WebFetch URL, or the JSON input of any other tool.
    regex = models.CharField(max_length=MAX_REGEX_LENGTH, validators=[validate_regex])
    # The gateway tool the agent should use instead (an MCP tool name), if there is one.
    gateway_tool = models.CharField(max_length=200, blank=True)
    reason = models.TextField()
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="governed_pattern_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.name}"


class ToolCallOutcome(models.Model):
    """What one Claude Code tool call came to (PostToolUse): for a gateway tool, the effect
    it names and that effect's status in the ledger when the hook ran."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    principal = models.ForeignKey("gateway.Principal", on_delete=models.CASCADE, related_name="+")
    session_id = models.CharField(max_length=200, blank=True)
    tool_use_id = models.CharField(max_length=200, blank=True)
    tool_name = models.CharField(max_length=200)
    effect_id = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=32, blank=True)
    failed = models.BooleanField(default=False)
    detail = models.TextField(blank=True)
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # A redelivered hook call records nothing new.
            models.UniqueConstraint(
                fields=["tenant", "tool_use_id"],
                condition=~models.Q(tool_use_id=""),
                name="tool_call_outcome_once",
            )
        ]
        indexes = [
            # An effect's page and GET /api/v1/effects/{id}/tool-uses.
            models.Index(
                fields=["tenant", "effect_id"],
                name="tool_call_outcome_effect",
                condition=~models.Q(effect_id=""),
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name}:{self.tool_use_id}"
