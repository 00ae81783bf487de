"""A tenant's own provider credentials (its own Stripe account): set, rotated, retired by its
admins, sealed with the vault key, and chosen at dispatch.

Which credential sends an effect of tenant T to provider P: T's active credential for P when
T has one, else the deployment's (``GATEWAY_PROVIDERS``); never another tenant's. The
attempt records the chosen credential's fingerprint before the provider is called, and the
send uses exactly that credential (``send_as``): a rotation between the claim and the call
changes nothing for that attempt. A lookup asks with the credential that sent the effect
(``lookup_credential``, by its latest attempt's fingerprint), because an idempotency key or
an operation id belongs to the account that received it.

Rotation: the new credential becomes the active one for new sends at once; the one it
replaces becomes ``rotated`` and keeps serving the effects it sent (their resends of an
uncertain attempt, their lookups) until an admin retires it. Retiring is refused while an
effect it sent is still unsettled (being sent, UNKNOWN or IN_PROGRESS), unless forced; a
forced retirement leaves those effects' lookups without a credential: they stay where they
are, never sent again, and go to a human after the contract's reconcile budget.

Rate: each credential has a rate limit and a ``Retry-After`` pause of its own (gateway.
providers.protection), its admin's ``rate_limit`` or else the provider's. The dispatcher knows
before a claim which credential a due effect will be sent with: ``SENT_WITH_SQL`` is
``_chosen_rows``'s rule in SQL (tests/providers/test_credential_rates.py runs both).

The secret is sealed with ``seal_bound`` to the tenant, the provider and its fingerprint, so
a sealed value copied into another tenant's row does not open; it is never logged, never in
an event, never in an answer: those carry its fingerprint and its last 4 characters.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from gateway import audit
from gateway.choices import (
    ADMIN_ROLES,
    CREDENTIAL_USABLE,
    OPERATOR_ROLES,
    TO_RECONCILE,
    CredentialState,
    EffectStatus,
)
from gateway.contracts import CONTRACTS, EffectContract, get_contract
from gateway.errors import CredentialConflict, NotFound, NotPermitted, ValidationProblem
from gateway.lib.vault import open_bound, reseal_bound, seal_bound
from gateway.models import Attempt, Effect, Principal, ProviderCredential
from gateway.providers.config import fingerprint, parse_entry
from gateway.providers.gates import parse_rate
from gateway.providers.registry import Credential, sender_of

if TYPE_CHECKING:
    from gateway.fastpath import FastClaim

logger = logging.getLogger(__name__)

MIN_LENGTH, MAX_LENGTH = 12, 4096
# Effects whose lookups still need the credential that sent them.
UNSETTLED = frozenset({EffectStatus.DISPATCHING, *TO_RECONCILE})


def _bound_to(tenant_id: int, provider: str, shown: str) -> str:
    return f"provider-credential:{tenant_id}:{provider}:{shown}"


def last4_of(secret: str) -> str:
    """The last 4 characters, when the secret is long enough (16) for them to give little away
    (the rule of ``fingerprint``)."""
    return secret[-4:] if len(secret) >= 16 else ""


def open_credential(row: ProviderCredential) -> Credential:
    """The row's secret, opened for its own tenant, provider and fingerprint only."""
    secret = open_bound(
        row.secret_sealed, bound_to=_bound_to(row.tenant_id, row.provider, row.fingerprint)
    )
    if not isinstance(secret, str) or fingerprint(secret) != row.fingerprint:
        raise ValueError(f"provider credential {row.pk} does not match its fingerprint")
    return Credential(row.fingerprint, secret)


# --- who may, and what is valid -------------------------------------------------------------


def providers_known() -> list[str]:
    """The providers some loaded contract sends to."""
    return sorted({contract.provider for contract in CONTRACTS.values()})


def _check_provider(provider: str) -> None:
    if provider not in providers_known():
        raise NotFound(f"No provider {provider!r}: no effect type is sent to it.")


def _check_admin(actor: Principal) -> None:
    if actor.role not in ADMIN_ROLES or actor.frozen:
        raise NotPermitted(
            f"Only admins set, rotate or retire provider credentials; you are {actor.role}."
        )


