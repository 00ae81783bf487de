"""Effects per (tenant, type, status), kept by a periodic pass over the sealed audit chain, so
that /metrics stops counting the whole effect table at every scrape (reconciliation.tally).
Both tables are new and empty: the pass fills them from the start of each chain."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('gateway', '0015_flat_ledger_indexes'),
        ('reconciliation', '0003_record_recent_lookup'),
    ]

    operations = [
        migrations.CreateModel(
            name='TallyHead',
            fields=[
                ('tenant', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, primary_key=True, related_name='+', serialize=False, to='gateway.tenant')),
                ('position', models.BigIntegerField(default=0)),
                ('counted_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='EffectTally',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('type', models.CharField(max_length=100)),
                ('status', models.CharField(max_length=24)),
                ('count', models.BigIntegerField(default=0)),
                ('tenant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='gateway.tenant')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant', 'type', 'status'), name='tally_key')],
            },
        ),
    ]
