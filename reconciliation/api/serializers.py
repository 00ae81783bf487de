"""Input serializers validate shape only; output serializers say exactly what leaves."""

from __future__ import annotations

from rest_framework import serializers

from reconciliation.choices import MANUAL_OUTCOMES
from reconciliation.models import Case, ReconciliationRecord


class ResolveSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=sorted(MANUAL_OUTCOMES))
    evidence = serializers.CharField(
        max_length=4000,
        help_text="What you checked and what it showed (provider console, ticket, call).",
    )
    operation_id = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="The provider's operation id, as its console shows it (confirmed only).",
    )
    result = serializers.DictField(
        child=serializers.CharField(max_length=200, allow_blank=True),
        required=False,
        help_text=(
            "The contract's receipt_fields as the provider shows them (e.g. charge_id): "
            "stored with the operation id as the effect's receipt, recorded by a person."
        ),
    )


class AcknowledgeSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class CaseSerializer(serializers.ModelSerializer):
    effect_id = serializers.CharField()
    effect_status = serializers.CharField(source="effect.status")
    effect_type = serializers.CharField(source="effect.type")
    acknowledged_by = serializers.CharField(
        source="acknowledged_by.name", allow_null=True, default=None
    )
    resolved_by = serializers.SerializerMethodField()

    class Meta:
        model = Case
        fields = [
            "id",
            "effect_id",
            "effect_type",
            "effect_status",
            "owner",
            "reason",
            "reason_text",
            "state",
            "evidence",
            "opened_by",
            "opened_at",
            "acknowledged_by",
            "acknowledged_at",
            "resolved_by",
            "resolved_at",
            "resolution",
        ]

    def get_resolved_by(self, case: Case) -> str | None:
        if case.resolved_by is not None:
            return case.resolved_by.name
        return case.resolved_actor or None


class ReconciliationRecordSerializer(serializers.ModelSerializer):
    effect_id = serializers.CharField()
    principal = serializers.CharField(source="principal.name", allow_null=True, default=None)

    class Meta:
        model = ReconciliationRecord
        fields = [
            "id",
            "effect_id",
            "kind",
            "lookup_by",
            "lookup_status",
            "http_status",
            "provider_operation_id",
            "provider_status",
            "provider_digest",
            "effect_status",
            "outcome",
            "check_number",
            "actor",
            "principal",
            "evidence",
            "created_at",
        ]