def _check_secret(secret: object) -> str:
    if not isinstance(secret, str):
        raise ValidationProblem("secret must be a string.", errors={"secret": ["a string"]})
    value = secret.strip()
    problem = ""
    if not MIN_LENGTH <= len(value) <= MAX_LENGTH:
        problem = f"from {MIN_LENGTH} to {MAX_LENGTH} characters"
    elif any(ch.isspace() or not ch.isprintable() for ch in value):
        problem = "printable characters without spaces"
    if problem:  # the message never repeats the value
        raise ValidationProblem(f"The secret must be {problem}.", errors={"secret": [problem]})
    return value


def provider_rate(provider: str) -> str:
    """The provider's configured rate limit ("50/s"; "" for none, or a malformed entry)."""
    raw = settings.GATEWAY_PROVIDERS.get(provider)
    if raw is None:
        return ""
    try:
        rate = parse_entry(provider, raw).rate_limit
    except Exception:  # a malformed entry is the start-up checks' report
        return ""
    return rate.text if rate is not None else ""


def _check_rate(provider: str, rate: object) -> str:
    """A credential's own rate: "" (the provider's) or a rate such as "25/s", for a provider
    whose ``GATEWAY_PROVIDERS`` entry has a ``rate_limit`` (the gates count permits only for
    such providers)."""
    if rate is None or rate == "":
        return ""
    if not isinstance(rate, str):
        raise ValidationProblem("rate_limit must be a string.", errors={"rate_limit": ["a string"]})
    try:
        text = parse_rate(rate).text
    except ValueError as exc:
        raise ValidationProblem(str(exc), errors={"rate_limit": [str(exc)]}) from None
    if not provider_rate(provider):
        problem = (
            f"{provider} has no rate_limit in GATEWAY_PROVIDERS: a credential's own rate "
            "refines the provider's, which the operator sets first"
        )
        raise ValidationProblem(f"{problem}.", errors={"rate_limit": [problem]})
    return text


# --- writes ---------------------------------------------------------------------------------


def credentials_reseal() -> int:
    """Re-seal every credential's secret under the vault's current primary key (key
    rotation, ``manage.py rotate_vault_key``), bound as before; how many."""
    done = 0
    for pk in ProviderCredential.objects.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            row = ProviderCredential.objects.select_for_update().get(pk=pk)
            bound_to = _bound_to(row.tenant_id, row.provider, row.fingerprint)
            ProviderCredential.objects.filter(pk=pk).update(
                secret_sealed=reseal_bound(row.secret_sealed, bound_to=bound_to)
            )
        done += 1
    return done


def _insert(
    *,
    actor: Principal,
    provider: str,
    secret: str,
    replaces: ProviderCredential | None,
    rate_limit: str = "",
) -> ProviderCredential:
    shown = fingerprint(secret)
    if ProviderCredential.objects.filter(
        tenant_id=actor.tenant_id, provider=provider, fingerprint=shown
    ).exists():
        raise CredentialConflict(
            f"This secret ({shown}) was already set for {provider}: set a new one."
        )
    try:
        with transaction.atomic():
            return ProviderCredential.objects.create(
                tenant_id=actor.tenant_id,
                provider=provider,
                secret_sealed=seal_bound(
                    secret, bound_to=_bound_to(actor.tenant_id, provider, shown)
                ),
                fingerprint=shown,
                last4=last4_of(secret),
                state=CredentialState.ACTIVE,
                created_by=actor.label,
                created_at=timezone.now(),
                replaces=replaces,
                rate_limit=rate_limit,
            )
    except IntegrityError:  # a concurrent set of the same provider won the active slot
        raise CredentialConflict(
            f"{provider} got an active credential meanwhile: rotate it instead."
        ) from None


def _shown(row: ProviderCredential) -> dict[str, str]:
    shown = {"fingerprint": row.fingerprint, "last4": row.last4}
    if row.rate_limit:
        shown["rate_limit"] = row.rate_limit
    return shown


