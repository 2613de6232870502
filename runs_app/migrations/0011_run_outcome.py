"""A run's outcome beside its status: what its writes came to (applied, not applied, rejected,
expired, or no write asked for). `run_end` sets it when the run ends; this fills it in for the
runs that ended before it existed, by the same rule as tools_app.selectors.run_outcome."""

from django.db import migrations, models

FILL = """
UPDATE runs_app_run AS r SET outcome = CASE
    WHEN w.applied > 0 THEN 'applied'
    WHEN w.rejected > 0 THEN 'rejected'
    WHEN w.expired > 0 THEN 'expired'
    WHEN w.writes > 0 THEN 'not_applied'
    ELSE 'none' END
FROM (
    SELECT run.id,
           count(c.id) AS writes,
           count(c.id) FILTER (WHERE c.status = 'succeeded') AS applied,
           count(a.id) FILTER (WHERE a.status = 'rejected') AS rejected,
           count(a.id) FILTER (WHERE a.status = 'expired') AS expired
    FROM runs_app_run AS run
    LEFT JOIN tools_app_toolcall AS c ON c.run_id = run.id AND c.effect = 'write'
    LEFT JOIN approvals_app_approval AS a ON a.tool_call_id = c.id
    WHERE run.status IN ('completed', 'failed', 'cancelled') AND run.outcome = ''
    GROUP BY run.id
) AS w
WHERE r.id = w.id;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("runs_app", "0010_run_budgets_set_by"),
        ("tools_app", "0003_unknown_tool_call_queue"),
        ("approvals_app", "0004_approval_withdrawn"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="outcome",
            field=models.CharField(
                blank=True, max_length=12,
                choices=[("applied", "Effects applied"), ("not_applied", "Not applied"), ("rejected", "Rejected"),
                         ("expired", "Expired"), ("none", "No write asked for")],
            ),
        ),
        migrations.RunSQL(FILL, migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["outcome", "-created_at", "-id"], name="run_outcome_recent"),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(("outcome", ""), ("outcome__in", ["applied", "not_applied", "rejected", "expired", "none"]),
                                   _connector="OR"),
                name="run_outcome_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ("completed", "failed", "cancelled")), ("outcome", ""), _connector="OR"),
                name="run_outcome_only_when_ended",
            ),
        ),
    ]
