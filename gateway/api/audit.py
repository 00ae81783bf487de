"""GET /api/v1/audit/checkpoints — the caller's tenant's signed chain checkpoints, newest
first, with the public key that verifies them (gateway.checkpoints)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway import checkpoints
from gateway.api.auth import principal_of

SHOWN = 100


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
