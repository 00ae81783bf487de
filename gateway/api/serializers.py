"""Input serializers validate shape only; output serializers say exactly what leaves."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gateway import selectors
from gateway.agent_hooks.models import ToolCallOutcome
from gateway.choices import EffectStatus
from gateway.contracts import get_contract
from gateway.integrity import ShownPayload, payload_to_show
from gateway.models import Attempt, Capability, Effect, EffectEvent, Receipt
from gateway.tokens import MAX_EXPIRES_IN

# NOTE: a few fields are named like attributes of DRF's Field (``context``, ``required``,
# ``source``); DRF's stubs type those attributes, so mypy sees a clash that DRF itself resolves
# (declared fields are collected by the serializer's metaclass).


class CommandSubmitSerializer(serializers.Serializer):
    type = serializers.CharField(max_length=100)
    resource = serializers.JSONField(help_text='{"type": "order", "id": "ord_881", "version": 17}')
    payload = serializers.JSONField(help_text="Validated against the type's payload_schema.")
    intent = serializers.JSONField(
        required=False, help_text='{"summary": "…", "task_id": "…", "plan_revision": 1}'
    )
    context = serializers.JSONField(  # type: ignore[assignment]  # see NOTE
        required=False,
        help_text="Correlation: runtime, session_id, run_id, call_id, thread_id, agent.",
    )
    expires_in = serializers.JSONField(
        required=False, help_text="Seconds until the command may no longer be sent (1–604800)."
    )


class SignatureSerializer(serializers.Serializer):
    """A key's signature over an approval challenge (each value base64url)."""

    nonce = serializers.CharField(max_length=64)
    key_id = serializers.CharField(
        max_length=1400, help_text="The passkey's credential id, or the machine key's fingerprint."
    )
    signature = serializers.CharField(max_length=2000)
    authenticator_data = serializers.CharField(max_length=4000, required=False, allow_blank=True)
    client_data_json = serializers.CharField(max_length=8000, required=False, allow_blank=True)
    user_handle = serializers.CharField(max_length=200, required=False, allow_blank=True)


class ApproveSerializer(serializers.Serializer):
    payload_digest = serializers.CharField(max_length=80)
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    signature = SignatureSerializer(required=False)


class ApprovalChallengeRequestSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "reject"], required=False)


class ApprovalChallengeSerializer(serializers.Serializer):
    nonce = serializers.CharField()
    challenge = serializers.CharField(help_text="The 32 bytes to sign, base64url.")
    tenant = serializers.CharField()
    effect_id = serializers.CharField()
    payload_digest = serializers.CharField()
    decision = serializers.CharField()
    expires_at = serializers.DateTimeField()
    credential_ids = serializers.ListField(child=serializers.CharField())
    rp_id = serializers.CharField(allow_null=True)


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class ApprovalSerializer(serializers.Serializer):
    required = serializers.BooleanField()  # type: ignore[assignment]  # see NOTE
    state = serializers.CharField()
    approved_by = serializers.CharField(allow_null=True)
    approved_digest = serializers.CharField(allow_null=True)
    approved_at = serializers.DateTimeField(allow_null=True)


class ReceiptSerializer(serializers.Serializer):
    provider = serializers.CharField()
    provider_operation_id = serializers.CharField()
    provider_status = serializers.CharField()
    payload_digest = serializers.CharField()
    digest_matches = serializers.BooleanField()
    result_digest = serializers.CharField()
    source = serializers.CharField()  # type: ignore[assignment]  # see NOTE
    received_at = serializers.DateTimeField()


class CompensationSerializer(serializers.Serializer):
    compensator_type = serializers.CharField(allow_null=True)
    window_ends_at = serializers.DateTimeField(allow_null=True)
    irreversible = serializers.BooleanField()
    irreversible_boundary = serializers.CharField(allow_null=True)
    automatic = serializers.BooleanField()
    owner = serializers.CharField()
    compensated_by = serializers.CharField(allow_null=True)


def _text(value):
    return None if value is None else str(value)


def _flag(value):
    return None if value is None else bool(value)


