"""Input serializers validate shape only; output serializers say exactly what leaves (never
the secret, except once, on creation)."""

from __future__ import annotations

from rest_framework import serializers

from gateway.webhooks.choices import EventType
from gateway.webhooks.models import WebhookEndpoint, WebhookMessage


class EndpointCreateSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=2000)
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=EventType.choices),
        required=False,
        allow_empty=False,
        help_text="Default: every event type.",
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    principals = serializers.ListField(
        child=serializers.CharField(max_length=200),
        required=False,
        help_text="Only effects these principals requested (names). Default: all. "
        "Not for an agent: its endpoint hears of its own effects only.",
    )
    run_ids = serializers.ListField(
        child=serializers.CharField(max_length=200),
        required=False,
        help_text="Only effects whose context.run_id is one of these. Default: all.",
    )


class EndpointReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class EndpointSerializer(serializers.ModelSerializer):
    owner: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="name",
        read_only=True,
        allow_null=True,
        help_text="The agent whose own endpoint this is (it hears of that agent's effects "
        "only); null for a tenant-wide endpoint.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "description",
            "event_types",
            "principals",
            "run_ids",
            "owner",
            "enabled",
            "disabled_reason",
            "created_by",
            "created_at",
            "updated_at",
        ]


class EndpointCreatedSerializer(EndpointSerializer):
    """The endpoint with its signing secret: answered once, when it is created."""

    secret = serializers.CharField(help_text="whsec_…: verify webhook-signature with it.")

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "secret"]


class MessageSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookMessage
        fields = [
            "id",
            "event_type",
            "effect_id",
            "state",
            "attempts",
            "last_status",
            "last_error",
            "next_attempt_at",
            "last_attempt_at",
            "delivered_at",
            "created_at",
            "payload",
        ]
