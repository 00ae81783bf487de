"""``manage.py verify_audit [--tenant SLUG]``: recompute every tenant's event hash chain and
report the first broken link. Exit status 1 when a chain is broken."""

from django.core.management.base import BaseCommand, CommandError

from gateway.audit import verify_tenant
from gateway.models import Tenant


class Command(BaseCommand):
    help = "Verify the audit hash chain of every tenant (or one)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="only this tenant's chain")

    def handle(self, *args, tenant: str | None = None, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant}")
        broken = 0
        for item in tenants:
            found = verify_tenant(item.pk)
            if found is None:
                self.stdout.write(f"{item.slug}: chain intact")
                continue
            broken += 1
            where = f"event {found.event_id}" if found.event_id else "the chain head"
            self.stdout.write(f"{item.slug}: BROKEN at {where}: {found.reason}")
        if broken:
            raise CommandError(f"{broken} broken chain(s)")
