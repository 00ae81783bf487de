"""Make the ledger's history append-only in the database itself (PostgreSQL).

Events and receipts refuse UPDATE and DELETE; commands refuse DELETE and any UPDATE other
than re-sealing the payload under a rotated vault key. Existing events are chained first.
On SQLite (development) there are no triggers; ``verify_audit`` still detects tampering.
"""

from django.db import migrations

FUNCTIONS = """
CREATE OR REPLACE FUNCTION gateway_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION gateway_command_frozen() RETURNS trigger AS $$
BEGIN
    IF (to_jsonb(NEW) - 'payload_sealed') IS DISTINCT FROM (to_jsonb(OLD) - 'payload_sealed') THEN
        RAISE EXCEPTION 'a command is frozen: only its sealed payload may be re-encrypted'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
"""

TRIGGERS = """
CREATE TRIGGER effectevent_append_only BEFORE UPDATE OR DELETE ON gateway_effectevent
    FOR EACH ROW EXECUTE FUNCTION gateway_refuse_change();
CREATE TRIGGER receipt_append_only BEFORE UPDATE OR DELETE ON gateway_receipt
    FOR EACH ROW EXECUTE FUNCTION gateway_refuse_change();
CREATE TRIGGER command_no_delete BEFORE DELETE ON gateway_command
    FOR EACH ROW EXECUTE FUNCTION gateway_refuse_change();
CREATE TRIGGER command_frozen BEFORE UPDATE ON gateway_command
    FOR EACH ROW EXECUTE FUNCTION gateway_command_frozen();
"""

DROP = """
DROP TRIGGER IF EXISTS effectevent_append_only ON gateway_effectevent;
DROP TRIGGER IF EXISTS receipt_append_only ON gateway_receipt;
DROP TRIGGER IF EXISTS command_no_delete ON gateway_command;
DROP TRIGGER IF EXISTS command_frozen ON gateway_command;
DROP FUNCTION IF EXISTS gateway_refuse_change();
DROP FUNCTION IF EXISTS gateway_command_frozen();
"""


def chain_existing_events(apps, schema_editor):
    """Events written before the chain existed get their links, in id order per tenant."""
    import hashlib

    from gateway.lib.digest import canonical_json

    Event = apps.get_model("gateway", "EffectEvent")
    Head = apps.get_model("gateway", "AuditChainHead")
    tenants = Event.objects.values_list("tenant_id", flat=True).distinct()
    for tenant_id in tenants:
        previous, count, last_id = "0" * 64, 0, None
        for event in Event.objects.filter(tenant_id=tenant_id).order_by("id").iterator():
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
            digest = hashlib.sha256(previous.encode() + canonical_json(body)).hexdigest()
            Event.objects.filter(pk=event.pk).update(prev_hash=previous, hash=digest)
            previous, count, last_id = digest, count + 1, event.pk
        Head.objects.update_or_create(
            tenant_id=tenant_id,
            defaults={"last_hash": previous, "last_event_id": last_id, "length": count},
        )


def install_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTIONS, params=None)
        schema_editor.execute(TRIGGERS, params=None)


def remove_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("gateway", "0003_capabilities_audit_chain")]

    operations = [
        migrations.RunPython(chain_existing_events, migrations.RunPython.noop),
        migrations.RunPython(install_triggers, remove_triggers),
    ]
