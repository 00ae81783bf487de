"""The audit sequencer seals a batch as one row instead of rewriting every event.

Before, sealing an event was an UPDATE of it (position, prev_hash, hash, sealed_at): a second
full version of every event, a new entry in each of its indexes (position was indexed, so never
a HOT update), a PL/pgSQL trigger comparing the two versions as JSON, and the dead version for
vacuum. Now an event is written once. Each pass of the sequencer writes one ``AuditBatch``
row naming its events in chain order, with each one's link hash; the chain's arithmetic is
unchanged (``link = sha256(previous ‖ JCS(event))``), so the links already computed carry over.

How the sequencer finds unsealed events without a marker on them: every event now records the
id of the transaction that inserted it (``txid``, a column default: no statement names it),
and each head a floor below which everything is sealed, with the few batches that hold events
at or above it (gateway.audit explains why that holds). ``gateway_txid_offset()`` keeps those ids rising across a logical restore into another
cluster (``manage.py audit_rebase`` moves it; until then the sequencer stops, loudly).

Here: events sealed before (position set) become batches of up to 1000 links in position order,
with their stored hashes; events not sealed yet are sealed after them in id order, as the
sequencer would have; the heads get a floor. Then the seal columns and their indexes go, and
the event trigger refuses every UPDATE (there is nothing left to fill in). The batch table is
append-only like the events (UPDATE, DELETE and a non-owner's TRUNCATE refused).

Irreversible: the per-event seals are not written back.
"""

import hashlib

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone

LEGACY_BATCH = 1000

FUNCTIONS = """
CREATE OR REPLACE FUNCTION gateway_txid_offset() RETURNS bigint
    LANGUAGE sql IMMUTABLE AS 'SELECT 0::bigint';
CREATE OR REPLACE FUNCTION gateway_txid() RETURNS bigint
    LANGUAGE sql VOLATILE AS 'SELECT pg_current_xact_id()::text::bigint + gateway_txid_offset()';
"""

# Existing rows keep NULL (they are sealed below); only new rows get the default. A volatile
# default given to ADD COLUMN would rewrite the table and stamp every old row.
TXID_COLUMN = """
ALTER TABLE gateway_effectevent ADD COLUMN txid bigint NULL;
ALTER TABLE gateway_effectevent ALTER COLUMN txid SET DEFAULT gateway_txid();
"""

LEGACY_BATCHES = f"""
INSERT INTO gateway_auditbatch
    (tenant_id, first, last, event_ids, links, prev_hash, hash, max_txid, sealed_at)
SELECT tenant_id, min(position), max(position), array_agg(id ORDER BY position),
       string_agg(decode(hash, 'hex'), ''::bytea ORDER BY position),
       (array_agg(prev_hash ORDER BY position))[1],
       (array_agg(hash ORDER BY position DESC))[1],
       0, max(sealed_at)
  FROM gateway_effectevent
 WHERE position IS NOT NULL
 GROUP BY tenant_id, (position - 1) / {LEGACY_BATCH}
"""

TRIGGERS = """
DROP TRIGGER IF EXISTS effectevent_append_only ON gateway_effectevent;
CREATE TRIGGER effectevent_append_only BEFORE UPDATE OR DELETE ON gateway_effectevent
    FOR EACH ROW EXECUTE FUNCTION gateway_refuse_change();
DROP FUNCTION IF EXISTS gateway_event_seal_once();
CREATE TRIGGER auditbatch_append_only BEFORE UPDATE OR DELETE ON gateway_auditbatch
    FOR EACH ROW EXECUTE FUNCTION gateway_refuse_change();
CREATE TRIGGER gateway_auditbatch_no_truncate BEFORE TRUNCATE ON gateway_auditbatch
    FOR EACH STATEMENT EXECUTE FUNCTION gateway_refuse_truncate();
"""


def _canonical(value) -> bytes:
    import rfc8785

    return rfc8785.dumps(value)


