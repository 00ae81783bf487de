from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("gateway", "0025_signed_approvals"),
    ]

    operations = [
        migrations.AddField(
            model_name="providercredential",
            name="rate_limit",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
    ]
