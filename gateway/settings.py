"""Settings for the Effect Gateway, all from environment variables (SPEC §2).

The defaults run on one machine with nothing else installed, on the production engines:
PostgreSQL and Valkey (Redis) from wheels, data under ``var/``, reached by unix sockets
(``gateway.embedded``; ``manage.py``, ``make demo`` and the test plugin start them). Production
and CI set ``DATABASE_URL`` (PostgreSQL) and ``CELERY_BROKER_URL`` (Redis) to their servers.
"""

from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
import effect_gateway_client
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from gateway import embedded
from gateway.lib.client_ip import parse_networks
from gateway.lib.env import (
    env_bool,
    env_int,
    env_json_object,
    env_list,
    env_names,
    env_number,
    env_section,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

env_section("Django and the process")
VAR_DIR = Path(
    env_str(
        "GATEWAY_VAR_DIR",
        str(BASE_DIR / "var"),
        shown="`var/` in the checkout",
        doc="Where the embedded PostgreSQL and Valkey keep their data and sockets, and where "
        "development keys, checkpoints and the demo's files go.",
    )
)
DEBUG = env_bool(
    "DEBUG", False, doc="Django's debug mode (tracebacks in error pages); never in production."
)
PRODUCTION = env_bool(
    "GATEWAY_PRODUCTION",
    False,
    doc="Production mode: refuse development secrets (`SECRET_KEY`, `GATEWAY_VAULT_KEY`, "
    "`GATEWAY_AUDIT_SIGNING_KEY` must be set), send HSTS and secure cookies, trust the TLS "
    "proxy's `X-Forwarded-Proto`, refuse webhook receivers on private addresses.",
)
_DEV_SECRET = "dev-only-insecure-secret-key-never-use-in-production"
SECRET_KEY = env_str(
    "SECRET_KEY",
    _DEV_SECRET,
    shown="a development-only key",
    doc="Django's secret key (sessions, CSRF, signing). Required with "
    "`GATEWAY_PRODUCTION=true` (unless `DEBUG`).",
)
if SECRET_KEY == _DEV_SECRET and not DEBUG and PRODUCTION:
    raise ImproperlyConfigured("SECRET_KEY must be set in production")
ALLOWED_HOSTS = env_list(
    "ALLOWED_HOSTS",
    ["127.0.0.1", "localhost", "[::1]", "testserver"],
    doc="Host names this gateway answers to (Django's `ALLOWED_HOSTS`), comma-separated.",
)

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
    # Failed logins, counted per (username, address) in the database (gateway.logins).
    "axes",
    # The OAuth 2.1 authorization server of remote MCP clients (gateway.oauth).
    "oauth2_provider",
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
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    # Turns a login refused by the lockout into the 429 page (gateway.console.auth.locked_out).
    "axes.middleware.AxesMiddleware",
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
env_section("The ledger database")
# PostgreSQL only: row locks (SKIP LOCKED), the append-only triggers and real concurrency are
# what the ledger's guarantees rest on, so there is no second engine to keep equivalent.
_EMBEDDED_RUN_DIR = embedded.socket_dir(VAR_DIR)
DATABASES = {
    "default": dj_database_url.parse(
        env_str(
            "DATABASE_URL",
            "",
            shown="the embedded PostgreSQL, data in `var/postgres/`",
            doc="The ledger database: a `postgres://` URL (PostgreSQL only).",
        )
        or embedded.database_url(_EMBEDDED_RUN_DIR),
        # 0: a connection per request or task (Django's CONN_MAX_AGE = 0, e.g. behind a pooler).
        conn_max_age=env_int(
            "GATEWAY_DB_CONN_MAX_AGE",
            60,
            zero_turns_off=True,
            doc="Seconds a process keeps its database connection (Django's `CONN_MAX_AGE`); "
            "0: a connection per request or task (behind a pooler, say).",
        ),
        # Off by default: the check is a ``SELECT 1`` round trip at the first query of every
        # request (one in four of a submission's round trips). Without it a connection that
        # broke while idle (a PostgreSQL restart) fails the one request that uses it next;
        # Django sees the error and closes it at that request's end, so the thread's next
        # request reconnects. Nothing is lost: the failed request wrote nothing, and a
        # client retrying with its Idempotency-Key gets one effect. Turn it on where idle
        # connections are cut often (a proxy or firewall with a timeout under CONN_MAX_AGE).
        conn_health_checks=env_bool(
            "GATEWAY_DB_HEALTH_CHECKS",
            False,
            doc="Check a kept connection with a `SELECT 1` before its first query of each "
            "request; turn it on where idle connections are cut often (a proxy or firewall "
            "with a timeout under `GATEWAY_DB_CONN_MAX_AGE`).",
        ),
    )
}
# The hot statements are prepared on the server: planning them cost PostgreSQL more than
# running them. psycopg prepares a statement at its first execution on a server-side-binding
# cursor (gateway.lib.prepared: the submission, the single claim and record, the sequencer;
# gateway.fastpath_batch: the drainer's claim and record). Django's own cursors bind on the
# client and never prepare, whatever this says. Off (GATEWAY_DB_PREPARE=false, None) behind a
# pooler that cannot keep prepared statements (PgBouncer before 1.21, or without
# max_prepared_statements).
GATEWAY_DB_PREPARE = env_bool(
    "GATEWAY_DB_PREPARE",
    True,
    doc="Prepare the hot statements (the submission, the drainer's claim and record, the "
    "sequencer's) once per database connection. Off behind a pooler that cannot keep "
    "protocol-level prepared statements (PgBouncer before 1.21).",
)
DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
    0 if GATEWAY_DB_PREPARE else None
)
# A prepared statement's plan is made once per connection, not six times: PostgreSQL's default
# (plan_cache_mode auto) plans the first five executions for their parameters before it
# settles on the generic plan, and these CTEs cost 1-7 ms to plan against 0.1-0.5 ms to run;
# with connections renewed every CONN_MAX_AGE that warm-up was about a third of the server's
# CPU per effect in the bench. Every prepared statement here
# looks rows up by key or by a partial index, where the generic plan is the one PostgreSQL
# settles on anyway. It touches only prepared statements (ours, and the foreign-key checks'
# cached plans): Django's own cursors bind on the client. Off: GATEWAY_DB_GENERIC_PLANS=false.
GATEWAY_DB_GENERIC_PLANS = env_bool(
    "GATEWAY_DB_GENERIC_PLANS",
    True,
    doc="Plan each prepared statement once per connection (PostgreSQL's "
    "`plan_cache_mode=force_generic_plan`), not five times for its parameters first.",
)
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