def credential_set(
    *, actor: Principal, provider: str, secret: object, rate_limit: object = ""
) -> ProviderCredential:
    """The tenant's first (or next, after a retirement) credential for ``provider``, active at
    once, with its own ``rate_limit`` ("" for the provider's); 409 when one is active (rotate
    it)."""
    _check_admin(actor)
    _check_provider(provider)
    value = _check_secret(secret)
    rate = _check_rate(provider, rate_limit)
    with transaction.atomic():
        if ProviderCredential.objects.filter(
            tenant_id=actor.tenant_id, provider=provider, state=CredentialState.ACTIVE
        ).exists():
            raise CredentialConflict(
                f"{provider} already has an active credential: rotate it to replace it."
            )
        row = _insert(actor=actor, provider=provider, secret=value, replaces=None, rate_limit=rate)
        audit.record_control(
            tenant_id=actor.tenant_id,
            kind="provider_credential_set",
            subject=f"provider:{provider}",
            actor=actor.label,
            principal=actor,
            data=_shown(row),
        )
    return row


def credential_rotate(
    *, actor: Principal, provider: str, secret: object, rate_limit: object = ""
) -> ProviderCredential:
    """A new active credential for ``provider`` in place of the active one, which becomes
    ``rotated``: new sends use the new one at once, the effects the old one sent keep it.
    ``rate_limit``: the new credential's own rate ("" for the provider's)."""
    _check_admin(actor)
    _check_provider(provider)
    value = _check_secret(secret)
    rate = _check_rate(provider, rate_limit)
    now = timezone.now()
    with transaction.atomic():
        # Locked against a concurrent rotation or retirement of the same credential.
        current = (
            ProviderCredential.objects.select_for_update()
            .filter(tenant_id=actor.tenant_id, provider=provider, state=CredentialState.ACTIVE)
            .first()
        )
        if current is None:
            raise CredentialConflict(f"{provider} has no active credential to rotate: set one.")
        ProviderCredential.objects.filter(pk=current.pk).update(
            state=CredentialState.ROTATED, rotated_at=now
        )
        row = _insert(
            actor=actor, provider=provider, secret=value, replaces=current, rate_limit=rate
        )
        audit.record_control(
            tenant_id=actor.tenant_id,
            kind="provider_credential_rotated",
            subject=f"provider:{provider}",
            actor=actor.label,
            principal=actor,
            data={**_shown(row), "replaces": current.fingerprint},
        )
    return row


def unsettled_sent_with(row: ProviderCredential) -> int:
    """How many of the tenant's effects this credential sent are not settled yet."""
    return (
        Effect.objects.filter(
            tenant_id=row.tenant_id,
            status__in=UNSETTLED,
            attempts__credential_fingerprint=row.fingerprint,
        )
        .distinct()
        .count()
    )


def credential_retire(
    *, actor: Principal, provider: str, credential_id: int, reason: str = "", force: bool = False
) -> ProviderCredential:
    """Stop using the credential for anything. Refused (409) while effects it sent are
    unsettled, unless ``force``: their lookups then find no credential and go to a human."""
    _check_admin(actor)
    _check_provider(provider)
    with transaction.atomic():
        # Locked against a dispatch choosing it (which holds it FOR SHARE while it marks the
        # attempt): either that attempt is counted below, or the dispatch sees it retired.
        row = (
            ProviderCredential.objects.select_for_update()
            .filter(pk=credential_id, tenant_id=actor.tenant_id, provider=provider)
            .first()
        )
        if row is None:
            raise NotFound(f"No credential {credential_id} for {provider}.")
        if row.state == CredentialState.RETIRED:
            raise CredentialConflict(f"Credential {row.fingerprint} is already retired.")
        unsettled = unsettled_sent_with(row)
        if unsettled and not force:
            raise CredentialConflict(
                f"{unsettled} effect(s) sent with {row.fingerprint} are not settled yet: their "
                "lookups need it. Retire it once they are, or force it (they then go to a "
                "human).",
                extra={"unsettled": unsettled},
            )
        ProviderCredential.objects.filter(pk=row.pk).update(
            state=CredentialState.RETIRED, retired_at=timezone.now(), retired_by=actor.label
        )
        audit.record_control(
            tenant_id=actor.tenant_id,
            kind="provider_credential_retired",
            subject=f"provider:{provider}",
            actor=actor.label,
            principal=actor,
            reason=reason,
            data={**_shown(row), "was": row.state, "unsettled": unsettled, "forced": force},
        )
    row.refresh_from_db()
    return row


# --- reads ----------------------------------------------------------------------------------


