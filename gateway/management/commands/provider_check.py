"""``manage.py provider_check PROVIDER``: the conformance fault matrix against a configured
provider, through the kit's fault proxy (docs/guides/provider-conformance.md).

The provider's base URL is its ``GATEWAY_PROVIDERS`` entry's, else its
``GATEWAY_PROVIDER_URLS`` entry; its adapter is the one the gateway uses for it, with its
credential and options (or ``--adapter``), pointed at the fault proxy with the kit's
timeout; the sample command is the example of its contract (``--type``, else its first). The
oracle is the server's own records, read by a driver: the sandbox's is built in (found by its
``/_health``); any other server needs ``--driver``. Every case sends real commands: run it
against a test server. Prints a table of cases with PASS / FAIL / SKIP and exits 1 when a
case fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test.utils import override_settings
from django.utils.module_loading import import_string

from gateway.contracts import CONTRACTS, EffectContract, get_contract
from gateway.providers.base import ProviderAdapter
from gateway.providers.conformance import (
    CASES,
    CASES_BY_NAME,
    FAIL,
    Driver,
    Sample,
    SandboxDriver,
    Subject,
    format_table,
    run_matrix,
)
from gateway.providers.registry import adapter_for


class Command(BaseCommand):
    help = (
        "Run the conformance fault matrix against a configured provider through a fault "
        "proxy; exits 1 when a case fails. It sends real commands: use a test server."
    )
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("provider", help="a name in GATEWAY_PROVIDER_URLS")
        parser.add_argument("--type", help="the effect type whose example is sent")
        parser.add_argument(
            "--case", action="append", choices=sorted(CASES_BY_NAME), help="only this case"
        )
        parser.add_argument(
            "--driver",
            help="dotted path of a callable(base_url) -> Driver: the server's own records "
            "and the faults it makes (default: the sandbox's, when the server is the sandbox)",
        )
        parser.add_argument(
            "--adapter",
            help="dotted path of a callable(base_url) -> adapter (default: the gateway's "
            "adapter for the provider)",
        )
        parser.add_argument("--timeout", type=float, default=1.0, help="the adapter's timeout")
        parser.add_argument("--json", action="store_true", help="print the reports as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["provider"]
        entry = settings.GATEWAY_PROVIDERS.get(name)
        configured = entry.get("base_url") if isinstance(entry, dict) else None
        base_url = configured or settings.GATEWAY_PROVIDER_URLS.get(name)
        if not base_url:
            raise CommandError(
                f"no URL for provider {name!r} in GATEWAY_PROVIDERS or GATEWAY_PROVIDER_URLS"
            )
        contract = _contract(name, options["type"])
        if options["timeout"] <= 0:
            raise CommandError("--timeout must be positive")
        subject = Subject(
            adapter=_adapter_factory(contract, options["adapter"]),
            base_url=base_url,
            driver=_driver(base_url, options["driver"]),
            sample=_sample(contract),
            key_retention=contract.recovery.key_retention,
            timeout=options["timeout"],
        )
        cases = [CASES_BY_NAME[c] for c in options["case"]] if options["case"] else CASES
        reports = run_matrix(subject, cases)
        if options["json"]:
            self.stdout.write(json.dumps([r.as_data() for r in reports], indent=2))
        else:
            self.stdout.write(f"{name} ({contract.type}) at {base_url}")
            self.stdout.write(format_table(reports, verbose=options["verbosity"] >= 2))
        failed = [r.case.name for r in reports if r.status == FAIL]
        if failed:
            raise CommandError(f"{len(failed)} case(s) failed: {', '.join(failed)}", returncode=1)


def _contract(provider: str, effect_type: str | None) -> EffectContract:
    if effect_type:
        contract = get_contract(effect_type)
        if contract is None or contract.provider != provider:
            raise CommandError(f"{effect_type!r} is not an effect type of provider {provider!r}")
        return contract
    for contract in CONTRACTS.values():
        if contract.provider == provider:
            return contract
    raise CommandError(f"no effect type is served by provider {provider!r}")


def _adapter_factory(
    contract: EffectContract, path: str | None
) -> Callable[[str], ProviderAdapter]:
    if path:
        factory: Callable[[str], ProviderAdapter] = import_string(path)
        return factory

    def gateway_adapter(base_url: str) -> ProviderAdapter:
        # The registry's own choice of adapter, with the provider's URL turned to the proxy
        # (and its own timeout left to the kit's, which the slow cases are timed against).
        urls = {**settings.GATEWAY_PROVIDER_URLS, contract.provider: base_url}
        providers = dict(settings.GATEWAY_PROVIDERS)
        entry = providers.get(contract.provider)
        if isinstance(entry, dict):
            entry = {k: v for k, v in entry.items() if k != "timeout"}
            providers[contract.provider] = {**entry, "base_url": base_url}
        with override_settings(GATEWAY_PROVIDER_URLS=urls, GATEWAY_PROVIDERS=providers):
            return adapter_for(contract)

    return gateway_adapter


def _driver(base_url: str, path: str | None) -> Driver:
    if path:
        factory: Callable[[str], Driver] = import_string(path)
        return factory(base_url)
    sandbox = SandboxDriver(base_url)
    if not sandbox.healthy():
        raise CommandError(
            f"{base_url} is not the sandbox provider: the oracle is the server's own records, "
            "so name a driver for it with --driver (docs/guides/provider-conformance.md)"
        )
    return sandbox


def _sample(contract: EffectContract) -> Sample:
    resource = dict(contract.example.get("resource") or {})
    payload = dict(contract.example.get("payload") or {})
    return Sample(
        type=contract.type,
        resource=resource,
        payload=payload,
        other_payload={**payload, "conformance_variant": "another body for the same key"},
        completion_statuses=contract.completion_statuses,
    )
