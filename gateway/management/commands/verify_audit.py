"""``manage.py verify_audit [--tenant SLUG] [--no-seal]``: report each tenant's sealed head and
sealing lag, seal what is committed (as the sequencer would), then recompute every chain and
report the first broken link. Exit status 1 when a chain is broken.

With ``--no-seal`` nothing is written: only the sealed part of each chain is verified, and the
unsealed events (protected by the database trigger alone until sealed) are counted."""

from django.core.management.base import BaseCommand, CommandError

from gateway.audit import seal_state, seal_tenant, verify_tenant
from gateway.models import Tenant


class Command(BaseCommand):
    help = "Verify the audit hash chain of every tenant (or one)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="only this tenant's chain")
        parser.add_argument(
            "--no-seal", action="store_true", help="verify only what is sealed; write nothing"
        )

    def handle(self, *args, tenant: str | None = None, no_seal: bool = False, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant}")
        broken = 0
        for item in tenants:
            state = seal_state(item.pk)
            self.stdout.write(
                f"{item.slug}: sealed head at {state.length} ({state.last_hash[:12]}…"
                f"{', sealed ' + state.sealed_at.isoformat() if state.sealed_at else ''}); "
                f"{state.unsealed} unsealed, sealing lag {state.lag_seconds:.3f}s"
            )
            if not no_seal:
                while seal_tenant(item.pk):
                    pass
            found = verify_tenant(item.pk)
            if found is None:
                self.stdout.write(f"{item.slug}: chain intact")
                continue
            broken += 1
            where = f"event {found.event_id}" if found.event_id else "the chain head"
            self.stdout.write(f"{item.slug}: BROKEN at {where}: {found.reason}")
        if broken:
            raise CommandError(f"{broken} broken chain(s)")