# django-axes' backend refuses a locked (username, address) before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:triage"
LOGOUT_REDIRECT_URL = "console:login"

# --- Security --------------------------------------------------------------------------------
env_section("Security")
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Behind a TLS-terminating load balancer: trust its X-Forwarded-Proto, send HSTS, secure cookies.
SESSION_COOKIE_SECURE = env_bool(
    "SESSION_COOKIE_SECURE",
    PRODUCTION,
    shown="= `GATEWAY_PRODUCTION`",
    doc="Send the session cookie over HTTPS only.",
)
CSRF_COOKIE_SECURE = env_bool(
    "CSRF_COOKIE_SECURE",
    PRODUCTION,
    shown="= `GATEWAY_PRODUCTION`",
    doc="Send the CSRF cookie over HTTPS only.",
)
# Read in every mode, so that a malformed value fails in development too.
_HSTS_SECONDS = env_int(
    "SECURE_HSTS_SECONDS",
    31_536_000,
    zero_turns_off=True,
    doc="HSTS max-age in seconds, sent only with `GATEWAY_PRODUCTION=true` (with "
    "includeSubDomains).",
)
SECURE_HSTS_SECONDS = _HSTS_SECONDS if PRODUCTION else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = PRODUCTION
SECURE_SSL_REDIRECT = env_bool(
    "SECURE_SSL_REDIRECT", False, doc="Redirect plain HTTP requests to HTTPS (Django's)."
)
if env_bool(
    "GATEWAY_BEHIND_TLS_PROXY",
    PRODUCTION,
    shown="= `GATEWAY_PRODUCTION`",
    doc="Behind a TLS-terminating proxy: trust its `X-Forwarded-Proto: https`.",
):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
CSRF_TRUSTED_ORIGINS = env_list(
    "CSRF_TRUSTED_ORIGINS",
    [],
    doc="Origins (`https://gateway.example.com`) trusted for the console's unsafe requests "
    "(Django's `CSRF_TRUSTED_ORIGINS`), comma-separated.",
)
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
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int(
    "GATEWAY_MAX_BODY_BYTES", 64 * 1024, doc="The largest request body, in bytes."
)

