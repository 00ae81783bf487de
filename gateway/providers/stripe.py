"""The Stripe adapter: ``billing.charge.create`` as a Charge and ``billing.refund.create`` as a
Refund, through Stripe's official SDK, mapped onto the gateway's outcome vocabulary.

Writes. Every write carries ``Idempotency-Key`` = the command's provider key, and the charge or
refund carries ``metadata`` = effect_id, effect_type, payload_digest and idempotency_key (what a
lookup finds it by, and what proves it is this command). The client is one ``StripeClient``
per adapter with ``max_network_retries=0`` (the gateway decides what is sent again, never the
SDK) over a ``requests`` session that never follows a redirect.

What Stripe's answers prove:

- a charge or refund object: its status (``succeeded`` → CONFIRMED, ``pending`` → IN_PROGRESS,
  ``failed``/``canceled`` → REJECTED), after its metadata digest is checked against the
  command's (another digest is a mismatch, never CONFIRMED);
- ``CardError`` (402) and ``InvalidRequestError`` (400/404): REJECTED with Stripe's message;
- ``IdempotencyError``: Stripe holds the key for other parameters — the mismatch case
  (UNKNOWN with ``mismatch``), never CONFIRMED, never resent;
- 429 (``RateLimitError``) and 409 ``lock_timeout``/``idempotency_key_in_use``: Stripe saves
  no result for these, nothing was executed: NOT_STARTED, sent again later with the same key
  (``Retry-After`` is kept in the reason when Stripe gave one); 401/403 likewise: a refused
  credential executes nothing;
- a failure to connect (refused, DNS, connect timeout): NOT_STARTED. The SDK folds every
  network failure into ``APIConnectionError``; the chain under it (requests' and urllib3's
  exceptions) tells a connect failure from a failure after the request may have left. Any
  other network failure, a read timeout, a 5xx or any answer that is not one of the above:
  UNKNOWN, settled by a lookup.

Lookups. By the stored object id when there is one (retrieve the ``ch_``/``re_`` object; a
404 is NOT_FOUND). Otherwise by key — and Stripe cannot be asked by idempotency key: its
keys are kept about 24 hours and cannot be listed, and past that a replay or a "not found"
by key proves nothing. So the lookup by key is a metadata scan: the charges (or refunds) list,
which is strongly consistent (the Search API is not: it lags writes by up to a minute, so it
could miss a charge made a second ago), newest first, of every object created within the
contract's key retention plus an hour of clock skew, matched on
``metadata['idempotency_key']``. NOT_FOUND comes only from a scan that reached the end of that
window, so it could have seen the object: a command younger than the key retention cannot
have an object older than the window, and for an older command the reconciler already
treats "not found" as proving nothing. A scan that hits its page bound first, or fails,
proves nothing (UNREACHABLE). Two objects with one key (never expected) come back with a
digest that names them, so the reconciler opens a mismatch case instead of picking one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
import stripe
import urllib3.exceptions
from django.conf import settings

from gateway.choices import Outcome
from gateway.contracts import EffectContract
from gateway.providers.base import (
    CallResult,
    ExecuteRequest,
    LookupResult,
    LookupStatus,
    ProviderConfig,
    ProviderOperation,
)
from gateway.providers.http import classify_operation, retry_after

CHARGE_TYPE = "billing.charge.create"
REFUND_TYPE = "billing.refund.create"

# Stripe's statuses, in the vocabulary of SPEC §6 that the reconciler classifies.
_CHARGE_STATUS = {"succeeded": "succeeded", "pending": "processing", "failed": "failed"}
_REFUND_STATUS = {
    "succeeded": "succeeded",
    "pending": "processing",
    "requires_action": "processing",
    "failed": "failed",
    "canceled": "failed",
}
# 409 codes after which Stripe saved no result: another request held the object or the key.
_CONFLICT_NOT_EXECUTED = frozenset({"lock_timeout", "idempotency_key_in_use"})
_MAX_KEY_LENGTH = 255  # Stripe refuses longer idempotency keys
_CONNECT_TIMEOUT = 5.0
_PAGE = 100
_CLOCK_SKEW = timedelta(hours=1)

# The timeout of the call in progress on this thread (the SDK's client has one fixed timeout).
_call_timeout: ContextVar[float | None] = ContextVar("stripe_call_timeout", default=None)
# The status and headers of the last answer on this thread, for an answer the SDK cannot read.
_last_answer: ContextVar[tuple[int, Mapping[str, str]] | None] = ContextVar(
    "stripe_last_answer", default=None
)
# What the SDK raises (beyond StripeError) on an answer it cannot read: an error body that is
# not Stripe's shape, from a proxy or a load balancer in front of the API.
_UNREADABLE = (AttributeError, KeyError, TypeError, ValueError)


class _Session(requests.Session):
    """The adapter's HTTP session: never follows a redirect (a write goes to the configured
    API base or nowhere), each call's own timeout, an optional CA bundle."""

    def __init__(self, ca_bundle: str | None) -> None:
        super().__init__()
        self.ca_bundle = ca_bundle

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        kwargs["allow_redirects"] = False
        timeout = _call_timeout.get()
        if timeout is not None:
            kwargs["timeout"] = (min(timeout, _CONNECT_TIMEOUT), timeout)
        if self.ca_bundle and kwargs.get("verify") is not False:
            kwargs["verify"] = self.ca_bundle
        _last_answer.set(None)
        response = super().request(method, url, *args, **kwargs)
        _last_answer.set((response.status_code, response.headers))
        return response