def _when(value, zone=None):
    if not value:
        return None
    text = value.astimezone(zone or timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _receipt(receipt: Receipt | None, zone) -> dict | None:
    """ReceiptSerializer's fields, written out as EffectSerializer.to_representation is (half
    of an effect's rendering went to building that serializer's fields for one receipt)."""
    if receipt is None:
        return None
    return {
        "provider": _text(receipt.provider),
        "provider_operation_id": _text(receipt.provider_operation_id),
        "provider_status": _text(receipt.provider_status),
        "payload_digest": _text(receipt.payload_digest),
        "digest_matches": _flag(receipt.digest_matches),
        "result_digest": _text(receipt.result_digest),
        "source": _text(receipt.source),
        "received_at": _when(receipt.received_at, zone),
    }


class EffectSerializer(serializers.ModelSerializer):
    """SPEC §5 "The effect"."""

    effect_id = serializers.CharField(source="pk")
    tenant = serializers.CharField(source="tenant.slug")
    status = serializers.ChoiceField(choices=EffectStatus.choices)
    contract_version = serializers.IntegerField(source="command.contract_version")
    idempotency_key = serializers.CharField(source="command.idempotency_key")
    provider_idempotency_key = serializers.CharField(source="command.provider_key")
    payload_digest = serializers.CharField(source="command.payload_digest")
    resource = serializers.JSONField(source="command.resource")
    intent = serializers.JSONField(source="command.intent")
    context = serializers.JSONField(source="command.context")  # type: ignore[assignment]  # see NOTE
    provider = serializers.CharField(source="command.provider")
    requested_by = serializers.CharField(source="command.requested_by.name")
    attempts = serializers.IntegerField(source="attempt_count")
    expires_at = serializers.DateTimeField(source="command.expires_at")
    next_check_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="UNKNOWN or IN_PROGRESS: when the provider is asked next, on the contract's "
        "backoff schedule; null: no lookup is scheduled.",
    )
    lease_expires_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="DISPATCHING: when the worker's claim runs out; lease recovery then makes "
        "the effect UNKNOWN, to be looked up.",
    )
    payload = serializers.SerializerMethodField()
    payload_redacted = serializers.BooleanField(read_only=True, default=False)
    payload_verified = serializers.SerializerMethodField(
        help_text="false: this record failed verification (its sealed payload does not open "
        "or does not have the command's digest, or the stored redaction is not the sealed "
        "payload's); payload is then null, and nothing of it is approved or sent."
    )
    approval = serializers.SerializerMethodField()
    receipt = serializers.SerializerMethodField()
    compensation = serializers.SerializerMethodField()
    compensates = serializers.SerializerMethodField()
    saga = serializers.SerializerMethodField()

    class Meta:
        model = Effect
        fields = [
            "effect_id",
            "type",
            "contract_version",
            "tenant",
            "status",
            "idempotency_key",
            "provider_idempotency_key",
            "payload_digest",
            "resource",
            "payload",
            "payload_redacted",
            "payload_verified",
            "intent",
            "context",
            "provider",
            "owner",
            "requested_by",
            "attempts",
            "expires_at",
            "created_at",
            "updated_at",
            "status_changed_at",
            "next_check_at",
            "lease_expires_at",
            "frozen",
            "mismatch",
            "escalated",
            "provider_operation_id",
            "approval",
            "receipt",
            "compensation",
            "compensates",
            "saga",
        ]

    def _viewer(self):
        return self.context.get("principal")

    def _shown(self, effect: Effect) -> tuple[bool, ShownPayload]:
        """(whether the viewer may see the clear payload, what they are shown): from the
        sealed payload, checked against the command's digest (gateway.integrity)."""
        viewer = self._viewer()
        visible = viewer is not None and selectors.may_see_payload(viewer, effect)
        opened = getattr(effect, "_clear_payload", None)  # just submitted: no decryption
        return visible, payload_to_show(effect.command, clear=visible, opened=opened)

    @extend_schema_field(serializers.JSONField)
    def get_payload(self, effect: Effect):
        return self._shown(effect)[1].payload

    @extend_schema_field(serializers.BooleanField)
    def get_payload_verified(self, effect: Effect) -> bool:
        return self._shown(effect)[1].verified

    def to_representation(self, effect: Effect):
        """The fields above, written out: DRF would build (and deep-copy) every field of this
        serializer for each effect it renders, a third of a submission's time in the view.
        Each value is what that field's ``to_representation`` gives (CharField: str,
        DateTimeField: ISO 8601 in the current zone with Z, BooleanField: bool, None stays
        None); ``test_effect_representation_is_drfs`` compares the two for effects in every
        shape, so a field added above and not here fails it."""
        command = effect.command
        zone = timezone.get_current_timezone()  # once, not per timestamp
        visible, shown = self._shown(effect)
        return {
            "effect_id": _text(effect.pk),
            "type": _text(effect.type),
            "contract_version": int(command.contract_version),
            "tenant": _text(effect.tenant.slug),
            "status": _text(effect.status),
            "idempotency_key": _text(command.idempotency_key),
            "provider_idempotency_key": _text(command.provider_key),
            "payload_digest": _text(command.payload_digest),
            "resource": command.resource,
            "payload": shown.payload,
            "payload_redacted": not visible,
            "payload_verified": shown.verified,
            "intent": command.intent,
            "context": command.context,
            "provider": _text(command.provider),
            "owner": _text(effect.owner),
            "requested_by": _text(command.requested_by.name),
            "attempts": None if effect.attempt_count is None else int(effect.attempt_count),
            "expires_at": _when(command.expires_at, zone),
            "created_at": _when(effect.created_at, zone),
            "updated_at": _when(effect.updated_at, zone),
            "status_changed_at": _when(effect.status_changed_at, zone),
            "next_check_at": _when(effect.next_check_at, zone),
            "lease_expires_at": _when(effect.lease_expires_at, zone),
            "frozen": _flag(effect.frozen),
            "mismatch": _flag(effect.mismatch),
            "escalated": _flag(effect.escalated),
            "provider_operation_id": _text(effect.provider_operation_id),
            "approval": self.get_approval(effect),
            "receipt": _receipt(self._latest_receipt(effect), zone),
            "compensation": self.get_compensation(effect),
            "compensates": self.get_compensates(effect),
            "saga": self.get_saga(effect),
        }

    def drf_representation(self, effect: Effect):
        """What DRF's generic machinery renders from the declared fields (the reference)."""
        data = super().to_representation(effect)
        viewer = self._viewer()
        data["payload_redacted"] = not (
            viewer is not None and selectors.may_see_payload(viewer, effect)
        )
        return data

    @extend_schema_field(ApprovalSerializer)
    def get_approval(self, effect: Effect):
        return {
            "required": effect.command.approval_required,
            "state": effect.approval_state,
            "approved_by": effect.approved_by.name if effect.approved_by else None,
            "approved_digest": effect.approved_digest or None,
            "approved_at": effect.approved_at,
        }

    @staticmethod
    def _latest_receipt(effect: Effect) -> Receipt | None:
        if hasattr(effect, "_latest_receipt"):  # read with the effect (gateway.fastpath)
            return effect._latest_receipt
        return selectors.effect_latest_receipt(effect)

    @extend_schema_field(ReceiptSerializer(allow_null=True))
    def get_receipt(self, effect: Effect):
        """The receipt as DRF renders it (the reference of ``_receipt``)."""
        receipt = self._latest_receipt(effect)
        if receipt is None:
            return None
        return ReceiptSerializer(receipt).data

    @extend_schema_field(CompensationSerializer)
    def get_compensation(self, effect: Effect):
        contract = get_contract(effect.type)
        window_ends_at = None
        if contract and contract.compensation_window and effect.confirmed_at:
            window_ends_at = effect.confirmed_at + contract.compensation_window
        return {
            "compensator_type": contract.compensator if contract else None,
            "window_ends_at": window_ends_at,
            "irreversible": bool(contract and contract.irreversible),
            "irreversible_boundary": contract.irreversible_boundary if contract else None,
            "automatic": bool(contract and contract.automatic_compensation),
            "owner": effect.owner,
            "compensated_by": effect.compensated_by_id,
        }

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_compensates(self, effect: Effect):
        return effect.command.compensates_id

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_saga(self, effect: Effect):
        if not effect.command.saga_id:
            return None
        return {"id": effect.command.saga_id, "step": effect.command.saga_step}


