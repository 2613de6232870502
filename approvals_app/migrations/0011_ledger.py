"""The tamper-evident ledger (issue 31, docs/LEDGER.md): its table, its one write path — the SQL
function `warden_ledger_append`, which numbers, stamps and hashes an entry under the ledger's lock —
and a trigger that refuses UPDATE and DELETE always (unlike the other append-only tables, not even
the erasure path may change it). TRUNCATE is not refused: the test suite's flush uses it."""

from django.db import migrations, models

# Keep in step with approvals_app.ledger (timestamp_text, entry_hash): verification recomputes
# exactly this. The lock (28, 0) sits beside the business keys' (26, …) and the freeze gate (27, 0).
APPEND_FUNCTION = r"""
CREATE OR REPLACE FUNCTION warden_ledger_append(p_kind text, p_actor text, p_actor_id integer, p_subject text,
                                                p_payload text, p_body text) RETURNS bigint AS $$
DECLARE
    v_seq bigint;
    v_prev text;
    v_last timestamptz;
    v_at timestamptz;
    v_hash text;
BEGIN
    -- One appender at a time until its transaction ends: the next one reads (with a snapshot taken
    -- after the lock) the entry this one wrote, so the chain never forks and seq is gap-free.
    PERFORM pg_advisory_xact_lock(28, 0);
    SELECT seq, hash, created_at INTO v_seq, v_prev, v_last
      FROM approvals_app_ledgerentry ORDER BY seq DESC LIMIT 1;
    v_seq := coalesce(v_seq, 0) + 1;
    v_prev := coalesce(v_prev, repeat('0', 64));
    -- Never before the last entry: seq order is time order, so a time range is a seq range.
    v_at := greatest(clock_timestamp(), coalesce(v_last, '-infinity'::timestamptz));
    v_hash := encode(sha256(convert_to(
        v_prev || E'\n' || v_seq::text || E'\n'
        || to_char(v_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || E'\n' || p_body, 'UTF8')), 'hex');
    INSERT INTO approvals_app_ledgerentry (seq, created_at, kind, actor, actor_id, subject, payload, prev_hash, hash)
    VALUES (v_seq, v_at, p_kind, p_actor, p_actor_id, p_subject, p_payload, v_prev, v_hash);
    RETURN v_seq;
END;
$$ LANGUAGE plpgsql VOLATILE;

CREATE OR REPLACE FUNCTION warden_ledger_refuse() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % refused', TG_OP USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_entry_append_only
BEFORE UPDATE OR DELETE ON approvals_app_ledgerentry
FOR EACH ROW EXECUTE FUNCTION warden_ledger_refuse();
"""

DROP_FUNCTION = """
DROP TRIGGER IF EXISTS ledger_entry_append_only ON approvals_app_ledgerentry;
DROP FUNCTION IF EXISTS warden_ledger_refuse();
DROP FUNCTION IF EXISTS warden_ledger_append(text, text, integer, text, text, text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('approvals_app', '0010_edit_on_approve'),
    ]

    operations = [
        migrations.CreateModel(
            name='LedgerEntry',
            fields=[
                ('seq', models.BigIntegerField(primary_key=True, serialize=False)),
                ('created_at', models.DateTimeField()),
                ('kind', models.CharField(max_length=40)),
                ('actor', models.CharField(max_length=150)),
                ('actor_id', models.IntegerField(blank=True, null=True)),
                ('subject', models.CharField(max_length=100)),
                ('payload', models.TextField()),
                ('prev_hash', models.CharField(max_length=64)),
                ('hash', models.CharField(max_length=64)),
            ],
            options={
                'verbose_name_plural': 'ledger entries',
                'ordering': ['seq'],
                'permissions': [('export_ledger', 'Can export the tamper-evident ledger')],
                'indexes': [models.Index(fields=['created_at'], name='ledger_entry_created')],
            },
        ),
        migrations.RunSQL(APPEND_FUNCTION, reverse_sql=DROP_FUNCTION),
    ]