@contextlib.contextmanager
def _timeout(seconds: float) -> Iterator[None]:
    token = _call_timeout.set(seconds)
    try:
        yield
    finally:
        _call_timeout.reset(token)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _stripe_message(exc: stripe.StripeError) -> str:
    return exc.user_message or str(exc)


def _error_code(exc: stripe.StripeError) -> str:
    """Stripe's error code (``lock_timeout``, ``card_declined``), which the SDK sets only on
    some of its error classes."""
    if exc.code:
        return str(exc.code)
    body = exc.json_body.get("error") if isinstance(exc.json_body, dict) else None
    return str(body.get("code") or "") if isinstance(body, dict) else ""


def _header(exc: stripe.StripeError, name: str) -> str:
    for key, value in (exc.headers or {}).items():
        if key.lower() == name:
            return str(value)
    return ""


def _connect_failed(exc: stripe.APIConnectionError) -> bool:
    """Whether the SDK's network error is certainly a failure to connect (nothing was sent).
    Unsure is False: the request may have left."""
    cause = exc.__cause__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    if not isinstance(cause, requests.exceptions.ConnectionError) or isinstance(
        cause, requests.exceptions.SSLError | requests.exceptions.ProxyError
    ):
        return False
    reason = cause.args[0] if cause.args else None
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    # NewConnectionError (refused, unreachable) and NameResolutionError derive from it.
    return isinstance(reason, urllib3.exceptions.ConnectTimeoutError)


def classify_error(exc: stripe.StripeError) -> CallResult:
    """What one of Stripe's documented errors proves about a write."""
    status, code = exc.http_status, _error_code(exc)
    detail = ", ".join(
        f"{name}={value}" for name, value in (("code", code), ("request", exc.request_id)) if value
    )
    error = f"{_stripe_message(exc)} ({detail})" if detail else _stripe_message(exc)
    if isinstance(exc, stripe.IdempotencyError):
        return CallResult(
            Outcome.UNKNOWN,
            "Stripe holds this idempotency key for other parameters: never confirmed, never resent",
            http_status=status,
            error=error,
            mismatch=True,
        )
    if isinstance(exc, stripe.CardError):
        body = exc.json_body.get("error", {}) if isinstance(exc.json_body, dict) else {}
        decline = body.get("decline_code") or ""
        charge = body.get("charge") or ""
        extra = ", ".join(x for x in (f"decline_code={decline}" if decline else "", charge) if x)
        return CallResult(
            Outcome.REJECTED,
            f"Stripe declined the card: {_stripe_message(exc)}",
            http_status=status,
            error=f"{error} {extra}".strip(),
        )
    if isinstance(exc, stripe.InvalidRequestError):
        return CallResult(
            Outcome.REJECTED,
            f"Stripe refused the request: {_stripe_message(exc)}",
            http_status=status,
            error=error,
        )
    if isinstance(exc, stripe.RateLimitError) or (status == 409 and code in _CONFLICT_NOT_EXECUTED):
        wait = _header(exc, "retry-after")
        later = f"; Retry-After: {wait}" if wait else ""
        return CallResult(
            Outcome.NOT_STARTED,
            f"Stripe turned it away for now (HTTP {status}{', ' + code if code else ''}): "
            f"nothing was executed; sent again later with the same key{later}",
            http_status=status,
            error=error,
            retry_after=retry_after(wait),
        )
    if isinstance(exc, stripe.AuthenticationError | stripe.PermissionError):
        return CallResult(
            Outcome.NOT_STARTED,
            f"Stripe refused the credential (HTTP {status}): nothing was executed",
            http_status=status,
            error=error,
        )
    if isinstance(exc, stripe.APIConnectionError):
        if _connect_failed(exc):
            return CallResult(
                Outcome.NOT_STARTED,
                "could not connect to Stripe: nothing was sent",
                error=_describe(exc.__cause__ or exc),
            )
        timed_out = isinstance(exc.__cause__, requests.exceptions.Timeout)
        return CallResult(
            Outcome.UNKNOWN,
            "timed out after the request was sent"
            if timed_out
            else "the connection failed after the request may have left",
            error=_describe(exc.__cause__ or exc),
        )
    return CallResult(
        Outcome.UNKNOWN,
        f"HTTP {status} from Stripe after the request was sent",
        http_status=status,
        error=error,
    )