class EffectEventSerializer(serializers.ModelSerializer):
    effect_id = serializers.CharField()
    principal = serializers.CharField(source="principal.name", allow_null=True, default=None)

    class Meta:
        model = EffectEvent
        fields = [
            "id",
            "effect_id",
            "kind",
            "from_status",
            "to_status",
            "actor",
            "principal",
            "reason",
            "data",
            "created_at",
        ]


class ToolUseSerializer(serializers.ModelSerializer):
    """A PostToolUse record that names the effect: the Claude Code session and tool call that
    returned it, and the effect's status when the hook ran."""

    principal = serializers.CharField(source="principal.name")
    status = serializers.CharField(help_text="The effect's status when the hook ran.")

    class Meta:
        model = ToolCallOutcome
        fields = [
            "id",
            "effect_id",
            "session_id",
            "tool_use_id",
            "tool_name",
            "principal",
            "status",
            "failed",
            "recorded_at",
        ]


class AttemptSerializer(serializers.ModelSerializer):
    """One dispatch try, with who sent it: the adapter and the credential's fingerprint
    (``sha256:`` + 12 hex digits of its SHA-256, and its last 4 characters), never the
    credential. ``adapter`` null: the SPEC §6 adapter without a credential."""

    class Meta:
        model = Attempt
        fields = [
            "number",
            "fence",
            "state",
            "outcome",
            "http_status",
            "provider_operation_id",
            "error",
            "started_at",
            "finished_at",
            "adapter",
            "credential_fingerprint",
        ]


class CapabilitySerializer(serializers.ModelSerializer):
    principal = serializers.CharField(source="principal.name")

    class Meta:
        model = Capability
        fields = [
            "id",
            "principal",
            "effect_types",
            "resource_selector",
            "budget_count",
            "budget_amount",
            "budget_currency",
            "spent_count",
            "spent_amount",
            "expires_at",
            "revoked_at",
            "revoked_reason",
            "created_by",
            "created_at",
        ]


class CapabilityGrantSerializer(serializers.Serializer):
    principal = serializers.CharField(max_length=150)
    effect_types = serializers.ListField(child=serializers.CharField(max_length=100), min_length=1)
    resource_selector = serializers.CharField(max_length=200, required=False, default="*")
    # The bounds are the columns' (and a grant longer than the longest token is meaningless):
    # beyond them the database refused the row and the request answered 500.
    budget_count = serializers.IntegerField(
        min_value=1, max_value=2**31 - 1, required=False, allow_null=True
    )
    budget_amount = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, allow_null=True
    )
    budget_currency = serializers.RegexField(r"^[A-Z]{3}$", required=False, default="")
    expires_in = serializers.IntegerField(
        min_value=1, max_value=MAX_EXPIRES_IN, required=False, allow_null=True
    )
