"""``manage.py audit_rebase``: after the ledger was restored into another PostgreSQL cluster.

The audit sequencer finds unsealed events by the id of the transaction that inserted them
(gateway.audit): every event records it, and each tenant's chain head a floor below which all
is sealed. A logical copy into another cluster (``pg_dump``/``pg_restore``, logical
replication) keeps those recorded ids but not the cluster's counter, which may be far behind:
new events would land below the floors and never be found. The sequencer notices (the next
transaction id is below a floor), stops sealing and says so (``verify_audit``, the console's
audit panel, an error in the worker's log).

This command moves ``gateway_txid_offset()`` so that new transaction ids continue above every
recorded one, then seals, tenant by tenant, every event that no batch names (those written
since the restore included). Run it with the role that runs migrations: it replaces a
function. It does nothing when the counter is ahead, so running it after every restore is safe.
"""

from django.core.management.base import BaseCommand
from django.db import connection

from gateway import audit
from gateway.models import Tenant


class Command(BaseCommand):
    help = "Move the audit sequencer's transaction ids past a restored ledger's, then seal."

    def handle(self, *args, **options):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT gateway_txid_offset(), pg_snapshot_xmin(s)::text::bigint, "
                # The next id to be given out: xmax is only "latest ended + 1", and this
                # transaction's own id (when it has one) may be above it.
                "GREATEST(pg_snapshot_xmax(s)::text::bigint, "
                "pg_current_xact_id_if_assigned()::text::bigint + 1), "
                "(SELECT max(floor_txid) FROM gateway_auditchainhead), "
                "GREATEST((SELECT max(max_txid) FROM gateway_auditbatch), "
                "(SELECT max(txid) FROM gateway_effectevent)) FROM pg_current_snapshot() AS s"
            )
            offset, oldest_raw, next_raw, floor, written = cursor.fetchone()
            # A floor may equal the next id (nothing was running when it was set); a recorded
            # transaction id is always below it, unless the counter went back.
            behind = (floor or 0) > next_raw + offset or (written or 0) >= next_raw + offset
            if not behind:
                self.stdout.write(
                    f"transaction ids are ahead of the ledger's (next {next_raw + offset}): "
                    "nothing to move"
                )
            else:
                # From the oldest running transaction: one running now writes above them too.
                offset = max(floor or 0, (written or 0) + 1) - oldest_raw
                cursor.execute(
                    "CREATE OR REPLACE FUNCTION gateway_txid_offset() RETURNS bigint "
                    f"LANGUAGE sql IMMUTABLE AS 'SELECT {int(offset)}::bigint'"
                )
                self.stdout.write(f"transaction ids now continue from {oldest_raw + offset}")
        for tenant in Tenant.objects.order_by("pk"):
            sealed = 0
            while count := audit.seal_tenant(tenant.pk, everything=True):
                sealed += count
            self.stdout.write(f"{tenant.slug}: sealed {sealed} event(s) no batch named")