def credentials_visible_to(principal: Principal, provider: str):
    """The tenant's credentials for ``provider``, active first then newest: operators and
    admins (only admins change them)."""
    if principal.role not in OPERATOR_ROLES:
        raise NotPermitted(
            f"Provider credentials are for operators and admins, not {principal.role}."
        )
    _check_provider(provider)
    return ProviderCredential.objects.filter(
        tenant_id=principal.tenant_id, provider=provider
    ).order_by("state", "-created_at")


def deployment_fingerprint(provider: str) -> str:
    """The fingerprint of the deployment's credential for ``provider`` ("" for none, or when
    its adapter cannot be built here)."""
    for contract in CONTRACTS.values():
        if contract.provider == provider:
            try:
                return sender_of(contract).credential_fingerprint
            except Exception:  # a provider misconfigured here is the start-up checks' report
                return ""
    return ""


# --- at dispatch ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SendAs:
    """What an attempt is sent with: a tenant's credential, or (None) the deployment's; or,
    with ``refused``, nothing: the attempt ends NOT_STARTED and is tried again."""

    credential: Credential | None = None
    refused: str = ""


@dataclass(frozen=True)
class _Sending:
    """One effect about to be sent: whose, to which provider, its attempt number."""

    effect_id: str
    tenant_id: int
    provider: str
    number: int


def _chosen_rows(sendings: list[_Sending]) -> dict[str, ProviderCredential]:
    """The tenant credential each effect is sent with (effects sent with the deployment's are
    left out): the one that sent its previous attempt while that one is not retired (a resend
    goes to the account that may hold the earlier one), else its tenant's active one."""
    if not sendings:
        return {}
    tenants = {s.tenant_id for s in sendings}
    providers = {s.provider for s in sendings}
    rows = list(
        ProviderCredential.objects.filter(
            tenant_id__in=tenants, provider__in=providers, state__in=CREDENTIAL_USABLE
        )
    )
    active = {(r.tenant_id, r.provider): r for r in rows if r.state == CredentialState.ACTIVE}
    usable = {(r.tenant_id, r.provider, r.fingerprint): r for r in rows}
    retried = {s.effect_id: s.number - 1 for s in sendings if s.number > 1}
    previous: dict[str, str] = {}
    if retried and rows:
        for effect_id, number, shown in Attempt.objects.filter(
            effect_id__in=list(retried), credential_fingerprint__isnull=False
        ).values_list("effect_id", "number", "credential_fingerprint"):
            if retried[effect_id] == number and shown:
                previous[effect_id] = shown
    chosen = {}
    for s in sendings:
        row = usable.get((s.tenant_id, s.provider, previous.get(s.effect_id, "")))
        row = row or active.get((s.tenant_id, s.provider))
        if row is not None:
            chosen[s.effect_id] = row
    return chosen


_USABLE_IN = ", ".join(f"'{state}'" for state in sorted(CREDENTIAL_USABLE))

# The fingerprint of the tenant credential an effect's next attempt is sent with (NULL: the
# deployment's), as ``_chosen_rows`` chooses it, over ``e`` (gateway_effect, before its claim:
# ``attempt_count`` numbers its latest attempt) and ``c`` (its command): the credential that
# sent its latest attempt while usable, else its tenant's active one for the provider. A
# tenant without any usable credential costs one probe of the credentials' unique index.
SENT_WITH_SQL = f"""CASE WHEN EXISTS (
    SELECT 1 FROM gateway_providercredential pc0
     WHERE pc0.tenant_id = e.tenant_id AND pc0.provider = c.provider
       AND pc0.state IN ({_USABLE_IN}))
THEN COALESCE(
    (SELECT pc1.fingerprint FROM gateway_attempt a1
       JOIN gateway_providercredential pc1
         ON pc1.tenant_id = e.tenant_id AND pc1.provider = c.provider
        AND pc1.fingerprint = a1.credential_fingerprint AND pc1.state IN ({_USABLE_IN})
      WHERE a1.effect_id = e.effect_id AND a1.number = e.attempt_count),
    (SELECT pc2.fingerprint FROM gateway_providercredential pc2
      WHERE pc2.tenant_id = e.tenant_id AND pc2.provider = c.provider
        AND pc2.state = '{CredentialState.ACTIVE.value}'))
END"""


