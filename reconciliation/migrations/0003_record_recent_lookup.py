"""The reconciler's probe asks which providers were looked up recently; without this index it
read every reconciliation record at each sweep (tests/benchmarks/ledger_scale.py). Built
CONCURRENTLY: no lock on writes while it builds, so the migration is not atomic."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("reconciliation", "0002_effect_claims"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="reconciliationrecord",
            index=models.Index(
                condition=models.Q(("kind", "lookup")),
                fields=["created_at"],
                name="record_recent_lookup",
            ),
        ),
    ]
