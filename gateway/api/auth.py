"""Bearer tokens for agents (stored as SHA-256 only) and per-token throttling."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, throttling

from gateway import trust
from gateway.errors import NotPermitted
from gateway.models import ApiToken, Principal
from gateway.tokens import TOKEN_PREFIX as TOKEN_PREFIX
from gateway.tokens import hash_token as hash_token
from gateway.tokens import token_issue


def token_create(*, principal: Principal, expires_in: int | None = None) -> str:
    """A new API token for ``principal``; the clear value is returned once and never stored."""
    return token_issue(principal=principal, expires_in=expires_in)[1]


@dataclass(frozen=True)
class PrincipalUser:
    """What ``request.user`` is for a token: the principal, authenticated."""

    principal: Principal
    is_authenticated: bool = True
    is_active: bool = True

    @property
    def pk(self) -> int:
        return self.principal.pk


def _token_record(digest: str) -> ApiToken | None:
    """The live token with this hash, from this process's short trust (gateway.trust) or
    the database."""
    record = trust.tokens.get(digest)
    if record is not None:
        return record
    record = (
        ApiToken.objects.select_related("principal__tenant")
        .filter(token_hash=digest, revoked_at__isnull=True)
        .first()
    )
    if record is None:
        trust.tokens.forget(digest)
        return None
    seen = timezone.now()
    if record.last_used_at is None or (seen - record.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=record.pk).update(last_used_at=seen)
        record.last_used_at = seen
    trust.tokens.put(digest, record)
    return record


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization: Bearer TOKEN, one token.")
        try:
            token = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token is not valid.") from None
        record = _token_record(hash_token(token))
        if record is None or (
            record.expires_at is not None and record.expires_at <= timezone.now()
        ):
            raise exceptions.AuthenticationFailed("The token is not valid, expired or was revoked.")
        if record.principal.frozen:
            # A frozen principal reads nothing either: freezing is the incident brake.
            raise exceptions.PermissionDenied(
                f"Principal {record.principal.name} is frozen: its tokens read nothing."
            )
        return PrincipalUser(record.principal), record

    def authenticate_header(self, request) -> str:
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}


def principal_of(request) -> Principal:
    """The acting principal, whether the caller used a token or a console session."""
    user = request.user
    principal = getattr(user, "principal", None)
    if principal is None:
        raise NotPermitted("This login is not linked to a principal of any tenant.")
    return principal


class TokenRateThrottle(throttling.SimpleRateThrottle):
    """Per token (or per console login) request rate, GATEWAY_TOKEN_RATE."""

    scope = "token"

    def allow_request(self, request, view):
        """DRF's sliding log (SimpleRateThrottle.allow_request, the same steps), kept as an
        array of doubles instead of a list of floats: the cache pickles the whole log at
        every request, and a token near its rate holds thousands of entries. A list of 4,000
        cost 0.3 ms to read and write back, the array 0.012 ms (docs/reliability.md)."""
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.history = array("d", self.cache.get(self.key, ()))
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()
        if len(self.history) >= self.num_requests:
            return self.throttle_failure()
        return self.throttle_success()

    def get_cache_key(self, request, view):
        auth = request.auth
        if isinstance(auth, ApiToken):
            ident = f"token:{auth.pk}"
        elif request.user is not None and getattr(request.user, "is_authenticated", False):
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
