"""Input serializers validate shape only; output serializers say exactly what leaves."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gateway.api.serializers import ReasonSerializer
from gateway.models import Receipt
from sagas import selectors
from sagas.choices import SagaState
from sagas.models import SagaEvent, SagaRun, SagaStep, SagaTask

# Receipt result fields that identify what the provider made; shown in the step summary.
# Everything else (which may be personal) stays behind the effect's own page.
_RESULT_SUMMARY_SUFFIXES = ("_id", "_number")


class SagaStartSerializer(serializers.Serializer):
    definition = serializers.CharField(max_length=100, help_text='e.g. "order.fulfillment"')
    inputs = serializers.JSONField(help_text="Validated against the definition's inputs_schema.")


class CancelSerializer(ReasonSerializer):
    compensate = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Also compensate the confirmed steps (the business goal is abandoned).",
    )


class TaskDoneSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=4000, required=False, allow_blank=True)


def receipt_summary(receipt: Receipt | None) -> dict[str, Any] | None:
    if receipt is None:
        return None
    return {
        "provider": receipt.provider,
        "provider_operation_id": receipt.provider_operation_id,
        "provider_status": receipt.provider_status,
        "digest_matches": receipt.digest_matches,
        "state": receipt.result.get("state"),
        "references": {
            name: value
            for name, value in receipt.result.items()
            if name.endswith(_RESULT_SUMMARY_SUFFIXES) and isinstance(value, str | int)
        },
        "received_at": serializers.DateTimeField().to_representation(receipt.received_at),
    }


def _revision(record: SagaStep) -> dict[str, Any]:
    effect = record.effect
    return {
        "revision": record.revision,
        "idempotency_key": record.idempotency_key,
        "effect_id": effect.pk if effect else None,
        "effect_status": effect.status if effect else None,
        "failure": (
            {"trigger": record.failure_trigger, "reason": record.failure_reason}
            if record.failure_trigger
            else None
        ),
        "issued_at": serializers.DateTimeField().to_representation(record.created_at),
    }


def step_data(view: selectors.StepView) -> dict[str, Any]:
    record, effect, spec = view.record, view.effect, view.spec
    compensation_effect = view.compensation_effect
    return {
        "index": view.index,
        "name": view.step.name,
        "description": view.step.description,
        "effect_type": view.step.effect_type,
        "owner": spec.owner,
        "revision": record.revision if record else None,
        "idempotency_key": record.idempotency_key if record else None,
        "effect_id": effect.pk if effect else None,
        "effect_status": effect.status if effect else None,
        "frozen": effect.frozen if effect else False,
        "mismatch": effect.mismatch if effect else False,
        "escalated": effect.escalated if effect else False,
        "failure": (
            {"trigger": record.failure_trigger, "reason": record.failure_reason}
            if record and record.failure_trigger
            else None
        ),
        "receipt": receipt_summary(view.receipt),
        "compensation": {
            "compensator": spec.compensator,
            "window_ends_at": (
                serializers.DateTimeField().to_representation(view.window_ends_at)
                if view.window_ends_at
                else None
            ),
            "irreversible": spec.irreversible,
            "irreversible_boundary": spec.irreversible_boundary,
            "automatic": spec.automatic,
            "owner": spec.owner,
            "decision": (record.compensation or None) if record else None,
            "note": (record.compensation_note or None) if record else None,
            "effect_id": compensation_effect.pk if compensation_effect else None,
            "effect_status": compensation_effect.status if compensation_effect else None,
        },
        "earlier_revisions": [_revision(r) for r in view.earlier],
    }


class SagaTaskSerializer(serializers.ModelSerializer):
    task_id = serializers.CharField(source="pk")
    saga_id = serializers.CharField(source="run_id")
    step = serializers.CharField(source="step.name")
    effect_id = serializers.CharField(allow_null=True)
    done_by = serializers.CharField(source="done_by.name", allow_null=True, default=None)

    class Meta:
        model = SagaTask
        fields = [
            "task_id",
            "saga_id",
            "step",
            "effect_id",
            "kind",
            "owner",
            "reason",
            "state",
            "created_at",
            "done_by",
            "done_at",
            "note",
        ]


class SagaSummarySerializer(serializers.ModelSerializer):
    """A run in a list: no steps."""

    saga_id = serializers.CharField(source="pk")
    tenant = serializers.CharField(source="tenant.slug")
    state = serializers.ChoiceField(choices=SagaState.choices)
    requested_by = serializers.CharField(source="requested_by.name")
    failure = serializers.SerializerMethodField()

    class Meta:
        model = SagaRun
        fields = [
            "saga_id",
            "definition",
            "tenant",
            "state",
            "frozen",
            "frozen_reason",
            "current_step",
            "failure",
            "requested_by",
            "idempotency_key",
            "created_at",
            "updated_at",
            "state_changed_at",
        ]

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_failure(self, run: SagaRun):
        if not run.failure_trigger:
            return None
        return {
            "step": run.failure_step,
            "trigger": run.failure_trigger,
            "reason": run.failure_reason,
        }


class SagaSerializer(SagaSummarySerializer):
    """A run with every step: its effect, the effect's status, a receipt summary, and how it
    is (or would be) compensated."""

    inputs = serializers.SerializerMethodField()
    inputs_redacted = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()
    tasks = serializers.SerializerMethodField()

    class Meta(SagaSummarySerializer.Meta):
        fields = [
            *SagaSummarySerializer.Meta.fields,
            "inputs_digest",
            "inputs",
            "inputs_redacted",
            "steps",
            "tasks",
        ]

    def _may_see(self, run: SagaRun) -> bool:
        viewer = self.context.get("principal")
        return viewer is not None and selectors.may_see_inputs(viewer, run)

    @extend_schema_field(serializers.JSONField)
    def get_inputs(self, run: SagaRun):
        return selectors.saga_inputs(run) if self._may_see(run) else run.inputs_redacted

    @extend_schema_field(serializers.BooleanField)
    def get_inputs_redacted(self, run: SagaRun) -> bool:
        return not self._may_see(run)

    @extend_schema_field(serializers.JSONField)
    def get_steps(self, run: SagaRun):
        return [step_data(view) for view in selectors.saga_step_views(run)]

    @extend_schema_field(SagaTaskSerializer(many=True))
    def get_tasks(self, run: SagaRun):
        tasks = run.tasks.select_related("step", "done_by").order_by("created_at", "id")
        return SagaTaskSerializer(tasks, many=True).data


class CancelResultSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(
        choices=["cancelled", "cancelled_with_effects", "cancelled_pending_reconciliation"]
    )
    compensating = serializers.BooleanField()
    inventory = serializers.JSONField(
        help_text='{"confirmed": [...], "in_flight": [...], "unknown": [...], "cancelled": [...]}'
    )
    saga = SagaSerializer()


class SagaEventSerializer(serializers.ModelSerializer):
    saga_id = serializers.CharField(source="run_id")
    principal = serializers.CharField(source="principal.name", allow_null=True, default=None)

    class Meta:
        model = SagaEvent
        fields = [
            "id",
            "saga_id",
            "kind",
            "from_state",
            "to_state",
            "step",
            "actor",
            "principal",
            "reason",
            "data",
            "created_at",
        ]
