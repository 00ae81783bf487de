"""Starting a saga: its inputs frozen (idempotency key + digest), its run created."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway import audit, ledger
from gateway.choices import SUBMITTER_ROLES
from gateway.errors import IdempotencyKeyMismatch, NotPermitted, ValidationProblem
from gateway.ledger import REDACTED
from gateway.lib.digest import sha256_digest
from gateway.lib.vault import seal_json
from gateway.models import Principal
from sagas.definitions import SagaDefinition, get_definition
from sagas.models import SagaRun
from sagas.services.core import R, _event, _next_check
from sagas.services.orchestrator import _advance


@dataclass(frozen=True)
class SagaStart:
    run: SagaRun
    created: bool


def _redact(inputs: dict[str, Any], definition: SagaDefinition) -> dict[str, Any]:
    return {
        name: REDACTED if name in definition.personal_inputs else value
        for name, value in inputs.items()
    }


def saga_start(
    *, principal: Principal, idempotency_key: Any, definition: Any, inputs: Any
) -> SagaStart:
    """Start a run of ``definition`` and issue its first step, or return the run this key
    already names.

    Same key + same definition and inputs replays the run (``created=False``), however many
    callers race: they collide on the (tenant, key) unique index. Same key + anything else
    raises IdempotencyKeyMismatch. Nothing is written otherwise.
    """
    ledger.validate_idempotency_key(idempotency_key, what="saga")
    found = get_definition(definition) if isinstance(definition, str) else None
    errors: dict[str, list[str]] = {}
    if found is None:
        errors["definition"] = [f"unknown saga {definition!r}; see GET /api/v1/saga-definitions"]
    elif not isinstance(inputs, dict):
        errors["inputs"] = ["must be an object"]
    else:
        errors.update(found.input_errors(inputs))
    if errors:
        raise ValidationProblem("The saga is not valid.", errors=errors)
    assert found is not None
    if principal.role not in SUBMITTER_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot start sagas.")
    if principal.frozen:
        raise NotPermitted(f"Principal {principal.name} is frozen.")

    digest = sha256_digest({"definition": found.name, "inputs": inputs})
    existing = _existing_run(principal, idempotency_key, digest)
    if existing is not None:
        return SagaStart(existing, created=False)
    now = timezone.now()
    try:
        with transaction.atomic():
            audit.lock_chain(principal.tenant_id)  # the lock order of every saga write
            run = SagaRun.objects.create(
                tenant_id=principal.tenant_id,
                definition=found.name,
                idempotency_key=idempotency_key,
                inputs_digest=digest,
                inputs_sealed=seal_json(inputs),
                inputs_redacted=_redact(inputs, found),
                requested_by=principal,
                state=R.RUNNING,
                state_changed_at=now,
                next_check_at=_next_check(R.RUNNING, now),
                created_at=now,
                updated_at=now,
            )
            _event(
                run,
                kind="started",
                actor=principal.label,
                principal=principal,
                from_state="",
                to_state=R.RUNNING,
                data={"idempotency_key": idempotency_key, "inputs_digest": digest},
                now=now,
            )
            # The first step is issued in this transaction: the answer already shows it.
            _advance(run, actor=principal.label)
    except IntegrityError:
        # Another request with this key committed first: it is the one run for the key.
        existing = _existing_run(principal, idempotency_key, digest)
        if existing is None:
            raise
        return SagaStart(existing, created=False)
    return SagaStart(run, created=True)


def _existing_run(principal: Principal, key: str, digest: str) -> SagaRun | None:
    run = SagaRun.objects.filter(tenant_id=principal.tenant_id, idempotency_key=key).first()
    if run is None:
        return None
    if run.inputs_digest != digest:
        raise IdempotencyKeyMismatch(
            f"Idempotency key {key!r} started saga {run.pk} with digest {run.inputs_digest}; "
            f"this request has digest {digest}. Send the identical request to replay it, or "
            "use a new key for a new saga.",
            extra={"saga_id": run.pk, "inputs_digest": run.inputs_digest},
        )
    return run
