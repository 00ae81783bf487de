"""Fewer indexes to maintain on every write of the hot path.

Each effect is written three times (submit, claim, record) and none of those updates is HOT
(the status is indexed), so every index on gateway_effect takes a new entry three times per
effect; the events, the attempt and the receipt add theirs. Dropped here, each checked with
EXPLAIN against the queries of the code and of tests/benchmarks/ledger_scale.py:

- single-column foreign-key indexes that a composite index already starts with (an effect's
  or a command's tenant, an event's tenant and effect, an attempt's and a receipt's effect);
- the ``varchar_pattern_ops`` twins Django adds to every indexed text column: they serve only
  ``LIKE 'prefix%'`` under a non-C collation, and nothing queries an identifier with LIKE.

(Written on a branch as 0030; renumbered 0012 when the branches met.)
"""

import django.db.models.deletion
from django.db import migrations, models


# The text columns that keep their ordinary index (a primary key, a nullable reference) but
# lose the pattern-ops twin. Names as Django created them (deterministic from table + column).
_LIKE_TWINS = [
    ("gateway_effect_effect_id_2025bab1_like", "gateway_effect", "effect_id"),
    ("gateway_effect_compensated_by_id_202e5383_like", "gateway_effect", "compensated_by_id"),
    ("gateway_command_effect_id_3e1d387a_like", "gateway_command", "effect_id"),
    ("gateway_command_compensates_id_d1506f8e_like", "gateway_command", "compensates_id"),
    ("gateway_command_capability_id_669a1e6b_like", "gateway_command", "capability_id"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0011_attempt_abandoned"),
    ]

    operations = [
        migrations.AlterField(
            model_name="attempt",
            name="effect",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="attempts",
                to="gateway.effect",
            ),
        ),
        migrations.AlterField(
            model_name="command",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="commands",
                to="gateway.tenant",
            ),
        ),
        migrations.AlterField(
            model_name="effect",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="effects",
                to="gateway.tenant",
            ),
        ),
        migrations.AlterField(
            model_name="effectevent",
            name="effect",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="gateway.effect",
            ),
        ),
        migrations.AlterField(
            model_name="effectevent",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="gateway.tenant",
            ),
        ),
        migrations.AlterField(
            model_name="receipt",
            name="effect",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="receipts",
                to="gateway.effect",
            ),
        ),
        migrations.RunSQL(
            [f"DROP INDEX IF EXISTS {name}" for name, _, _ in _LIKE_TWINS],
            [
                f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({column} varchar_pattern_ops)"
                for name, table, column in _LIKE_TWINS
            ],
        ),
    ]