env_section("The API and tokens")
# --- Cache: per-token throttling counts here. Shared across web nodes when it is Redis.
_CACHE_URL = env_str(
    "GATEWAY_CACHE_URL",
    "",
    shown="per-process memory",
    doc="A shared cache (`redis://…`) for per-token throttling across web nodes.",
)
CACHES = {
    "default": (
        # Falls back to per-process counts while Redis is down (gateway/lib/cache.py).
        {"BACKEND": "gateway.lib.cache.DegradingRedisCache", "LOCATION": _CACHE_URL}
        if _CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# --- REST framework ------------------------------------------------------------------------
_TOKEN_RATE = env_str(
    "GATEWAY_TOKEN_RATE",
    "6000/min",
    doc="Requests per token (DRF throttle rate: `N/s`, `N/min`, `N/hour`, `N/day`).",
)
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
    "DEFAULT_THROTTLE_RATES": {"token": _TOKEN_RATE},
    "UNAUTHENTICATED_USER": None,
}
# Seconds a web process trusts a token (and its principal) it has already looked up; a
# revocation or a freeze reaches every process within this (docs/security.md). 0: no cache.
GATEWAY_TOKEN_CACHE_TTL = env_number(
    "GATEWAY_TOKEN_CACHE_TTL",
    5,
    zero_turns_off=True,
    doc="Seconds a web process trusts a token (and its principal and grants) it has already "
    "looked up; a revocation or a freeze reaches every process within it. 0: no cache.",
)
SPECTACULAR_SETTINGS = {
    "TITLE": "Effect Gateway API",
    "DESCRIPTION": "Submit commands, follow effects, approve, reconcile and compensate.",
    # One version for the API, the Python and TypeScript clients and the MCP server.
    "VERSION": effect_gateway_client.__version__,
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
env_section("Workers and the broker")
CELERY_BROKER_URL = env_str(
    "CELERY_BROKER_URL",
    "",
    shown="the embedded Valkey, its socket under `var/run/`",
    doc="The broker: a `redis://` URL (Redis or Valkey).",
) or embedded.broker_url(_EMBEDDED_RUN_DIR)
if not CELERY_BROKER_URL.startswith(("redis://", "rediss://", "redis+socket://")):
    raise ImproperlyConfigured("CELERY_BROKER_URL must be a redis:// URL (Redis or Valkey)")
# Redis redelivers an unacknowledged message after this long. It must exceed the longest
# task; a redelivery is harmless anyway (the claim is compare-and-set).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = env_str(
    "GATEWAY_TASK_QUEUE", "celery", doc="The Celery queue of dispatch and the other tasks."
)
# Recovery (lease recovery, reconciliation, the dispatch sweeper) has a queue of its own, so it
# never waits behind a dispatch backlog; every worker consumes it (gateway.celery).
GATEWAY_RECOVERY_QUEUE = env_str(
    "GATEWAY_RECOVERY_QUEUE",
    f"{CELERY_TASK_DEFAULT_QUEUE}.recovery",
    shown="`<GATEWAY_TASK_QUEUE>.recovery`",
    doc="The queue of lease recovery, reconciliation and the dispatch sweeper; every worker "
    "consumes it.",
)
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
CELERY_DB_REUSE_MAX = env_int(
    "GATEWAY_CELERY_DB_REUSE_MAX",
    1000,
    doc="Tasks a worker runs on one database connection before it opens a new one.",
)
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Seconds a prefork child has to report alive before the worker gives up with "Could not
# start worker processes" (Celery's default: 4). On a saturated host that is too short; the
# test suite, which runs real workers beside two pytest processes on two cores, gives 30.
CELERY_WORKER_PROC_ALIVE_TIMEOUT = env_number(
    "GATEWAY_WORKER_PROC_ALIVE_TIMEOUT",
    4,
    doc='Seconds a prefork child has to start before the worker gives up ("Could not start '
    "worker processes\"); raise it on a saturated host. 4 is Celery's own.",
)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- The gateway ---------------------------------------------------------------------------
env_section("Providers")
GATEWAY_CONTRACT_MODULES = env_names(
    "GATEWAY_CONTRACT_MODULES",
    ["gateway.contracts.demo"],
    doc="Contract modules to load (docs/guides/effect-types.md): comma-separated or a JSON "
    "list; the shipped demo pack by default. A team's module adds its effect types and "
    "adapters without changing the product.",
)
GATEWAY_SANDBOX_URL = env_str(
    "GATEWAY_SANDBOX_URL",
    "http://127.0.0.1:8765",
    doc="The sandbox provider's base URL: every provider not named in "
    "`GATEWAY_PROVIDER_URLS` is reached at `<this>/<provider>`.",
)
_PROVIDERS = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")
_default_provider_urls = {name: f"{GATEWAY_SANDBOX_URL}/{name}" for name in _PROVIDERS}
GATEWAY_PROVIDER_URLS: dict[str, str] = {
    **_default_provider_urls,
    **env_json_object(
        "GATEWAY_PROVIDER_URLS",
        shown="each provider on the sandbox at `GATEWAY_SANDBOX_URL`",
        doc="JSON: provider name → base URL of a server speaking the provider protocol.",
    ),
}
# Providers as real systems (gateway.providers.config): provider name -> {"adapter", "base_url",
# "timeout", "credential": {"env": NAME} | {"file": PATH}, "options"}. Checked at start-up
# (manage.py check, gateway.checks); a provider it does not name keeps GATEWAY_PROVIDER_URLS.
GATEWAY_PROVIDERS: dict[str, Any] = env_json_object(
    "GATEWAY_PROVIDERS",
    shown="none: every provider speaks the provider protocol at its `GATEWAY_PROVIDER_URLS` entry",
    doc='JSON: provider name → `{"adapter", "base_url", "timeout", "credential", "options"}` '
    "(docs/guides/connect-a-provider.md). `adapter`: `http`, `stripe`, `rest` or a factory's "
    'dotted path; `credential`: `{"env": "NAME"}` or `{"file": "/path"}`, never the secret '
    "itself. Overrides a contract module's adapter for the providers it names.",
)
# HMAC secrets of POST /hooks/providers/{name}: JSON object, provider name -> secret.
GATEWAY_WEBHOOK_SECRETS: dict[str, str] = env_json_object(
    "GATEWAY_WEBHOOK_SECRETS",
    shown="none: provider webhooks are refused",
    doc="JSON: provider name → HMAC secret of its receipts at `POST /hooks/providers/{name}`.",
)
if not all(isinstance(value, str) and value for value in GATEWAY_WEBHOOK_SECRETS.values()):
    raise ImproperlyConfigured("GATEWAY_WEBHOOK_SECRETS must map provider names to secrets")
GATEWAY_PROVIDER_TIMEOUT = env_number(
    "GATEWAY_PROVIDER_TIMEOUT", 10, doc="Seconds before a provider call counts as timed out."
)
# The circuit breaker of every provider (gateway.providers.protection); a GATEWAY_PROVIDERS
# entry's "circuit" overrides them for its provider.
GATEWAY_CIRCUIT_FAILURES = env_int(
    "GATEWAY_CIRCUIT_FAILURES",
    5,
    doc="Failures in a row (no connection, or a 5xx) after which a provider's "
    "circuit opens: no new sends until a probe succeeds. Effects wait; none fails for it.",
)
GATEWAY_CIRCUIT_OPEN_SECONDS = env_number(
    "GATEWAY_CIRCUIT_OPEN_SECONDS",
    10,
    doc="Seconds an open circuit stays open before one probe call is let through.",
)
# The one-statement submission, claim and record of gateway.fastpath (PostgreSQL); off: the
# general path for every effect (same rules, more round trips).
GATEWAY_FAST_PATH = env_bool(
    "GATEWAY_FAST_PATH",
    True,
    doc="Submit, claim and record with one SQL statement each (`gateway.fastpath`); off: the "
    "general path for every effect (the same rules, more round trips).",
)
# Idempotency keys a web process remembers having written or replayed (gateway.fastpath
# KnownKeys): a resubmission of one is read with one SELECT instead of the insert statement.
GATEWAY_REPLAY_MEMO = env_int(
    "GATEWAY_REPLAY_MEMO",
    10_000,
    zero_turns_off=True,
    doc="Idempotency keys a web process remembers having written or replayed: a resubmission "
    "of one is read with one `SELECT`, not the insert statement (a hint; the database "
    "answers). 0: remember none.",
)
GATEWAY_PROVIDER_KEEPALIVE = env_number(
    "GATEWAY_PROVIDER_KEEPALIVE",
    5,
    zero_turns_off=True,
    doc="Seconds a provider connection is kept alive between calls; 0: a new connection per call.",
)

GATEWAY_PROVIDER_POOL_SIZE = env_int(
    "GATEWAY_PROVIDER_POOL_SIZE",
    16,
    doc="Connections per provider origin and worker process; a call beyond waits for one, "
    "then is not sent (NOT_STARTED).",
)
# TLS to providers: the system's CA store unless a bundle (PEM) is named, which is then the
# only one trusted; a client certificate (and its key, unless in the same file) for mTLS.
# Proxies come from HTTPS_PROXY / HTTP_PROXY / NO_PROXY. Redirects are never followed.
GATEWAY_PROVIDER_CA_BUNDLE = env_str(
    "GATEWAY_PROVIDER_CA_BUNDLE",
    "",
    shown="the system's CA store",
    doc="A PEM file of the only CAs trusted for provider TLS.",
)
GATEWAY_PROVIDER_CLIENT_CERT = env_str(
    "GATEWAY_PROVIDER_CLIENT_CERT",
    "",
    shown="none",
    doc="A client certificate (PEM) for providers that require mTLS; with its key unless "
    "`GATEWAY_PROVIDER_CLIENT_KEY` names one.",
)
GATEWAY_PROVIDER_CLIENT_KEY = env_str(
    "GATEWAY_PROVIDER_CLIENT_KEY",
    "",
    shown="none",
    doc="The key of `GATEWAY_PROVIDER_CLIENT_CERT`, in a file of its own.",
)
for _name, _path in (
    ("GATEWAY_PROVIDER_CA_BUNDLE", GATEWAY_PROVIDER_CA_BUNDLE),
    ("GATEWAY_PROVIDER_CLIENT_CERT", GATEWAY_PROVIDER_CLIENT_CERT),
    ("GATEWAY_PROVIDER_CLIENT_KEY", GATEWAY_PROVIDER_CLIENT_KEY),
):
    if _path and not Path(_path).is_file():
        raise ImproperlyConfigured(f"{_name}: no file at {_path}")
if GATEWAY_PROVIDER_CLIENT_KEY and not GATEWAY_PROVIDER_CLIENT_CERT:
    raise ImproperlyConfigured("GATEWAY_PROVIDER_CLIENT_KEY is set without a CLIENT_CERT")

env_section("Dispatch and recovery")
GATEWAY_DISPATCH_LEASE = env_number(
    "GATEWAY_DISPATCH_LEASE",
    60,
    doc="Seconds a DISPATCHING claim lives before lease recovery makes it UNKNOWN; must exceed "
    "twice `GATEWAY_PROVIDER_TIMEOUT` (checked at start).",
)
# A dispatch may take a send and, after a 5xx, a lookup: two timeouts. A shorter lease would
# let recovery declare a call that is still running UNKNOWN and the reconciler race it.
if GATEWAY_DISPATCH_LEASE <= 2 * GATEWAY_PROVIDER_TIMEOUT:
    raise ImproperlyConfigured(
        f"GATEWAY_DISPATCH_LEASE ({GATEWAY_DISPATCH_LEASE:g}s) must be longer than twice "
        f"GATEWAY_PROVIDER_TIMEOUT ({GATEWAY_PROVIDER_TIMEOUT:g}s)"
    )
GATEWAY_RECONCILE_INTERVAL = env_number(
    "GATEWAY_RECONCILE_INTERVAL",
    30,
    doc="Seconds between the reconciler's sweeps, a safety net: the wakers act at each "
    "effect's due time.",
)
# The reconciler and lease recovery act at their deadlines (reconciliation.waker, woken
# through gateway.deadlines); the beat sweeps above stay as a safety net.
GATEWAY_WAKERS = env_int(
    "GATEWAY_WAKERS",
    1,
    zero_turns_off=True,
    doc="Waker threads per worker process (per child with prefork) that run lease recovery "
    "and the reconciler's lookups when the earliest lease or `next_check_at` is due; 0: none "
    "(only the sweeps).",
)
GATEWAY_WAKER_MAX_SLEEP = env_number(
    "GATEWAY_WAKER_MAX_SLEEP",
    5,
    doc="The longest a waker sleeps before it looks at the due times again, whatever it was "
    "told: the bound on a lost wake-up.",
)
GATEWAY_ROLLUP_INTERVAL = env_number(
    "GATEWAY_ROLLUP_INTERVAL",
    60,
    doc="Seconds between roll-up passes, which count the last minutes of the ledger into the "
    "console dashboard's per-minute and per-hour aggregates (gateway.rollup).",
)
GATEWAY_TALLY_INTERVAL = env_number(
    "GATEWAY_TALLY_INTERVAL",
    15,
    doc="Seconds between tally passes, which count newly sealed audit events into the settled "
    "counts of the `/metrics` gauge `gateway_effects`.",
)
# The broker may have lost a PREPARED/NOT_STARTED effect's message: the sweeper sends it again.
GATEWAY_REDELIVER_AFTER = env_number(
    "GATEWAY_REDELIVER_AFTER",
    30,
    doc="Seconds a PREPARED or NOT_STARTED effect may wait for its task before the sweeper "
    "enqueues it again.",
)
GATEWAY_REDELIVER_MAX = env_number(
    "GATEWAY_REDELIVER_MAX",
    300,
    doc="The longest the sweeper waits before re-sending an overdue effect (it backs off: as "
    "long as the effect has waited).",
)
GATEWAY_SWEEP_INTERVAL = env_number(
    "GATEWAY_SWEEP_INTERVAL",
    5,
    doc="Seconds between the sweeps of lease recovery, dispatch and sagas.",
)
# Submissions signal "work is due" instead of a message per effect (gateway.dispatcher): a
# flag in the broker's Redis, held this long at most, stops further signals while a drainer is
# on its way. A drainer claims up to GATEWAY_DISPATCH_BATCH effects per statement and sends
# them on GATEWAY_DISPATCH_CALLS threads per worker process.
GATEWAY_DUE_FLAG_TTL = env_number(
    "GATEWAY_DUE_FLAG_TTL",
    1,
    doc='Seconds the "dispatch work is due" flag stands at most; while it stands, '
    "submissions wake no drainer.",
)
GATEWAY_DISPATCH_BATCH = env_int(
    "GATEWAY_DISPATCH_BATCH",
    16,
    doc="The most effects one drainer has claimed and not yet answered.",
)
GATEWAY_DISPATCH_CALLS = env_int(
    "GATEWAY_DISPATCH_CALLS", 16, doc="Provider call threads per worker process."
)
# One drainer is enough (its window and the call threads carry the concurrency; other
# processes share a backlog), and more would widen what a crash-looping worker strands per
# life: one effect per drainer (a fresh worker's window is one claimed effect,
# gateway.dispatcher._Window).
GATEWAY_DRAINERS = env_int(
    "GATEWAY_DRAINERS",
    1,
    zero_turns_off=True,
    doc="Drainer threads per worker process (per child with prefork) that answer the "
    "submissions' wake-ups; 0: none (only the sweeper sends).",
)
GATEWAY_MAX_DISPATCH_ATTEMPTS = env_int(
    "GATEWAY_MAX_DISPATCH_ATTEMPTS",
    5,
    doc="Re-dispatches of a NOT_STARTED effect with the same key (contracts may set their "
    "own budget).",
)
GATEWAY_RETRY_BACKOFF = env_number(
    "GATEWAY_RETRY_BACKOFF",
    2,
    doc="Seconds before the first re-dispatch of a NOT_STARTED effect; doubles per attempt.",
)
GATEWAY_RECONCILE_BACKOFF = env_number(
    "GATEWAY_RECONCILE_BACKOFF",
    5,
    doc="Seconds before an UNKNOWN or IN_PROGRESS effect is first looked up; doubles per lookup.",
)
GATEWAY_APPROVAL_TTL = env_number(
    "GATEWAY_APPROVAL_TTL",
    3600,
    doc="Seconds an approval stays good for its one command: dispatched later, it is asked again.",
)

env_section("Signed approvals")
GATEWAY_SIGNED_APPROVAL_CLASSES = [
    name
    for name in env_list(
        "GATEWAY_SIGNED_APPROVAL_CLASSES",
        ["financial_write", "irreversible"],
        doc="Effect classes whose approvals must be signed by the approver's own key (a "
        "passkey, or a machine's Ed25519 key): contract `effect_class` values, and "
        "`irreversible` for contracts that declare it; `none`: no class.",
    )
    if name != "none"
]
GATEWAY_SIGNED_APPROVAL_REQUIRED = env_list(
    "GATEWAY_SIGNED_APPROVAL_REQUIRED",
    [],
    doc="`tenant:type` patterns (fnmatch, e.g. `acme:deployment.*`) whose approvals must be "
    "signed although their class need not be.",
)
GATEWAY_SIGNED_APPROVAL_WAIVERS = env_list(
    "GATEWAY_SIGNED_APPROVAL_WAIVERS",
    [],
    doc="`tenant:type` patterns (fnmatch, e.g. `sandbox:billing.*`) whose approvals need no "
    "signature although their class does: kept out of the database, so that a writer of it "
    "cannot waive a signature.",
)
GATEWAY_WEBAUTHN_RP_ID = env_str(
    "GATEWAY_WEBAUTHN_RP_ID",
    "",
    doc="The WebAuthn relying party id passkeys are registered for: the console's host name "
    "(`gateway.example.com`). Empty: the host name of the request, which is `localhost` in "
    "development and tests (browsers refuse an IP address such as 127.0.0.1 as an RP id: "
    "open the console at http://localhost:PORT to use passkeys).",
)
GATEWAY_WEBAUTHN_ORIGINS = env_list(
    "GATEWAY_WEBAUTHN_ORIGINS",
    [],
    doc="Origins a passkey ceremony may come from (`https://gateway.example.com`), "
    "comma-separated. Empty: the request's own origin when the passkey signs, and at "
    "dispatch the origin the stored assertion names if its host is the key's RP id.",
)
GATEWAY_SIGNING_CHALLENGE_TTL = env_number(
    "GATEWAY_SIGNING_CHALLENGE_TTL",
    300,
    doc="Seconds a passkey registration or approval challenge (its server nonce) stays usable.",
)

env_section("The API and tokens")
GATEWAY_MAX_WAIT = env_number(
    "GATEWAY_MAX_WAIT", 30, doc="The longest `?wait=` long poll, in seconds."
)
GATEWAY_AGENT_TOKEN_TTL = env_int(
    "GATEWAY_AGENT_TOKEN_TTL",
    90 * 24 * 3600,
    zero_turns_off=True,
    doc="Seconds an agent's API token lives unless issued otherwise (7776000: 90 days); "
    "0: forever.",
)
GATEWAY_PERSON_TOKEN_TTL = env_int(
    "GATEWAY_PERSON_TOKEN_TTL",
    90 * 24 * 3600,
    zero_turns_off=True,
    doc="Seconds a person's (operator's, approver's, admin's) API token lives unless issued "
    "otherwise (7776000: 90 days); 0: forever.",
)
GATEWAY_LOGIN_MAX_FAILURES = env_int(
    "GATEWAY_LOGIN_MAX_FAILURES",
    5,
    doc="Failed logins of one username from one client address before that pair is locked.",
)
GATEWAY_LOGIN_LOCKOUT = env_int(
    "GATEWAY_LOGIN_LOCKOUT",
    15 * 60,
    doc="Seconds the first lock of a (username, address) pair lasts; each attempt during the "
    "lock doubles it.",
)
GATEWAY_LOGIN_LOCKOUT_MAX = env_int(
    "GATEWAY_LOGIN_LOCKOUT_MAX",
    24 * 3600,
    doc="The longest a (username, address) pair stays locked, in seconds.",
)
GATEWAY_TRUSTED_PROXIES = env_list(
    "GATEWAY_TRUSTED_PROXIES",
    [],
    shown="none: the direct peer is the client",
    doc="Addresses or CIDRs of the reverse proxies in front of the gateway, comma-separated: "
    "only from these is `X-Forwarded-For` believed for the client's address.",
)
parse_networks(GATEWAY_TRUSTED_PROXIES)  # a malformed entry fails at start, not at a login
# django-axes (gateway/logins.py): the policy lives in the GATEWAY_LOGIN_* settings above.
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_FAILURE_LIMIT = "gateway.logins.failure_limit"
AXES_COOLOFF_TIME = "gateway.logins.cool_off"
# Each row expires on its own lock length; without this a short lock's clean-up would delete
# the rows of longer ones.
AXES_USE_ATTEMPT_EXPIRATION = True
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "gateway.lib.client_ip.client_ip"
AXES_LOCKOUT_CALLABLE = "gateway.console.auth.locked_out"
# Its start-up banner on every manage.py call is noise (the attempts are rows it keeps).
AXES_VERBOSE = False
GATEWAY_METRICS_TOKEN = env_str(
    "GATEWAY_METRICS_TOKEN",
    "",
    shown="none: `/metrics` answers loopback only (never in production)",
    doc="The bearer token a scraper sends to `/metrics`.",
)
# Long polls (gateway.api.waits): below the web process's threads, so some stay free.
GATEWAY_MAX_WAITS_PER_TOKEN = env_int(
    "GATEWAY_MAX_WAITS_PER_TOKEN",
    4,
    doc="Open `?wait=` long polls per token before the next one is answered 429.",
)
GATEWAY_MAX_WAITS_PER_PROCESS = env_int(
    "GATEWAY_MAX_WAITS_PER_PROCESS",
    4,
    doc="Open `?wait=` long polls per web process before the next one is answered 429; keep "
    "it below the process's threads.",
)
GATEWAY_VAULT_KEY = env_str(
    "GATEWAY_VAULT_KEY",
    "",
    shown="generated under `var/` in development; required with `GATEWAY_PRODUCTION=true`",
    doc="Fernet key(s) encrypting payloads at rest, comma-separated: the first encrypts, all "
    "decrypt (rotate by putting the new key first, then `manage.py rotate_vault_key`).",
)

# Remote MCP clients (OAuth 2.1): the authorization server's settings, in their own module.
from gateway.settings_oauth import *  # noqa: E402, F403

env_section("Outgoing webhooks and agent hooks")
GATEWAY_WEBHOOK_TIMEOUT = env_number(
    "GATEWAY_WEBHOOK_TIMEOUT", 10, doc="Seconds before a webhook delivery counts as failed."
)
GATEWAY_WEBHOOK_BACKOFF = env_number(
    "GATEWAY_WEBHOOK_BACKOFF",
    5,
    doc="Seconds before the first redelivery of a failed webhook message; doubles per attempt "
    "(with jitter).",
)
GATEWAY_WEBHOOK_MAX_ATTEMPTS = env_int(
    "GATEWAY_WEBHOOK_MAX_ATTEMPTS",
    12,
    doc="Deliveries of one webhook message before it is given up.",
)
GATEWAY_WEBHOOK_SWEEP_INTERVAL = env_number(
    "GATEWAY_WEBHOOK_SWEEP_INTERVAL", 5, doc="Seconds between the webhook sender's sweeps."
)
GATEWAY_WEBHOOK_ALLOW_HTTP = env_bool(
    "GATEWAY_WEBHOOK_ALLOW_HTTP",
    False,
    doc="Accept webhook endpoints on plain `http://` (otherwise `https://` only).",
)
# Receivers on private, loopback or link-local addresses (SSRF guard): off unless set, outside
# production too: a development gateway on a laptop or a CI runner sits on a network worth
# reaching. `make demo` sets it for its local receivers.
GATEWAY_WEBHOOK_ALLOW_PRIVATE = env_bool(
    "GATEWAY_WEBHOOK_ALLOW_PRIVATE",
    False,
    doc="Accept webhook receivers on private, loopback or link-local addresses (the SSRF "
    "guard refuses them otherwise). `make demo` sets it for its local receivers.",
)
GATEWAY_CONSOLE_URL = env_str(
    "GATEWAY_CONSOLE_URL",
    "",
    shown="none: links relative to the request",
    doc="The console's public base URL, for the absolute links in webhooks (an effect's "
    "approval page) and agent hooks.",
)

env_section("Sagas and the audit chain")
GATEWAY_SAGA_QUIET_AFTER = env_number(
    "GATEWAY_SAGA_QUIET_AFTER",
    60,
    doc="Seconds an active saga may go without news before the sweeper advances it again.",
)
# Signed checkpoints of the audit chains (gateway.checkpoints): a key the database never
# holds and an append-only place.
GATEWAY_AUDIT_SIGNING_KEY = env_str(
    "GATEWAY_AUDIT_SIGNING_KEY",
    "",
    shown="generated under `var/` in development; required with `GATEWAY_PRODUCTION=true`",
    doc="Ed25519 seed (32 bytes, base64) signing the audit checkpoints; the database never "
    "holds it.",
)
if PRODUCTION and not GATEWAY_AUDIT_SIGNING_KEY:
    # Refused at start, not at the first receipt: every receipt is sealed with it.
    raise ImproperlyConfigured("GATEWAY_AUDIT_SIGNING_KEY must be set in production")
GATEWAY_CHECKPOINT_DIR = env_str(
    "GATEWAY_CHECKPOINT_DIR",
    str(VAR_DIR / "checkpoints"),
    shown="`checkpoints/` under `GATEWAY_VAR_DIR`",
    doc="Where signed audit checkpoints are appended (outside the database).",
)
GATEWAY_WITNESS_DIR = env_str(
    "GATEWAY_WITNESS_DIR",
    str(VAR_DIR / "witness"),
    shown="`witness/` under `GATEWAY_VAR_DIR`",
    doc="The audit witness's own directory (`manage.py audit_witness`): its Ed25519 key and "
    "the tree heads it cosigned. Give it a directory the gateway cannot write.",
)
GATEWAY_CHECKPOINT_INTERVAL = env_number(
    "GATEWAY_CHECKPOINT_INTERVAL", 300, doc="Seconds between signed audit checkpoints."
)
GATEWAY_AUDIT_SEAL_INTERVAL = env_number(
    "GATEWAY_AUDIT_SEAL_INTERVAL",
    0.5,
    doc="Seconds between the audit sequencer's passes, which seal committed events into the "
    "hash chain.",
)
GATEWAY_AUDIT_SEAL_BATCH = env_int(
    "GATEWAY_AUDIT_SEAL_BATCH", 1000, doc="Events the sequencer seals per transaction."
)
GATEWAY_AUDIT_SHARDS = env_int(
    "GATEWAY_AUDIT_SHARDS",
    1,
    doc="Tenant shards the sequencer's work is split into (one beat entry each).",
)
# A queue of its own, so that a seal pass never waits behind a deep dispatch queue.
GATEWAY_AUDIT_QUEUE = env_str(
    "GATEWAY_AUDIT_QUEUE",
    "",
    shown="none: the default queue",
    doc="A queue of its own for the audit sequencer; workers must consume it too "
    "(`-Q celery,audit`).",
)

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
    "resume-bulk-jobs": {
        "task": "reconciliation.tasks.resume_bulk_jobs",
        "schedule": timedelta(seconds=GATEWAY_SWEEP_INTERVAL),
    },
    "tally-effects": {
        "task": "reconciliation.tasks.tally_effects",
        "schedule": timedelta(seconds=GATEWAY_TALLY_INTERVAL),
        # A pass that waited longer than two intervals is superseded by the next one.
        "options": {"expires": 2 * GATEWAY_TALLY_INTERVAL},
    },
    "rollup-ledger": {
        "task": "gateway.tasks.rollup_ledger",
        "schedule": timedelta(seconds=GATEWAY_ROLLUP_INTERVAL),
        # A pass that waited longer than two intervals is superseded by the next one.
        "options": {"expires": 2 * GATEWAY_ROLLUP_INTERVAL},
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
env_section("Logging")
_LOG_LEVEL = env_str("LOG_LEVEL", "INFO", doc="The log level (`DEBUG`, `INFO`, `WARNING`, …).")
_TRANSITIONS_LEVEL = env_str(
    "LOG_TRANSITIONS_LEVEL",
    _LOG_LEVEL,
    shown="= `LOG_LEVEL`",
    doc="The level of the one line per effect or saga state change (the demo: `INFO` while "
    "`LOG_LEVEL` is `WARNING`).",
)
_LOG_FORMAT = env_str(
    "LOG_FORMAT",
    "json",
    doc="`json`: one JSON object a line, carrying ids, never payloads; `text`: for people.",
)
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