# Due rows of ``provider`` whose tenant holds a usable credential of its own there: the only
# ones SENT_WITH_SQL can name a fingerprint for. Without such a credential the condition is
# false once for the statement (not per row), and a backlog is not scanned for nothing.
OWN_CREDENTIAL_TENANTS_SQL = f"""e.tenant_id IN (
    SELECT pt.tenant_id FROM gateway_providercredential pt
     WHERE pt.provider = %(provider)s AND pt.state IN ({_USABLE_IN}))
 AND EXISTS (SELECT 1 FROM gateway_providercredential px
              WHERE px.provider = %(provider)s AND px.state IN ({_USABLE_IN}))"""


def rate_of_sql(row: str) -> str:
    """A credential's own rate ("" for the provider's), over a row ``row`` with its
    ``tenant_id``, ``provider`` and ``fp`` (``SENT_WITH_SQL``)."""
    return f"""COALESCE((SELECT pr.rate_limit FROM gateway_providercredential pr
     WHERE pr.tenant_id = {row}.tenant_id AND pr.provider = {row}.provider
       AND pr.fingerprint = {row}.fp), '')"""


_SENT_WITH_ONE = f"""
SELECT provider, type, attempt_count, fp, {rate_of_sql("x")}
  FROM (SELECT c.provider, e.type, e.attempt_count, e.tenant_id, ({SENT_WITH_SQL}) AS fp
          FROM gateway_effect e JOIN gateway_command c ON c.effect_id = e.effect_id
         WHERE e.effect_id = %s) x"""


def dispatch_sender(effect_id: str) -> tuple[str, str, int, str | None, str] | None:
    """For the gates before a single claim (gateway.dispatch_gates), in one statement: the
    effect's provider, type and attempt count, the fingerprint of the tenant credential its
    next attempt goes out with (None: the deployment's) and that credential's own rate."""
    with connection.cursor() as cursor:
        cursor.execute(_SENT_WITH_ONE, [effect_id])
        row = cursor.fetchone()
    if row is None:
        return None
    provider, type_, attempts, shown, rate = row
    return str(provider), str(type_), int(attempts), shown or None, str(rate or "")


def _hold(row: ProviderCredential) -> bool:
    """Hold the credential FOR SHARE until the caller's transaction ends, so that a retirement
    (FOR UPDATE) waits for it and then counts the attempt marked with it; False when it was
    retired meanwhile."""
    table = ProviderCredential._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {table} WHERE id = %s AND state = ANY(%s) FOR SHARE",
            [row.pk, list(CREDENTIAL_USABLE)],
        )
        return cursor.fetchone() is not None


def claim_sender(effect: Effect, number: int) -> tuple[dict[str, str | None], SendAs]:
    """Inside the claim's transaction: the attempt's ``adapter`` and ``credential_fingerprint``
    and what to send with (``_chosen_rows``: a tenant credential, held FOR SHARE until the
    claim commits, or the deployment's)."""
    contract = get_contract(effect.type)
    if contract is None:
        return {}, SendAs()
    sending = _Sending(effect.pk, effect.tenant_id, contract.provider, number)
    for _ in range(3):  # a credential retired between the read and the hold: choose again
        row = _chosen_rows([sending]).get(effect.pk)
        if row is None:
            break
        if _hold(row):
            credential = open_credential(row)
            return sender_of(contract, credential).attempt_fields(), SendAs(credential)
    else:
        return {}, SendAs(refused="the tenant's credentials changed during the claim")
    return sender_of(contract).attempt_fields(), SendAs()


def attempts_note_sender(claims: Iterable[FastClaim]) -> dict[int, SendAs]:
    """Write the sender (adapter, credential fingerprint) on fast claims' attempts, which the
    claim statement leaves NULL, and say what each is sent with (by attempt id).

    One SELECT per batch finds the claimed tenants' credentials (``_chosen_rows``), when the
    claim statement saw that some tenant of the batch has credentials of its own. The
    deployment's sender: one UPDATE per type whose sender is not the default, none at all
    on the default's hot path; an attempt it fails to mark keeps NULL (its lookups use the
    deployment's credential, which sent it). A tenant's credential: held FOR SHARE while its
    attempts are marked, and sent with only once they are; an attempt that cannot be marked,
    or whose credential was retired meanwhile, is refused (NOT_STARTED, nothing sent), since
    its lookups could not find the credential that sent it."""
    claims = list(claims)
    sendings = []
    for claim in claims:
        contract = get_contract(claim.type)
        if contract is not None and claim.own_credentials:
            sendings.append(
                _Sending(claim.effect_id, claim.tenant_id, contract.provider, claim.attempt_number)
            )
    chosen = _chosen_rows(sendings)
    groups: dict[tuple[str, int], list[int]] = {}
    rows: dict[int, ProviderCredential] = {}
    for claim in claims:
        row = chosen.get(claim.effect_id)
        if row is not None:
            rows[row.pk] = row
        groups.setdefault((claim.type, row.pk if row else 0), []).append(claim.attempt_id)
    sent_as: dict[int, SendAs] = {}
    for (type_, row_pk), attempt_ids in groups.items():
        send_as = _note(type_, rows.get(row_pk), attempt_ids)
        sent_as.update(dict.fromkeys(attempt_ids, send_as))
    return sent_as


