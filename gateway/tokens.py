"""API tokens through their life: issued (with an expiry; agents always get one), used (the
last use is kept), rotated (a new token replaces the old at once) and revoked. Each change is
a control event in the tenant's audit chain."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gateway import audit, moves, trust
from gateway.choices import Role
from gateway.errors import NotFound, NotPermitted, TokenRevoked, ValidationProblem
from gateway.models import ApiToken, Principal

TOKEN_PREFIX = "egw_"
MAX_EXPIRES_IN = 400 * 24 * 3600
MANAGER_ROLES = frozenset({Role.ADMIN})


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


def default_expires_in(principal: Principal) -> int | None:
    """Every token expires by default: agents' after GATEWAY_AGENT_TOKEN_TTL, people's
    (operators, approvers, admins) after GATEWAY_PERSON_TOKEN_TTL; 0 turns either off."""
    ttl = (
        settings.GATEWAY_AGENT_TOKEN_TTL
        if principal.role == Role.AGENT
        else settings.GATEWAY_PERSON_TOKEN_TTL
    )
    return ttl if ttl > 0 else None


def _expiry(principal: Principal, expires_in: int | None):
    if expires_in is None:
        expires_in = default_expires_in(principal)
    if expires_in is None or expires_in == 0:
        return None
    if isinstance(expires_in, bool) or not isinstance(expires_in, int):
        raise ValidationProblem("expires_in must be whole seconds.", errors={"expires_in": ["int"]})
    if not 1 <= expires_in <= MAX_EXPIRES_IN:
        raise ValidationProblem(
            f"expires_in must be from 1 to {MAX_EXPIRES_IN} seconds.",
            errors={"expires_in": [f"from 1 to {MAX_EXPIRES_IN}"]},
        )
    return timezone.now() + timedelta(seconds=expires_in)


def token_issue(
    *,
    principal: Principal,
    expires_in: int | None = None,
    actor: str = "",
    rotated_from: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """A new token and its clear value (shown once, never stored: only its SHA-256)."""
    clear = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            principal=principal,
            prefix=clear[:12],
            token_hash=hash_token(clear),
            expires_at=_expiry(principal, expires_in),
            rotated_from=rotated_from,
        )
        audit.record_control(
            tenant_id=principal.tenant_id,
            kind="token_rotated" if rotated_from else "token_issued",
            subject=f"token:{token.prefix}",
            actor=actor or "system",
            data={
                "principal": principal.name,
                "expires_at": token.expires_at.isoformat() if token.expires_at else None,
                "replaces": rotated_from.prefix if rotated_from else None,
            },
        )
    return token, clear


def _may_manage(actor: Principal, token: ApiToken) -> None:
    if token.principal.tenant_id != actor.tenant_id:
        raise NotFound("No such token.")
    if token.principal_id != actor.pk and actor.role not in MANAGER_ROLES:
        raise NotPermitted("Only admins manage other principals' tokens.")


def token_revoke(*, token: ApiToken, actor: Principal | None, reason: str = "") -> ApiToken:
    """Revoke ``token`` now; a second revocation is TokenRevoked (409)."""
    if actor is not None:
        _may_manage(actor, token)
    with transaction.atomic():
        # Compare-and-set against a concurrent revocation or rotation of the same token.
        changed = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if not changed:
            raise TokenRevoked(
                f"Token {token.prefix}… is already revoked: a revoked token can be neither "
                "revoked again nor rotated; issue a new one."
            )
        # This process forgets it at once; the others when the revocation's message reaches
        # them after commit, or within GATEWAY_TOKEN_CACHE_TTL at worst (gateway.trust).
        trust.tokens.forget(token.token_hash)
        moves.distrust_everywhere(token_hash=token.token_hash)
        audit.record_control(
            tenant_id=token.principal.tenant_id,
            kind="token_revoked",
            subject=f"token:{token.prefix}",
            actor=actor.label if actor else "cli",
            principal=actor,
            reason=reason,
            data={"principal": token.principal.name},
        )
    token.refresh_from_db()
    return token


def token_rotate(
    *, token: ApiToken, actor: Principal | None, expires_in: int | None = None
) -> tuple[ApiToken, str]:
    """Replace ``token`` with a new one for the same principal; the old one stops at once."""
    with transaction.atomic():
        token_revoke(token=token, actor=actor, reason="rotated")
        return token_issue(
            principal=token.principal,
            expires_in=expires_in,
            actor=actor.label if actor else "cli",
            rotated_from=token,
        )


def tokens_visible_to(principal: Principal):
    """Admins see the tenant's tokens; everyone else their own."""
    query = ApiToken.objects.filter(principal__tenant_id=principal.tenant_id).select_related(
        "principal"
    )
    if principal.role not in MANAGER_ROLES:
        query = query.filter(principal=principal)
    return query.order_by("-created_at")


def token_find(*, prefix: str, tenant_slug: str | None = None) -> ApiToken:
    """A token by the prefix shown at issue (``egw_xxxxxxxx``), for the CLI."""
    query = ApiToken.objects.select_related("principal__tenant").filter(prefix=prefix)
    if tenant_slug:
        query = query.filter(principal__tenant__slug=tenant_slug)
    matches = list(query[:2])
    if not matches:
        raise NotFound(f"No token with prefix {prefix}.")
    if len(matches) > 1:
        raise ValidationProblem(
            f"Several tokens start with {prefix}: name the tenant.",
            errors={"tenant": ["required: the prefix is ambiguous"]},
        )
    return matches[0]