def _unreadable_answer(exc: BaseException) -> CallResult:
    """An answer the SDK could not read (not Stripe's error shape): the request was sent and
    answered, so it may have been executed — UNKNOWN, settled by a lookup."""
    answer = _last_answer.get()
    status, headers = answer if answer is not None else (None, {})
    return CallResult(
        Outcome.UNKNOWN,
        f"an answer Stripe's SDK could not read (HTTP {status}) after the request was sent",
        http_status=status,
        error=_describe(exc),
        retry_after=retry_after(headers.get("Retry-After")),
    )


def _metadata(obj: Any) -> dict[str, str]:
    metadata = getattr(obj, "metadata", None)
    return metadata.to_dict() if isinstance(metadata, stripe.StripeObject) else {}


def operation_of(obj: Any) -> ProviderOperation:
    """A charge or refund as a provider operation: the status in SPEC §6's words, the digest
    from its metadata, and what a compensator or a reader needs in ``result``."""
    metadata = _metadata(obj)
    currency = str(obj.currency or "").upper()
    if obj.object == "refund":
        status = _REFUND_STATUS.get(obj.status or "", obj.status or "")
        result = {"refund_id": obj.id, "charge_id": obj.charge, "amount": obj.amount}
    else:
        status = _CHARGE_STATUS.get(obj.status or "", obj.status or "")
        if status == "succeeded" and not obj.captured:
            status = "processing"  # authorised, not captured: not yet the contract's "captured"
        result = {"charge_id": obj.id, "amount": obj.amount, "captured": obj.captured}
    result.update(currency=currency, stripe_status=obj.status)
    if getattr(obj, "livemode", None) is not None:  # charges say; refunds do not
        result["livemode"] = bool(obj.livemode)
    return ProviderOperation(
        id=obj.id,
        status=status,
        payload_digest=metadata.get("payload_digest", ""),
        result=result,
    )