def _note(type_: str, row: ProviderCredential | None, attempt_ids: list[int]) -> SendAs:
    contract = get_contract(type_)
    if contract is None:
        return SendAs()
    if row is None:
        try:
            fields = sender_of(contract).attempt_fields()
        except Exception:  # the send builds the adapter again and fails as it always did
            return SendAs()
        if fields.get("adapter") is not None:
            try:
                Attempt.objects.filter(pk__in=attempt_ids).update(**fields)
            except DatabaseError:
                logger.warning("attempt sender not recorded", extra={"effect_type": type_})
        return SendAs()
    try:
        credential = open_credential(row)
        fields = sender_of(contract, credential).attempt_fields()
        with transaction.atomic():
            if not _hold(row):
                retired = f"the credential {row.fingerprint} was retired before the send"
                return SendAs(refused=retired)
            Attempt.objects.filter(pk__in=attempt_ids).update(**fields)
    except Exception:  # nothing is sent with a credential the attempt does not name
        logger.warning("attempt sender not recorded", extra={"effect_type": type_})
        return SendAs(refused="the sender could not be recorded on the attempt")
    return SendAs(credential)


def lookup_fingerprints(effect_ids: list[str]) -> dict[str, str | None]:
    """Per effect, the fingerprint of the tenant credential its lookups ask with (its latest
    attempt's, as ``lookup_credential`` finds it), or None for the deployment's: in two
    queries for the lot."""
    latest: dict[str, tuple[int, str]] = {}
    for effect_id, number, shown in Attempt.objects.filter(effect_id__in=effect_ids).values_list(
        "effect_id", "number", "credential_fingerprint"
    ):
        if effect_id not in latest or number > latest[effect_id][0]:
            latest[effect_id] = (number, shown or "")
    rows = Effect.objects.filter(pk__in=effect_ids).values_list(
        "pk", "tenant_id", "command__provider"
    )
    wanted = {(tenant, provider, latest.get(pk, (0, ""))[1]) for pk, tenant, provider in rows}
    own = set(
        ProviderCredential.objects.filter(
            tenant_id__in={w[0] for w in wanted}, fingerprint__in={w[2] for w in wanted if w[2]}
        ).values_list("tenant_id", "provider", "fingerprint")
    ) if any(w[2] for w in wanted) else set()  # fmt: skip
    out: dict[str, str | None] = {}
    for pk, tenant, provider in rows:
        shown = latest.get(pk, (0, ""))[1]
        out[pk] = shown if (tenant, provider, shown) in own else None
    return out


def lookup_credential(effect: Effect, contract: EffectContract) -> tuple[Credential | None, str]:
    """The credential to ask about ``effect`` with: the one that sent its latest attempt
    (None: the deployment's). A problem ("" when none) when that credential is retired or
    gone: then nothing may ask in its place."""
    shown = (
        Attempt.objects.filter(effect_id=effect.pk)
        .order_by("-number")
        .values_list("credential_fingerprint", flat=True)
        .first()
    )
    if not shown:
        return None, ""
    row = ProviderCredential.objects.filter(
        tenant_id=effect.tenant_id, provider=contract.provider, fingerprint=shown
    ).first()
    if row is None:
        return None, ""  # the deployment's credential sent it
    if row.state not in CREDENTIAL_USABLE:
        return None, (
            f"the tenant's credential {shown} that sent it is retired: no lookup may ask with "
            "another account's credential"
        )
    return open_credential(row), ""
