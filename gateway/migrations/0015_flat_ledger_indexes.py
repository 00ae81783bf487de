"""Indexes that keep console pages and webhook lookups flat on a large ledger.

Each serves a query that, without it, read a whole table (measured by
tests/benchmarks/ledger_scale.py at 1 M and 5 M effects, docs/performance.md):

- ``command_digest``: the approvals inbox's look-alikes (same digest under another key), at
  every poll of the inbox;
- ``command_customer``: the console's search by customer id (only payloads naming one);
- ``effect_operation``: a provider webhook naming the operation but not the key, and the
  search by provider operation id (only effects the provider answered);
- ``receipt_operation``: the search by an operation id named in any receipt.

Hash indexes: each serves equality only, at about a third of a b-tree's size. Built
CONCURRENTLY (no lock on writes while they build: minutes on a ledger of millions), so this
migration is not atomic; a failed build leaves an INVALID index to drop before re-running.
"""

import django.contrib.postgres.indexes
import django.db.models.fields.json
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("gateway", "0014_lean_hot_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="command",
            index=django.contrib.postgres.indexes.HashIndex(
                fields=["payload_digest"], name="command_digest"
            ),
        ),
        AddIndexConcurrently(
            model_name="command",
            index=django.contrib.postgres.indexes.HashIndex(
                django.db.models.fields.json.KeyTextTransform("customer_id", "payload_redacted"),
                condition=models.Q(("payload_redacted__has_key", "customer_id")),
                name="command_customer",
            ),
        ),
        AddIndexConcurrently(
            model_name="effect",
            index=django.contrib.postgres.indexes.HashIndex(
                condition=models.Q(("provider_operation_id", ""), _negated=True),
                fields=["provider_operation_id"],
                name="effect_operation",
            ),
        ),
        AddIndexConcurrently(
            model_name="receipt",
            index=django.contrib.postgres.indexes.HashIndex(
                fields=["provider_operation_id"], name="receipt_operation"
            ),
        ),
    ]
