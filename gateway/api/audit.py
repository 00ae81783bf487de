"""The audit endpoints: GET /api/v1/audit/checkpoints — the caller's tenant's signed chain
checkpoints, newest first, with the public key that verifies them (gateway.checkpoints);
the Merkle tree head, inclusion and consistency proofs, and the witness cosignatures
(gateway.audit_tree)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway import audit_tree, checkpoints
from gateway.api.auth import principal_of
from gateway.choices import APPROVER_ROLES, OPERATOR_ROLES
from gateway.errors import NotFound, NotPermitted, ValidationProblem
from gateway.models import EffectEvent

SHOWN = 100
# Who may prove the inclusion of any of the tenant's events; an agent, only its own effects'.
PROOF_ROLES = OPERATOR_ROLES | APPROVER_ROLES


class AuditCheckpointsView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        tenant = principal_of(request).tenant
        found = checkpoints.checkpoints_read(tenant.slug, limit=SHOWN)
        return Response(
            {
                "public_key": checkpoints.public_key_b64(),
                "key_fingerprint": checkpoints.fingerprint(),
                "results": list(reversed(found)),
            }
        )


def _number(request: Request, name: str, *, required: bool) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if required:
            raise ValidationProblem(f"{name} is required.", errors={name: ["required"]})
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ValidationProblem(
            f"{name} must be a non-negative integer.", errors={name: ["not a number"]}
        )
    return int(raw)


class AuditTreeHeadView(APIView):
    """The caller's tenant's current Merkle tree head, signed with the checkpoint key, and the
    witness cosignatures received for its heads (gateway.audit_tree). Every role: a head
    says no more than the checkpoints do (a count and a hash)."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        tenant = principal_of(request).tenant
        head = audit_tree.tree_head(tenant)
        cosigned = [
            line["cosignature"]
            for line in audit_tree.cosignatures_read(tenant.slug)
            if line["head"].get("tree_size") == head["tree_size"]
            and line["head"].get("root_hash") == head["root_hash"]
        ]
        return Response({**head, "cosignatures": cosigned})


class AuditInclusionView(APIView):
    """The audit path of one of the tenant's sealed events. Admins, operators and approvers:
    any event of the tenant; an agent: the events of the effects it requested. Any other
    event is 404, as if it did not exist."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        event_id = _number(request, "event_id", required=True)
        tree_size = _number(request, "tree_size", required=False)
        assert event_id is not None
        if principal.role not in PROOF_ROLES:
            mine = EffectEvent.objects.filter(
                pk=event_id, tenant_id=principal.tenant_id, effect__command__requested_by=principal
            ).exists()
            if not mine:
                raise NotFound(f"Event {event_id} is not a sealed event of this tenant.")
        return Response(audit_tree.inclusion(principal.tenant_id, event_id, tree_size))


class AuditConsistencyView(APIView):
    """The proof that the tenant's tree of size ``first`` is a prefix of its tree of size
    ``second`` (the current one when left out). Every role, as the tree head."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        tenant_id = principal_of(request).tenant_id
        first = _number(request, "first", required=True)
        second = _number(request, "second", required=False)
        assert first is not None
        return Response(audit_tree.consistency(tenant_id, first, second))


class AuditCosignaturesView(APIView):
    """POST a witness's cosignature of one of the tenant's heads: ``{"head": {...},
    "cosignature": {...}}``. Operators and admins (the witness's token)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        if principal.role not in OPERATOR_ROLES:
            raise NotPermitted(f"A principal with role {principal.role} cannot post cosignatures.")
        body = request.data if isinstance(request.data, dict) else {}
        stored = audit_tree.cosignature_store(
            principal.tenant, body.get("head"), body.get("cosignature")
        )
        return Response(stored, status=201)
