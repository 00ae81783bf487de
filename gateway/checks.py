"""``manage.py check``: the loaded contract modules (errors that stop the server and the
workers), and the ``--deploy`` warnings that need the database."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections

from gateway.contracts import CONTRACTS, loading
from gateway.providers import config, registry

CONTRACTS_TAG = "contracts"
PROVIDER_INVALID = "gateway.E111"
PROVIDER_BUILD_FAILED = "gateway.E112"
PROVIDER_UNUSED = "gateway.W111"
PROVIDERS_HINT = "see GATEWAY_PROVIDERS in docs/guides/connect-a-provider.md"

LEDGER_TABLE = "gateway_effectevent"


def _postgres_row(sql: str, params: list | None = None) -> tuple | None:
    """The first row of ``sql`` on the default database; None when that is not PostgreSQL or
    cannot be reached (a check run before the database exists says nothing)."""
    connection = connections["default"]
    if connection.vendor != "postgresql":
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    except DatabaseError:
        return None


@register(Tags.security, deploy=True)
def app_role_must_not_own_the_ledger(app_configs=None, databases=None, **kwargs):
    """The append-only triggers bind only roles that do not own the tables: an owner (or a
    superuser) can disable or drop them. So the app must connect as a role that neither owns
    the ledger tables nor is a superuser (docs/security.md, "Database roles")."""
    row = _postgres_row(
        "SELECT pg_has_role(current_user, c.relowner, 'USAGE'), r.rolsuper "
        "FROM pg_class c, pg_roles r "
        "WHERE c.oid = %s::regclass AND r.rolname = current_user",
        [LEDGER_TABLE],
    )
    if row is None:
        return []  # no database (yet), or not PostgreSQL: nothing to say about its roles
    owns, superuser = row
    if not (owns or superuser):
        return []
    what = "is a superuser" if superuser else "owns the ledger tables"
    return [
        Warning(
            f"The database role the gateway connects as {what}, so it can disable the "
            "append-only triggers (and TRUNCATE the history).",
            hint="Run migrations as an owner role and connect the app as a role with only "
            "SELECT/INSERT/UPDATE on the tables (docs/security.md, 'Database roles').",
            id="gateway.W001",
        )
    ]


@register(Tags.database, Tags.compatibility, deploy=True)
def statistics_must_follow_the_ledger(app_configs=None, databases=None, **kwargs):
    """The hot statements are prepared and run with the generic plan made from the tables'
    statistics (settings.GATEWAY_DB_GENERIC_PLANS); without autovacuum nothing refreshes
    them, and a plan made on a small ledger keeps reading whole tables as it grows: the
    drainer's claim hash-joined every command ever written, at half the throughput, in an
    8,000-effect benchmark pass (docs/guides/operations.md, "Statistics")."""
    row = _postgres_row(
        "SELECT current_setting('autovacuum') = 'on' AND current_setting('track_counts') = 'on'"
    )
    if row is None or row[0]:
        return []  # no database (yet), or statistics kept current
    return [
        Warning(
            "PostgreSQL runs without autovacuum (or without track_counts): nothing analyzes "
            "the ledger's tables as they grow, and the prepared claim, submission and record "
            "keep the plans of the size they had when each connection first ran them.",
            hint="Turn autovacuum on (PostgreSQL's default), or run ANALYZE on a schedule; "
            "see docs/guides/operations.md, 'Statistics'.",
            id="gateway.W002",
        )
    ]


@register(CONTRACTS_TAG)
def contract_modules_must_load(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every problem the start-up load of ``GATEWAY_CONTRACT_MODULES`` found (a module that
    does not import or declares no contracts, a schema that is not JSON Schema, an approval
    rule on a missing field, a missing compensator, a type declared twice, a version whose
    schema or policy changed), and each loaded contract whose provider nothing can reach.
    Errors name the module and the type; a module with one is not loaded at all."""
    loaded = loading.current()
    # A provider GATEWAY_PROVIDERS names is reachable; its own entry is checked below.
    reachable = {**settings.GATEWAY_PROVIDER_URLS, **dict.fromkeys(settings.GATEWAY_PROVIDERS, "-")}
    problems = loaded.problems + loading.provider_problems(loaded, reachable)
    messages: list[CheckMessage] = []
    for problem in problems:
        kind = Error if problem.error else Warning
        messages.append(kind(str(problem), hint=problem.hint or None, id=problem.id))
    return messages


@register(CONTRACTS_TAG)
def providers_must_be_configured(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Each ``GATEWAY_PROVIDERS`` entry (docs/guides/connect-a-provider.md): its shape (an
    inline secret is refused without being repeated), an adapter kind or factory that does
    not resolve, a missing base URL, an option its adapter does not read, a credential whose
    environment variable is not set or whose file is missing (``gateway.E111``); then the
    adapter of each loaded contract of the provider, built once, no call made
    (``gateway.E112``); and an entry no loaded contract uses (``gateway.W111``)."""
    messages: list[CheckMessage] = []
    used = {contract.provider for contract in CONTRACTS.values()}
    for name, raw in settings.GATEWAY_PROVIDERS.items():
        problems = config.entry_problems(name, raw)
        messages += [
            Error(problem, hint=PROVIDERS_HINT, id=PROVIDER_INVALID) for problem in problems
        ]
        if not problems:
            for contract in CONTRACTS.values():
                failed = registry.check_build(contract) if contract.provider == name else ""
                if failed:
                    messages.append(
                        Error(
                            f"provider {name!r}: the adapter for {contract.type} cannot be "
                            f"built: {failed}",
                            hint=PROVIDERS_HINT,
                            id=PROVIDER_BUILD_FAILED,
                        )
                    )
        if name not in used:
            messages.append(
                Warning(
                    f"provider {name!r} is configured in GATEWAY_PROVIDERS, but no loaded "
                    "contract sends to it",
                    hint="check the name against the contracts' providers "
                    "(GET /api/v1/effect-types)",
                    id=PROVIDER_UNUSED,
                )
            )
    return messages


@register(Tags.security, deploy=True)
def passkeys_name_their_relying_party(app_configs=None, **kwargs):
    """Signed approvals on, no RP id: passkeys belong to whatever host name a request used,
    and one registered through another name (an IP address, an internal alias) signs nothing
    on the public one (docs/guides/passkeys.md)."""
    if not settings.GATEWAY_SIGNED_APPROVAL_CLASSES or settings.GATEWAY_WEBAUTHN_RP_ID:
        return []
    return [
        Warning(
            "Approvals are signed with passkeys but GATEWAY_WEBAUTHN_RP_ID is not set.",
            hint="Set GATEWAY_WEBAUTHN_RP_ID to the console's host name and "
            "GATEWAY_WEBAUTHN_ORIGINS to its origin (docs/guides/passkeys.md).",
            id="gateway.W003",
        )
    ]