class StripeAdapter:
    """Speaks Stripe's API (Charges and Refunds) to one API base with one credential."""

    def __init__(
        self,
        *,
        api_base: str,
        api_key: str,
        timeout: float = 10.0,
        contract: EffectContract | None = None,
        default_source: str = "",
        charge_customer: bool = False,
        ca_bundle: str | None = None,
        lookup_max_pages: int = 10,
    ) -> None:
        parts = urlsplit(api_base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"api_base must be an http or https URL, not {api_base!r}")
        if not api_key:
            raise ValueError("api_key is empty: configure the Stripe credential")
        if timeout <= 0 or lookup_max_pages < 1:
            raise ValueError("timeout and lookup_max_pages must be positive")
        if contract is not None and contract.type not in (CHARGE_TYPE, REFUND_TYPE):
            raise ValueError(f"the Stripe adapter does not serve {contract.type!r}")
        self.api_base = api_base.rstrip("/")
        self.timeout = timeout
        self.contract = contract
        self.default_source = default_source
        self.charge_customer = charge_customer
        self.lookup_max_pages = lookup_max_pages
        self.completion_statuses = (
            contract.completion_statuses if contract else frozenset({"succeeded"})
        )
        retention = contract.recovery.key_retention if contract else timedelta(days=1)
        self.lookup_window = retention + _CLOCK_SKEW
        self._api_key, self._ca_bundle = api_key, ca_bundle
        self._pid = 0
        self._client: stripe.StripeClient | None = None

    def __repr__(self) -> str:
        return f"StripeAdapter({self.api_base!r})"  # never the key

    @property
    def client(self) -> stripe.StripeClient:
        """This process's client. One made before a fork is not reused after it: its pooled
        connections belong to the parent."""
        if self._client is None or self._pid != os.getpid():
            session = _Session(self._ca_bundle)
            self._client = stripe.StripeClient(
                self._api_key,
                base_addresses={"api": self.api_base},
                max_network_retries=0,
                http_client=stripe.RequestsClient(
                    timeout=(min(self.timeout, _CONNECT_TIMEOUT), self.timeout), session=session
                ),
            )
            self._pid = os.getpid()
        return self._client

    # --- writes -------------------------------------------------------------------------------

    def execute(self, request: ExecuteRequest) -> CallResult:
        if request.type not in (CHARGE_TYPE, REFUND_TYPE):
            return CallResult(
                Outcome.REJECTED, f"the Stripe adapter does not serve {request.type!r}"
            )
        key = request.idempotency_key
        if len(key) > _MAX_KEY_LENGTH or not key.isascii():
            return CallResult(
                Outcome.REJECTED,
                f"the idempotency key is not ASCII or longer than Stripe's {_MAX_KEY_LENGTH} "
                "characters: nothing was sent",
            )
        metadata = {
            "effect_id": request.effect_id,
            "effect_type": request.type,
            "payload_digest": request.payload_digest,
            "idempotency_key": key,
        }
        with _timeout(request.timeout):
            if request.type == CHARGE_TYPE:
                params, refused = self._charge_params(request.payload, metadata), None
                create: Callable[..., Any] = self.client.v1.charges.create
            else:
                params, refused = self._refund_params(request.payload, metadata)
                create = self.client.v1.refunds.create
            if refused is not None:
                return refused
            try:
                obj = create(params=params, options={"idempotency_key": key})
            except stripe.StripeError as exc:
                return classify_error(exc)
            except _UNREADABLE as exc:
                return _unreadable_answer(exc)
        return classify_operation(
            operation_of(obj),
            expected_digest=request.payload_digest,
            completion_statuses=self.completion_statuses,
            http_status=200,
        )

    def _charge_params(self, payload: Mapping[str, Any], metadata: dict[str, str]) -> Any:
        params: dict[str, Any] = {
            "amount": payload["amount"],
            "currency": str(payload["currency"]).lower(),
            "metadata": {**metadata, "customer_id": str(payload.get("customer_id", ""))},
        }
        source = str(payload.get("source") or self.default_source)
        if self.charge_customer:
            params["customer"] = payload["customer_id"]
        if source:
            params["source"] = source
        if payload.get("description"):
            params["description"] = payload["description"]
        return params

    def _refund_params(
        self, payload: Mapping[str, Any], metadata: dict[str, str]
    ) -> tuple[Any, CallResult | None]:
        """The refund's parameters, after reading its charge: a refund names no currency (it
        is the charge's), so a payload in another currency is refused here, before any write.
        Whatever goes wrong in that read, nothing was written: at worst NOT_STARTED."""
        charge_id = payload.get("charge_id")
        if not charge_id:
            return None, CallResult(
                Outcome.REJECTED, "a Stripe refund needs the payload's charge_id: nothing was sent"
            )
        try:
            charge = self.client.v1.charges.retrieve(str(charge_id))
        except stripe.InvalidRequestError as exc:
            return None, classify_error(exc)
        except (stripe.StripeError, *_UNREADABLE) as exc:
            status = exc.http_status if isinstance(exc, stripe.StripeError) else None
            return None, CallResult(
                Outcome.NOT_STARTED,
                f"could not read charge {charge_id} before refunding it: nothing was written",
                http_status=status,
                error=_describe(exc.__cause__ or exc),
            )
        currency = str(payload["currency"]).lower()
        if charge.currency != currency:
            return None, CallResult(
                Outcome.REJECTED,
                f"charge {charge_id} is in {charge.currency.upper()}, the refund in "
                f"{currency.upper()}: nothing was sent",
            )
        reason = str(payload.get("reason", ""))[:500]
        params = {
            "charge": str(charge_id),
            "amount": payload["amount"],
            "metadata": {**metadata, "reason": reason},
        }
        return params, None

    # --- lookups ------------------------------------------------------------------------------

    def lookup(
        self,
        *,
        idempotency_key: str,
        provider_operation_id: str = "",
        timeout: float,
        payload_digest: str = "",
    ) -> LookupResult:
        with _timeout(timeout):
            if provider_operation_id:
                return self._lookup_by_id(provider_operation_id)
            return self._lookup_by_key(idempotency_key)

    def _lookup_by_id(self, operation_id: str) -> LookupResult:
        if operation_id.startswith("ch_"):
            retrieve: Callable[[str], Any] = self.client.v1.charges.retrieve
        elif operation_id.startswith("re_"):
            retrieve = self.client.v1.refunds.retrieve
        else:
            return LookupResult(
                LookupStatus.UNREACHABLE, error=f"{operation_id!r} is not a charge or refund id"
            )
        try:
            obj = retrieve(operation_id)
        except stripe.InvalidRequestError as exc:
            if exc.http_status == 404:
                return LookupResult(LookupStatus.NOT_FOUND, http_status=404, error=str(exc))
            return LookupResult(
                LookupStatus.UNREACHABLE, http_status=exc.http_status, error=str(exc)
            )
        except stripe.StripeError as exc:
            return _unreachable(exc)
        except _UNREADABLE as exc:  # an answer that is not Stripe's: it proves nothing
            return LookupResult(LookupStatus.UNREACHABLE, error=_describe(exc))
        return LookupResult(LookupStatus.FOUND, operation=operation_of(obj), http_status=200)

    def _lookup_by_key(self, key: str) -> LookupResult:
        """The metadata scan of the module docstring: every object of the window, or nothing
        proved."""
        kinds: list[Callable[..., Any]] = []
        kind = self.contract.type if self.contract else None
        if kind in (CHARGE_TYPE, None):
            kinds.append(self.client.v1.charges.list)
        if kind in (REFUND_TYPE, None):
            kinds.append(self.client.v1.refunds.list)
        since = int(time.time() - self.lookup_window.total_seconds())
        found: list[Any] = []
        for list_page in kinds:
            try:
                matches, complete = self._scan(list_page, key, since)
            except stripe.StripeError as exc:
                return _unreachable(exc)
            except _UNREADABLE as exc:  # an answer that is not Stripe's: it proves nothing
                return LookupResult(LookupStatus.UNREACHABLE, error=_describe(exc))
            if not complete:
                return LookupResult(
                    LookupStatus.UNREACHABLE,
                    error=f"more than {self.lookup_max_pages * _PAGE} objects in the key "
                    "retention window: the metadata scan could not see them all",
                )
            found.extend(matches)
        if not found:
            return LookupResult(LookupStatus.NOT_FOUND, http_status=200)
        operation = operation_of(found[0])
        if len(found) > 1:
            ids = ", ".join(obj.id for obj in found)
            operation = ProviderOperation(
                id=operation.id,
                status=operation.status,
                payload_digest=f"ambiguous: {len(found)} objects carry this key ({ids})",
                result=operation.result,
            )
        return LookupResult(LookupStatus.FOUND, operation=operation, http_status=200)

    def _scan(self, list_page: Callable[..., Any], key: str, since: int) -> tuple[list[Any], bool]:
        """(the objects whose metadata names ``key``, whether the whole window was read)."""
        params: dict[str, Any] = {"limit": _PAGE, "created": {"gte": since}}
        matches: list[Any] = []
        for _ in range(self.lookup_max_pages):
            page = list_page(params=params)
            matches += [obj for obj in page.data if _metadata(obj).get("idempotency_key") == key]
            if not page.has_more or not page.data:
                return matches, True
            params["starting_after"] = page.data[-1].id
        return matches, False


def _unreachable(exc: stripe.StripeError) -> LookupResult:
    return LookupResult(
        LookupStatus.UNREACHABLE,
        http_status=exc.http_status,
        error=_describe(exc.__cause__ or exc) if exc.http_status is None else str(exc),
    )


def from_config(config: ProviderConfig) -> StripeAdapter:
    """The Stripe adapter of a ``GATEWAY_PROVIDERS`` entry (``"adapter": "stripe"``): the
    entry's base URL as the API base, its credential as the secret key, and its options
    ``default_source`` (a source for charges whose payload names none, e.g. ``tok_visa`` in
    test mode), ``charge_customer`` and ``lookup_max_pages``. TLS is verified against
    ``GATEWAY_PROVIDER_CA_BUNDLE`` when one is set."""
    options = config.options
    return StripeAdapter(
        api_base=config.base_url,
        api_key=config.credential,
        timeout=config.timeout,
        contract=config.contract,
        default_source=str(options.get("default_source", "")),
        charge_customer=bool(options.get("charge_customer", False)),
        ca_bundle=settings.GATEWAY_PROVIDER_CA_BUNDLE or None,
        lookup_max_pages=int(options.get("lookup_max_pages", 10)),
    )
