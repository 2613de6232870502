"""Who set a run's budgets, and the permission to set them above the configured caps (issue 12,
finding 5: customers could raise their own budgets 50×)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs_app', '0009_operations'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='run',
            options={'ordering': ['-created_at', '-id'], 'permissions': [('exceed_budget_caps', "Can set a run's budgets above the configured caps")]},
        ),
        migrations.AddField(
            model_name='run',
            name='budgets_set_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
    ]
