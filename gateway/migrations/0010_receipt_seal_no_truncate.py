"""Receipts get a seal (gateway.checkpoints), and the append-only tables refuse TRUNCATE.

Row triggers (0004) do not fire on TRUNCATE, so ``TRUNCATE gateway_effectevent,
gateway_auditchainhead`` emptied the history without a single refused row. A statement
trigger now refuses it for every role that does not own the table. The owner (the migration
role) is let through: it can drop any trigger anyway, so refusing it would add friction and no
protection — and Django's test flush runs as the owner. The app's role must therefore not own
the tables (docs/security.md, and ``manage.py check --deploy`` warns when it does); against
the owner, the signed checkpoints outside the database are the control.
"""

from django.db import migrations, models

TABLES = ("gateway_effectevent", "gateway_receipt", "gateway_command", "gateway_auditchainhead")

FUNCTION = """
CREATE OR REPLACE FUNCTION gateway_refuse_truncate() RETURNS trigger AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE')
    THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'table % is append-only: TRUNCATE refused', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION, params=None)
    for table in TABLES:
        schema_editor.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION gateway_refuse_truncate();",
            params=None,
        )


def remove(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};")
    schema_editor.execute("DROP FUNCTION IF EXISTS gateway_refuse_truncate();")


class Migration(migrations.Migration):
    dependencies = [("gateway", "0009_token_lifecycle")]

    operations = [
        migrations.AddField(
            model_name="receipt",
            name="seal",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.RunPython(install, remove),
    ]