def _link(previous: str, event) -> str:
    """gateway.audit.link_hash as of this migration (the chain's arithmetic)."""
    body = {
        "tenant": event.tenant_id,
        "effect": event.effect_id,
        "kind": event.kind,
        "from": event.from_status,
        "to": event.to_status,
        "actor": event.actor,
        "principal": event.principal_id,
        "reason": event.reason,
        "data": event.data,
        "at": event.created_at.isoformat(),
    }
    if event.subject:
        body["subject"] = event.subject
    return hashlib.sha256(previous.encode() + _canonical(body)).hexdigest()


def seal_into_batches(apps, schema_editor):
    Event = apps.get_model("gateway", "EffectEvent")
    Head = apps.get_model("gateway", "AuditChainHead")
    Batch = apps.get_model("gateway", "AuditBatch")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(LEGACY_BATCHES)
    now = timezone.now()
    tenants = Event.objects.filter(position__isnull=True).values_list("tenant_id", flat=True)
    for tenant_id in sorted(set(tenants)):
        head, _ = Head.objects.get_or_create(tenant_id=tenant_id, defaults={"last_hash": "0" * 64})
        pending = Event.objects.filter(tenant_id=tenant_id, position__isnull=True).order_by("id")
        ids = list(pending.values_list("id", flat=True))
        for start in range(0, len(ids), LEGACY_BATCH):
            chunk = list(Event.objects.filter(id__in=ids[start : start + LEGACY_BATCH]).order_by("id"))
            previous, links = head.last_hash, []
            for event in chunk:
                previous = _link(previous, event)
                links.append(bytes.fromhex(previous))
            Batch.objects.create(
                tenant_id=tenant_id,
                first=head.length + 1,
                last=head.length + len(chunk),
                event_ids=[event.pk for event in chunk],
                links=b"".join(links),
                prev_hash=head.last_hash,
                hash=previous,
                max_txid=0,
                sealed_at=now,
            )
            head.last_hash, head.length, head.last_event_id = previous, head.length + len(chunk), chunk[-1].pk
            head.sealed_at = now
            head.save()
    # Every event that exists now is in a batch; the ones to come get a txid from here on.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "UPDATE gateway_auditchainhead SET floor_txid = "
            "pg_snapshot_xmin(pg_current_snapshot())::text::bigint + gateway_txid_offset()"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0012_lean_indexes"),
    ]

    operations = [
        migrations.RunSQL(FUNCTIONS, migrations.RunSQL.noop),
        migrations.CreateModel(
            name="AuditBatch",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("first", models.BigIntegerField()),
                ("last", models.BigIntegerField()),
                ("event_ids", django.contrib.postgres.fields.ArrayField(base_field=models.BigIntegerField(), size=None)),
                ("links", models.BinaryField()),
                ("prev_hash", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64)),
                ("max_txid", models.BigIntegerField()),
                ("sealed_at", models.DateTimeField()),
                (
                    "tenant",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="gateway.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("tenant", "last"), name="audit_batch_chain")
                ],
            },
        ),
        migrations.AddField(
            model_name="auditchainhead",
            name="floor_txid",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="auditchainhead",
            name="reach",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.BigIntegerField(), default=list, size=None
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(TXID_COLUMN, migrations.RunSQL.noop)],
            state_operations=[
                migrations.AddField(
                    model_name="effectevent",
                    name="txid",
                    field=models.BigIntegerField(
                        db_default=models.Func(
                            function="gateway_txid", output_field=models.BigIntegerField()
                        ),
                        editable=False,
                        null=True,
                    ),
                ),
            ],
        ),
        migrations.RunPython(seal_into_batches),
        migrations.RunSQL(TRIGGERS, migrations.RunSQL.noop),
        migrations.RemoveConstraint(model_name="effectevent", name="event_chain_position"),
        migrations.RemoveIndex(model_name="effectevent", name="event_chain_order"),
        migrations.RemoveIndex(model_name="effectevent", name="event_unsealed"),
        migrations.RemoveField(model_name="effectevent", name="hash"),
        migrations.RemoveField(model_name="effectevent", name="position"),
        migrations.RemoveField(model_name="effectevent", name="prev_hash"),
        migrations.RemoveField(model_name="effectevent", name="sealed_at"),
        migrations.AddIndex(
            model_name="effectevent",
            index=models.Index(
                condition=models.Q(("txid__isnull", False)),
                fields=["tenant", "txid"],
                name="event_seal_queue",
            ),
        ),
    ]
