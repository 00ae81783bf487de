"""Settings for the Effect Gateway, all from environment variables (SPEC §2).

The defaults run on one machine with nothing else installed, on the production engines:
PostgreSQL and Valkey (Redis) from wheels, data under ``var/``, reached by unix sockets
(``gateway.embedded``; ``manage.py``, ``make demo`` and the test plugin start them). Production
and CI set ``DATABASE_URL`` (PostgreSQL) and ``CELERY_BROKER_URL`` (Redis) to their servers.
"""

import json
import math
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from gateway import embedded

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("GATEWAY_VAR_DIR", BASE_DIR / "var"))


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def env_number(name: str, default: float, *, zero_turns_off: bool = False) -> float:
    """A positive number; with ``zero_turns_off``, 0 too (the setting's "off")."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    if zero_turns_off and value == 0:
        return value
    if value <= 0:
        allowed = "positive, or 0 to turn it off" if zero_turns_off else "positive"
        raise ImproperlyConfigured(f"{name}={raw!r} must be {allowed}")
    return value


def env_int(name: str, default: int, *, zero_turns_off: bool = False) -> int:
    value = env_number(name, default, zero_turns_off=zero_turns_off)
    if value != int(value):
        raise ImproperlyConfigured(f"{name} must be a whole number")
    return int(value)


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "dev-only-insecure-secret-key-never-use-in-production"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if SECRET_KEY == _DEV_SECRET and not DEBUG and env_bool("GATEWAY_PRODUCTION", False):
    raise ImproperlyConfigured("SECRET_KEY must be set in production")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    # ArrayField (gateway.models.AuditBatch) and hash indexes; the ledger is PostgreSQL-only.
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "gateway",
    "reconciliation",
    "sagas",
    "gateway.webhooks",
    "gateway.agent_hooks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Before anything reads the request: NUL, bad charsets, chunked bodies are a 4xx.
    "gateway.input_guard.InputGuardMiddleware",
    # An agent's submission and effect read with a bearer token are served here, without the
    # console's middlewares below nor DRF's request machinery (gateway.api.lane).
    "gateway.api.lane.ApiLaneMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # Locked logins are 429 before any password is checked (gateway.lockout).
    "gateway.lockout.LoginLockoutMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "gateway.urls"
WSGI_APPLICATION = "gateway.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- The ledger database -------------------------------------------------------------------
# PostgreSQL only: row locks (SKIP LOCKED), the append-only triggers and real concurrency are
# what the ledger's guarantees rest on, so there is no second engine to keep equivalent.
_EMBEDDED_RUN_DIR = embedded.socket_dir(VAR_DIR)
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", "") or embedded.database_url(_EMBEDDED_RUN_DIR),
        # 0: a connection per request or task (Django's CONN_MAX_AGE = 0, e.g. behind a pooler).
        conn_max_age=env_int("GATEWAY_DB_CONN_MAX_AGE", 60, zero_turns_off=True),
        # Off by default: the check is a ``SELECT 1`` round trip at the first query of every
        # request (one in four of a submission's round trips). Without it a connection that
        # broke while idle (a PostgreSQL restart) fails the one request that uses it next;
        # Django sees the error and closes it at that request's end, so the thread's next
        # request reconnects. Nothing is lost: the failed request wrote nothing, and a
        # client retrying with its Idempotency-Key gets one effect. Turn it on where idle
        # connections are cut often (a proxy or firewall with a timeout under CONN_MAX_AGE).
        conn_health_checks=env_bool("GATEWAY_DB_HEALTH_CHECKS", False),
    )
}
# The hot statements are prepared on the server: planning them cost PostgreSQL more than
# running them. psycopg prepares a statement at its first execution on a server-side-binding
# cursor (gateway.lib.prepared: the submission, the single claim and record, the sequencer;
# gateway.fastpath_batch: the drainer's claim and record). Django's own cursors bind on the
# client and never prepare, whatever this says. Off (GATEWAY_DB_PREPARE=false, None) behind a
# pooler that cannot keep prepared statements (PgBouncer before 1.21, or without
# max_prepared_statements).
GATEWAY_DB_PREPARE = env_bool("GATEWAY_DB_PREPARE", True)
DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
    0 if GATEWAY_DB_PREPARE else None
)
# A prepared statement's plan is made once per connection, not six times: PostgreSQL's default
# (plan_cache_mode auto) plans the first five executions for their parameters before it
# settles on the generic plan, and these CTEs cost 1-7 ms to plan against 0.1-0.5 ms to run;
# with connections renewed every CONN_MAX_AGE that warm-up was about a third of the server's
# CPU per effect in the bench (docs/reliability.md, "Round 4"). Every prepared statement here
# looks rows up by key or by a partial index, where the generic plan is the one PostgreSQL
# settles on anyway. It touches only prepared statements (ours, and the foreign-key checks'
# cached plans): Django's own cursors bind on the client. Off: GATEWAY_DB_GENERIC_PLANS=false.
GATEWAY_DB_GENERIC_PLANS = env_bool("GATEWAY_DB_GENERIC_PLANS", True)
if GATEWAY_DB_PREPARE and GATEWAY_DB_GENERIC_PLANS:
    _options = DATABASES["default"]["OPTIONS"]
    _options["options"] = " ".join(
        filter(None, [_options.get("options", ""), "-c plan_cache_mode=force_generic_plan"])
    )
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("DATABASE_URL must be a postgres:// URL (PostgreSQL only)")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Serve static files from the app folders too, so `make demo` needs no collectstatic.
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:triage"
LOGOUT_REDIRECT_URL = "console:login"

# --- Security --------------------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
PRODUCTION = env_bool("GATEWAY_PRODUCTION", False)
# Behind a TLS-terminating load balancer: trust its X-Forwarded-Proto, send HSTS, secure cookies.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", PRODUCTION)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", PRODUCTION)
SECURE_HSTS_SECONDS = (
    env_int("SECURE_HSTS_SECONDS", 31_536_000, zero_turns_off=True) if PRODUCTION else 0
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = PRODUCTION
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
if env_bool("GATEWAY_BEHIND_TLS_PROXY", PRODUCTION):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# The console loads only its own files: no inline script or style, no eval (htmx runs with
# allowEval off), nothing framed. /api/docs/ relaxes styles for Swagger UI (gateway/urls.py).
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "object-src": [CSP.NONE],
}
# A command body is small; anything larger is a mistake or an attack.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("GATEWAY_MAX_BODY_BYTES", 64 * 1024)

# --- Cache: per-token throttling counts here. Shared across web nodes when it is Redis.
_CACHE_URL = env_str("GATEWAY_CACHE_URL", "")
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _CACHE_URL}
        if _CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# --- REST framework ------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gateway.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["gateway.api.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "gateway.api.problems.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["gateway.api.auth.TokenRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"token": env_str("GATEWAY_TOKEN_RATE", "6000/min")},
    "UNAUTHENTICATED_USER": None,
}
# Seconds a web process trusts a token (and its principal) it has already looked up; a
# revocation or a freeze reaches every process within this (docs/security.md). 0: no cache.
GATEWAY_TOKEN_CACHE_TTL = env_number("GATEWAY_TOKEN_CACHE_TTL", 5, zero_turns_off=True)
SPECTACULAR_SETTINGS = {
    "TITLE": "Effect Gateway API",
    "DESCRIPTION": "Submit commands, follow effects, approve, reconcile and compensate.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI served from the package, not a CDN: the docs work on a closed network.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {"SagaStateEnum": "sagas.choices.SagaState"},
    # JSON Schema 2020-12 inside (the contracts' payload schemas are written in it), and the
    # per-type command schemas, error answers and list shapes (gateway.api.schema).
    "OAS_VERSION": "3.1.0",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gateway.api.schema.postprocess",
    ],
}

# --- Celery ------------------------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "") or embedded.broker_url(_EMBEDDED_RUN_DIR)
if not CELERY_BROKER_URL.startswith(("redis://", "rediss://", "redis+socket://")):
    raise ImproperlyConfigured("CELERY_BROKER_URL must be a redis:// URL (Redis or Valkey)")
# Redis redelivers an unacknowledged message after this long. It must exceed the longest
# task; a redelivery is harmless anyway (the claim is compare-and-set).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = env_str("GATEWAY_TASK_QUEUE", "celery")
# Recovery (lease recovery, reconciliation, the dispatch sweeper) has a queue of its own, so it
# never waits behind a dispatch backlog; every worker consumes it (gateway.celery).
GATEWAY_RECOVERY_QUEUE = env_str("GATEWAY_RECOVERY_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}.recovery")
CELERY_TASK_ROUTES = {
    name: {"queue": GATEWAY_RECOVERY_QUEUE}
    for name in (
        "reconciliation.tasks.reconcile_due",
        "reconciliation.tasks.recover_leases",
        "reconciliation.tasks.reconcile_effect",
        "gateway.tasks.sweep_dispatch",
    )
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
# Celery's Django fixup closes the database connection around every task unless this is set:
# a new PostgreSQL backend per task (the largest share of a worker's CPU per effect once the
# rest was cheap). Reuse it for this many tasks; gateway/celery.py still retires a connection
# that is broken (a PostgreSQL restart) or older than CONN_MAX_AGE, around every task.
CELERY_DB_REUSE_MAX = env_int("GATEWAY_CELERY_DB_REUSE_MAX", 1000)
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Seconds a prefork child has to report alive before the worker gives up with "Could not
# start worker processes" (Celery's default: 4). On a saturated host that is too short; the
# test suite, which runs real workers beside two pytest processes on two cores, gives 30.
CELERY_WORKER_PROC_ALIVE_TIMEOUT = env_number("GATEWAY_WORKER_PROC_ALIVE_TIMEOUT", 4)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- The gateway ---------------------------------------------------------------------------
GATEWAY_SANDBOX_URL = env_str("GATEWAY_SANDBOX_URL", "http://127.0.0.1:8765")
_PROVIDERS = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")
_default_provider_urls = {name: f"{GATEWAY_SANDBOX_URL}/{name}" for name in _PROVIDERS}
try:
    GATEWAY_PROVIDER_URLS: dict[str, str] = {
        **_default_provider_urls,
        **json.loads(os.environ.get("GATEWAY_PROVIDER_URLS", "{}")),
    }
except json.JSONDecodeError as exc:
    raise ImproperlyConfigured(f"GATEWAY_PROVIDER_URLS is not a JSON object: {exc}") from None
# HMAC secrets of POST /hooks/providers/{name}: JSON object, provider name -> secret.
try:
    GATEWAY_WEBHOOK_SECRETS: dict[str, str] = json.loads(
        os.environ.get("GATEWAY_WEBHOOK_SECRETS", "{}")
    )
except json.JSONDecodeError as exc:
    raise ImproperlyConfigured(f"GATEWAY_WEBHOOK_SECRETS is not a JSON object: {exc}") from None
if not isinstance(GATEWAY_WEBHOOK_SECRETS, dict) or not all(
    isinstance(value, str) and value for value in GATEWAY_WEBHOOK_SECRETS.values()
):
    raise ImproperlyConfigured("GATEWAY_WEBHOOK_SECRETS must map provider names to secrets")
GATEWAY_PROVIDER_TIMEOUT = env_number("GATEWAY_PROVIDER_TIMEOUT", 10)
# The one-statement submission, claim and record of gateway.fastpath (PostgreSQL); off: the
# general path for every effect (same rules, more round trips).
GATEWAY_FAST_PATH = env_bool("GATEWAY_FAST_PATH", True)
# Idempotency keys a web process remembers having written or replayed (gateway.fastpath
# KnownKeys): a resubmission of one is read with one SELECT instead of the insert statement.
# A hint only (the database answers); 0 remembers none.
GATEWAY_REPLAY_MEMO = env_int("GATEWAY_REPLAY_MEMO", 10_000, zero_turns_off=True)
# Seconds a provider connection is kept alive between calls (0: a new connection per call).
GATEWAY_PROVIDER_KEEPALIVE = env_number("GATEWAY_PROVIDER_KEEPALIVE", 5, zero_turns_off=True)
# Connections per provider origin and worker process; a call beyond waits for one, then is
# not sent (NOT_STARTED).
GATEWAY_PROVIDER_POOL_SIZE = env_int("GATEWAY_PROVIDER_POOL_SIZE", 16)
# TLS to providers: the system's CA store unless a bundle (PEM) is named, which is then the
# only one trusted; a client certificate (and its key, unless in the same file) for mTLS.
# Proxies come from HTTPS_PROXY / HTTP_PROXY / NO_PROXY. Redirects are never followed.
GATEWAY_PROVIDER_CA_BUNDLE = env_str("GATEWAY_PROVIDER_CA_BUNDLE", "")
GATEWAY_PROVIDER_CLIENT_CERT = env_str("GATEWAY_PROVIDER_CLIENT_CERT", "")
GATEWAY_PROVIDER_CLIENT_KEY = env_str("GATEWAY_PROVIDER_CLIENT_KEY", "")
for _name, _path in (
    ("GATEWAY_PROVIDER_CA_BUNDLE", GATEWAY_PROVIDER_CA_BUNDLE),
    ("GATEWAY_PROVIDER_CLIENT_CERT", GATEWAY_PROVIDER_CLIENT_CERT),
    ("GATEWAY_PROVIDER_CLIENT_KEY", GATEWAY_PROVIDER_CLIENT_KEY),
):
    if _path and not Path(_path).is_file():
        raise ImproperlyConfigured(f"{_name}: no file at {_path}")
if GATEWAY_PROVIDER_CLIENT_KEY and not GATEWAY_PROVIDER_CLIENT_CERT:
    raise ImproperlyConfigured("GATEWAY_PROVIDER_CLIENT_KEY is set without a CLIENT_CERT")
GATEWAY_DISPATCH_LEASE = env_number("GATEWAY_DISPATCH_LEASE", 60)
# A dispatch may take a send and, after a 5xx, a lookup: two timeouts. A shorter lease would
# let recovery declare a call that is still running UNKNOWN and the reconciler race it.
if GATEWAY_DISPATCH_LEASE <= 2 * GATEWAY_PROVIDER_TIMEOUT:
    raise ImproperlyConfigured(
        f"GATEWAY_DISPATCH_LEASE ({GATEWAY_DISPATCH_LEASE:g}s) must be longer than twice "
        f"GATEWAY_PROVIDER_TIMEOUT ({GATEWAY_PROVIDER_TIMEOUT:g}s)"
    )
GATEWAY_RECONCILE_INTERVAL = env_number("GATEWAY_RECONCILE_INTERVAL", 30)
# How often the tally pass counts the newly sealed audit events into the settled counts of the
# /metrics gauge gateway_effects (reconciliation.tally).
GATEWAY_TALLY_INTERVAL = env_number("GATEWAY_TALLY_INTERVAL", 15)
# How long a PREPARED/NOT_STARTED effect may wait for its task before the sweeper enqueues
# it again (the broker may have lost the message), and how often the sweeper looks.
GATEWAY_REDELIVER_AFTER = env_number("GATEWAY_REDELIVER_AFTER", 30)
# The longest the sweeper waits before re-sending an overdue effect's message (it backs off).
GATEWAY_REDELIVER_MAX = env_number("GATEWAY_REDELIVER_MAX", 300)
GATEWAY_SWEEP_INTERVAL = env_number("GATEWAY_SWEEP_INTERVAL", 5)
# Submissions signal "work is due" instead of a message per effect (gateway.dispatcher): a
# flag in the broker's Redis, held this long at most, stops further signals while a drainer is
# on its way. A drainer claims up to GATEWAY_DISPATCH_BATCH effects per statement and sends
# them on GATEWAY_DISPATCH_CALLS threads per worker process.
GATEWAY_DUE_FLAG_TTL = env_number("GATEWAY_DUE_FLAG_TTL", 1)
GATEWAY_DISPATCH_BATCH = env_int("GATEWAY_DISPATCH_BATCH", 16)
GATEWAY_DISPATCH_CALLS = env_int("GATEWAY_DISPATCH_CALLS", 16)
# Threads per worker process (per child with prefork) that wait for the flag's wake-ups and
# drain: the submissions' signal reaches them without a broker message. One is enough (its
# window and the call threads carry the concurrency; other processes share a backlog), and
# more would widen what a crash-looping worker strands per life: one effect per drainer (a
# fresh worker's window is one claimed effect, gateway.dispatcher._Window).
GATEWAY_DRAINERS = env_int("GATEWAY_DRAINERS", 1, zero_turns_off=True)
# Re-dispatches of a NOT_STARTED effect with the same key, and the first backoff.
GATEWAY_MAX_DISPATCH_ATTEMPTS = env_int("GATEWAY_MAX_DISPATCH_ATTEMPTS", 5)
GATEWAY_RETRY_BACKOFF = env_number("GATEWAY_RETRY_BACKOFF", 2)
# First wait before an UNKNOWN / IN_PROGRESS effect is looked up; doubles per lookup.
GATEWAY_RECONCILE_BACKOFF = env_number("GATEWAY_RECONCILE_BACKOFF", 5)
GATEWAY_MAX_WAIT = env_number("GATEWAY_MAX_WAIT", 30)
# Tokens and logins (gateway.tokens, gateway.lockout, gateway.metrics_access).
GATEWAY_AGENT_TOKEN_TTL = env_int("GATEWAY_AGENT_TOKEN_TTL", 90 * 24 * 3600, zero_turns_off=True)
GATEWAY_LOGIN_MAX_FAILURES = env_int("GATEWAY_LOGIN_MAX_FAILURES", 5)
GATEWAY_LOGIN_LOCKOUT = env_int("GATEWAY_LOGIN_LOCKOUT", 15 * 60)
GATEWAY_METRICS_TOKEN = env_str("GATEWAY_METRICS_TOKEN", "")
# Long polls (gateway.api.waits): below the web process's threads, so some stay free.
GATEWAY_MAX_WAITS_PER_TOKEN = env_int("GATEWAY_MAX_WAITS_PER_TOKEN", 4)
GATEWAY_MAX_WAITS_PER_PROCESS = env_int("GATEWAY_MAX_WAITS_PER_PROCESS", 4)
# An approval is good for one command, for this long: dispatched later, it is asked again.
GATEWAY_APPROVAL_TTL = env_number("GATEWAY_APPROVAL_TTL", 3600)
GATEWAY_VAULT_KEY = os.environ.get("GATEWAY_VAULT_KEY", "")

# Outgoing webhooks (gateway.webhooks) and agent hooks (gateway.agent_hooks).
GATEWAY_WEBHOOK_TIMEOUT = env_number("GATEWAY_WEBHOOK_TIMEOUT", 10)
GATEWAY_WEBHOOK_BACKOFF = env_number("GATEWAY_WEBHOOK_BACKOFF", 5)
GATEWAY_WEBHOOK_MAX_ATTEMPTS = env_int("GATEWAY_WEBHOOK_MAX_ATTEMPTS", 12)
GATEWAY_WEBHOOK_SWEEP_INTERVAL = env_number("GATEWAY_WEBHOOK_SWEEP_INTERVAL", 5)
GATEWAY_WEBHOOK_ALLOW_HTTP = env_bool("GATEWAY_WEBHOOK_ALLOW_HTTP", False)
# Receivers on private, loopback or link-local addresses (SSRF guard): refused in production.
GATEWAY_WEBHOOK_ALLOW_PRIVATE = env_bool("GATEWAY_WEBHOOK_ALLOW_PRIVATE", not PRODUCTION)
GATEWAY_CONSOLE_URL = env_str("GATEWAY_CONSOLE_URL", "")

# How long an active saga may go without news before the sweeper advances it again.
GATEWAY_SAGA_QUIET_AFTER = env_number("GATEWAY_SAGA_QUIET_AFTER", 60)

# Signed checkpoints of the audit chains (gateway.checkpoints): a key the database never
# holds (32 bytes, base64; generated under var/ in development) and an append-only place.
GATEWAY_AUDIT_SIGNING_KEY = env_str("GATEWAY_AUDIT_SIGNING_KEY", "")
if PRODUCTION and not GATEWAY_AUDIT_SIGNING_KEY:
    # Refused at start, not at the first receipt: every receipt is sealed with it.
    raise ImproperlyConfigured("GATEWAY_AUDIT_SIGNING_KEY must be set in production")
GATEWAY_CHECKPOINT_DIR = env_str("GATEWAY_CHECKPOINT_DIR", str(VAR_DIR / "checkpoints"))
GATEWAY_CHECKPOINT_INTERVAL = env_number("GATEWAY_CHECKPOINT_INTERVAL", 300)
# The audit sequencer: how often it seals committed events into the chain, how many per
# transaction, and into how many tenant shards the work is split (one beat entry each).
GATEWAY_AUDIT_SEAL_INTERVAL = env_number("GATEWAY_AUDIT_SEAL_INTERVAL", 0.5)
GATEWAY_AUDIT_SEAL_BATCH = env_int("GATEWAY_AUDIT_SEAL_BATCH", 1000)
GATEWAY_AUDIT_SHARDS = env_int("GATEWAY_AUDIT_SHARDS", 1)
# A queue of its own for the sequencer (workers must consume it too: -Q celery,audit), so
# that a seal pass never waits behind a deep dispatch queue; empty: the default queue.
GATEWAY_AUDIT_QUEUE = env_str("GATEWAY_AUDIT_QUEUE", "")

CELERY_BEAT_SCHEDULE = {
    "recover-leases": {
        "task": "reconciliation.tasks.recover_leases",
        "schedule": timedelta(seconds=GATEWAY_SWEEP_INTERVAL),
    },
    "sweep-dispatch": {
        "task": "gateway.tasks.sweep_dispatch",
        "schedule": timedelta(seconds=GATEWAY_SWEEP_INTERVAL),
    },
    "reconcile": {
        "task": "reconciliation.tasks.reconcile_due",
        "schedule": timedelta(seconds=GATEWAY_RECONCILE_INTERVAL),
    },
    "tally-effects": {
        "task": "reconciliation.tasks.tally_effects",
        "schedule": timedelta(seconds=GATEWAY_TALLY_INTERVAL),
        # A pass that waited longer than two intervals is superseded by the next one.
        "options": {"expires": 2 * GATEWAY_TALLY_INTERVAL},
    },
    "sweep-sagas": {
        "task": "sagas.tasks.sweep_sagas",
        "schedule": timedelta(seconds=GATEWAY_SWEEP_INTERVAL),
    },
    "sweep-webhooks": {
        "task": "gateway.webhooks.tasks.sweep_webhooks",
        "schedule": timedelta(seconds=GATEWAY_WEBHOOK_SWEEP_INTERVAL),
    },
    "audit-checkpoints": {
        "task": "gateway.tasks.write_audit_checkpoints",
        "schedule": timedelta(seconds=GATEWAY_CHECKPOINT_INTERVAL),
    },
    **{
        f"seal-audit-{shard}": {
            "task": "gateway.tasks.seal_audit",
            "schedule": timedelta(seconds=GATEWAY_AUDIT_SEAL_INTERVAL),
            "args": (shard, GATEWAY_AUDIT_SHARDS),
            # A pass that waited longer than two intervals is superseded by the next one.
            "options": {
                "expires": 2 * GATEWAY_AUDIT_SEAL_INTERVAL,
                **({"queue": GATEWAY_AUDIT_QUEUE} if GATEWAY_AUDIT_QUEUE else {}),
            },
        }
        for shard in range(GATEWAY_AUDIT_SHARDS)
    },
}

# --- Logging: one JSON object a line, never a payload ---------------------------------------
# LOG_FORMAT=text is for people (the demo): time, level, message and the record's fields.
# LOG_TRANSITIONS_LEVEL keeps the one line per effect / saga state change when LOG_LEVEL
# quiets everything else (the demo runs with WARNING + INFO).
_LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
_TRANSITIONS_LEVEL = env_str("LOG_TRANSITIONS_LEVEL", _LOG_LEVEL)
_LOG_FORMAT = env_str("LOG_FORMAT", "json")
if _LOG_FORMAT not in {"json", "text"}:
    raise ImproperlyConfigured(f"LOG_FORMAT={_LOG_FORMAT!r}: use json or text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
        "text": {"()": "gateway.embedded.logs.TextFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": _LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": _LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # runserver's request lines: one per static file is noise below INFO.
        "django.server": {"level": _LOG_LEVEL},
        "gateway.services": {"level": _TRANSITIONS_LEVEL},
        "sagas.services": {"level": _TRANSITIONS_LEVEL},
    },
}
