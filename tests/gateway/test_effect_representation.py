"""The effect's JSON is written out field by field (gateway.api.serializers, for speed); it
must stay exactly what DRF renders from the declared fields, for effects in every shape and
for viewers who may and may not see the payload."""

from __future__ import annotations

import pytest
from rest_framework.renderers import JSONRenderer

from gateway import services
from gateway.api.serializers import EffectSerializer
from gateway.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]


def both(effect_id: str, viewer) -> tuple[bytes, bytes]:
    effect = Effect.objects.select_related(
        "command", "command__requested_by", "approved_by", "tenant"
    ).get(pk=effect_id)
    serializer = EffectSerializer(effect, context={"principal": viewer})
    lean = JSONRenderer().render(serializer.data)
    reference = JSONRenderer().render(serializer.drf_representation(effect))
    return lean, reference


def test_effect_representation_is_drfs(
    agent, approver, operator, other_agent, refund_body, ticket_body, sandbox
):
    prepared = agent.submit(ticket_body, "shape-prepared").json()["effect_id"]
    confirmed = agent.submit({**ticket_body, "payload": {**ticket_body["payload"]}}, "shape-ok")
    confirmed_id = confirmed.json()["effect_id"]
    assert services.effect_dispatch(effect_id=confirmed_id, worker="test")
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    awaiting = agent.submit(big, "shape-awaiting").json()
    url = f"/api/v1/effects/{awaiting['effect_id']}/approve"
    approved = approver.client.post(
        url, {"payload_digest": awaiting["payload_digest"]}, format="json"
    )
    assert approved.status_code == 200, approved.content
    compensated = agent.client.post(
        f"/api/v1/effects/{confirmed_id}/compensate", {"reason": "shape"}, format="json"
    )
    assert compensated.status_code == 201, compensated.content
    sandbox.add_fault("digest_mismatch", times=1)  # a receipt that disagrees with the command
    mismatched = agent.submit({**ticket_body, "payload": {**ticket_body["payload"]}}, "shape-odd")
    mismatched_id = mismatched.json()["effect_id"]
    services.effect_dispatch(effect_id=mismatched_id, worker="test")
    shapes = [
        prepared,
        confirmed_id,
        awaiting["effect_id"],
        compensated.json()["effect_id"],
        mismatched_id,
    ]
    for effect_id in shapes:
        for viewer in (agent.principal, operator.principal, other_agent.principal, None):
            lean, reference = both(effect_id, viewer)
            assert lean == reference, (effect_id, viewer)
    confirmed_body = both(confirmed_id, agent.principal)[0]
    assert b'"receipt":{' in confirmed_body and b'"compensated_by":"eff_' in confirmed_body
    assert b'"digest_matches":false' in both(mismatched_id, agent.principal)[0]
