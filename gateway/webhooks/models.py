"""Outgoing webhooks: where a tenant wants to hear about its effects, and the outbox of what
was (or is still to be) told."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from gateway.lib.ids import new_id
from gateway.models import Effect, Principal, Tenant
from gateway.webhooks.choices import EventType, MessageState


def new_endpoint_id() -> str:
    return new_id("whe")


def new_message_id() -> str:
    return new_id("msg")


class WebhookEndpoint(models.Model):
    """A tenant's receiver URL, its signing secret (sealed at rest) and its event types."""

    id = models.CharField(max_length=32, primary_key=True, default=new_endpoint_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True)
    # ``whsec_<base64>`` (Standard Webhooks), encrypted with the vault key; shown once.
    secret_sealed = models.TextField()
    event_types = models.JSONField(default=list)
    # Filters (empty: everything): the requesting principals' names, the context.run_id values.
    principals = models.JSONField(default=list, blank=True)
    run_ids = models.JSONField(default=list, blank=True)
    # An agent's own endpoint: it hears of the effects that agent requested or waits on, and
    # only that agent (or an operator) manages it. None: a tenant-wide endpoint (operators).
    owner = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    enabled = models.BooleanField(default=True)
    disabled_reason = models.TextField(blank=True)
    # Set when it is deleted: it is then no longer listed nor sent to; its messages stay.
    deleted_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "enabled"], name="webhook_endpoint_tenant")]

    def __str__(self) -> str:
        return f"{self.id} {self.url}"

    def subscribes_to(self, event_type: str) -> bool:
        return event_type in self.event_types

    def wants(
        self,
        *,
        principal: str,
        run_id: str | None,
        requester_id: int | None = None,
        waiter_ids: frozenset[int] = frozenset(),
    ) -> bool:
        """Whether the effects of ``principal`` with this ``context.run_id`` pass the filters;
        an agent's own endpoint also needs the effect to be that agent's request
        (``requester_id``) or to have it among its waiters (``waiter_ids``)."""
        if self.owner_id is not None and (
            self.owner_id != requester_id and self.owner_id not in waiter_ids
        ):
            return False
        if self.principals and principal not in self.principals:
            return False
        return not self.run_ids or run_id in self.run_ids


class WebhookMessage(models.Model):
    """One event for one endpoint: written with the status change, delivered after commit,
    retried by the sweeper until the receiver answers 2xx. The id is the ``webhook-id`` of
    every attempt, so a receiver deduplicates on it."""

    id = models.CharField(max_length=32, primary_key=True, default=new_message_id, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT, related_name="messages")
    event_type = models.CharField(max_length=40, choices=EventType.choices)
    effect_id = models.CharField(max_length=32)
    # Effect id, type, status, from/to, correlation: never the command's payload.
    payload = models.JSONField()
    state = models.CharField(
        max_length=16, choices=MessageState.choices, default=MessageState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    # When the sweeper (re)sends it; pushed forward by each claim, so a crashed sender's
    # message comes back after the lease. None once it is no longer pending.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=MessageState.values), name="webhook_message_state_valid"
            ),
        ]
        indexes = [
            # webhook_sweep: pending messages whose next attempt is due, oldest first.
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_message_due",
                condition=Q(state=MessageState.PENDING),
            ),
            models.Index(fields=["endpoint", "-created_at"], name="webhook_message_endpoint"),
            models.Index(fields=["effect_id"], name="webhook_message_effect"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.event_type} {self.state}"


class EffectWaiter(models.Model):
    """A LangGraph thread (``context.thread_id``) that submitted an effect's command after its
    first submitter did, and got the same effect back: it waits on that effect too, and every
    announcement of the effect names it (``data.thread_ids``). The first submitter's thread is
    the command's own ``context.thread_id`` and has no row."""

    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="+")
    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="+")
    thread_id = models.CharField(max_length=200)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["effect", "principal", "thread_id"], name="effect_waiter_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.effect_id} {self.thread_id}"
