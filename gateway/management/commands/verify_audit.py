"""``manage.py verify_audit [--tenant SLUG] [--no-seal] [--against CHECKPOINTS]``: report each
tenant's sealed head and sealing lag, seal what is committed (as the sequencer would), then
recompute every chain and report the first broken link; check each effect's status and each
receipt against the chain (gateway.checkpoints); with ``--against`` (a checkpoint file of JSON
lines, or JSON), prove the ledger extends every signed checkpoint in it. Exit status 1 when
anything is broken.

With ``--no-seal`` nothing is written: only the sealed part of each chain is verified, and the
unsealed events (protected by the database trigger alone until sealed) are counted."""

from django.core.management.base import BaseCommand, CommandError

from gateway import checkpoints
from gateway.audit import seal_state, seal_tenant, verify_tenant
from gateway.models import Tenant


class Command(BaseCommand):
    help = "Verify the audit hash chain of every tenant (or one), optionally against checkpoints."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="only this tenant's chain")
        parser.add_argument(
            "--no-seal", action="store_true", help="verify only what is sealed; write nothing"
        )
        parser.add_argument(
            "--against",
            metavar="CHECKPOINT",
            help="a signed checkpoint file (or JSON) the ledger must extend",
        )
        parser.add_argument(
            "--public-key",
            help="the trusted Ed25519 public key (base64); default: this deployment's",
        )

    def handle(
        self,
        *args,
        tenant: str | None = None,
        no_seal: bool = False,
        against: str | None = None,
        **options,
    ):
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
            if state.halted:
                broken += 1
                self.stdout.write(
                    f"{item.slug}: BROKEN: the sequencer has stopped: PostgreSQL's transaction "
                    "ids are behind the chain's floor (restored into another cluster?); run "
                    "manage.py audit_rebase"
                )
            if not no_seal:
                while seal_tenant(item.pk):
                    pass
            found = verify_tenant(item.pk)
            if found is not None:
                broken += 1
                where = f"event {found.event_id}" if found.event_id else "the chain head"
                self.stdout.write(f"{item.slug}: BROKEN at {where}: {found.reason}")
                continue
            problems = checkpoints.status_problems(item.pk) + checkpoints.receipt_problems(item.pk)
            if problems:
                broken += 1
                for problem in problems[:20]:
                    self.stdout.write(f"{item.slug}: BROKEN: {problem}")
                continue
            self.stdout.write(f"{item.slug}: chain intact")
        if against:
            try:
                loaded = checkpoints.load(against)
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read checkpoints from {against}: {exc}") from None
            for checkpoint in loaded:
                if tenant and checkpoint.get("tenant") != tenant:
                    continue
                verdict = checkpoints.checkpoint_verify(
                    checkpoint, trusted_key=options.get("public_key")
                )
                label = f"{verdict.tenant}: checkpoint at {verdict.length}"
                if verdict.ok:
                    self.stdout.write(f"{label}: extended")
                else:
                    broken += 1
                    self.stdout.write(f"{label}: BROKEN: {verdict.reason}")
        if broken:
            raise CommandError(f"{broken} broken chain(s) or checkpoint(s)")
