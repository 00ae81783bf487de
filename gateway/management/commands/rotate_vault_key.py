"""``manage.py rotate_vault_key``: re-seal every command's payload, and every tenant's provider
credential, under the first key of ``GATEWAY_VAULT_KEY``.

Rotation: put the new key first (``GATEWAY_VAULT_KEY=new,old``), restart, run this, then
drop the old key. The commands stay frozen: the database allows this one column to change.
"""

from django.core.management.base import BaseCommand
from django.db import transaction

from gateway.integrity import payload_binding
from gateway.lib.vault import reseal_bound
from gateway.models import Command as LedgerCommand
from gateway.provider_credentials import credentials_reseal


class Command(BaseCommand):
    help = "Re-encrypt every sealed payload with the current primary vault key."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=500)

    def handle(self, *args, batch: int, **options):
        done = 0
        last = ""
        while True:
            rows = list(
                LedgerCommand.objects.filter(effect_id__gt=last)
                .order_by("effect_id")
                .values_list("effect_id", "payload_digest", "payload_sealed")[:batch]
            )
            if not rows:
                break
            with transaction.atomic():
                for effect_id, digest, sealed in rows:
                    # Re-sealed bound to its own command (payloads sealed before binding
                    # existed become bound here).
                    bound_to = payload_binding(effect_id=effect_id, digest=digest)
                    LedgerCommand.objects.filter(pk=effect_id).update(
                        payload_sealed=reseal_bound(sealed, bound_to=bound_to)
                    )
            done += len(rows)
            last = rows[-1][0]
        self.stdout.write(f"Re-sealed {done} payloads under the current key.")
        count = credentials_reseal()
        self.stdout.write(f"Re-sealed {count} provider credentials under the current key.")
