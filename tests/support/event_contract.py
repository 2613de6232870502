"""docs/EVENTS.md is the event contract: which RunEvent types exist and which payload fields each
may carry. This reads it, and keeps track of what the suite's runs actually emitted — in this
process (every bulk insert of RunEvent rows) and in the worker processes tests start (a trigger
on the test database) — so the whole suite fails when a type or field goes undocumented."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "EVENTS.md"
SEEN_TABLE = "test_event_contract_seen"

_HEADING = re.compile(r"^### `([a-z_]+)`\s*$")
_FIELD = re.compile(r"^\|\s*`([a-z_]+)`\s*\|")


def documented() -> dict[str, set[str]]:
    """{event type: its documented payload fields}, from the "Lifecycle events" section."""
    types: dict[str, set[str]] = {}
    current = None
    in_section = False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            in_section = line.strip() == "## Lifecycle events"
            current = None
            continue
        if not in_section:
            continue
        heading = _HEADING.match(line)
        if heading:
            current = heading.group(1)
            types[current] = set()
            continue
        field = _FIELD.match(line)
        if field and current:
            types[current].add(field.group(1))
    return types


def undocumented(seen: dict[str, set[str]]) -> list[str]:
    docs = documented()
    problems = []
    for kind, fields in sorted(seen.items()):
        if kind not in docs:
            problems.append(f"event type {kind!r} is emitted but not documented")
            continue
        for field in sorted(fields - docs[kind]):
            problems.append(f"event {kind!r} carries payload field {field!r}, which is not documented")
    return problems


INSTALL_TRIGGER = f"""
CREATE TABLE IF NOT EXISTS {SEEN_TABLE} (type text NOT NULL, field text NOT NULL, PRIMARY KEY (type, field));
CREATE OR REPLACE FUNCTION {SEEN_TABLE}_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {SEEN_TABLE} VALUES (NEW.type, '') ON CONFLICT DO NOTHING;
    INSERT INTO {SEEN_TABLE} SELECT NEW.type, key FROM jsonb_object_keys(NEW.payload) AS key ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS {SEEN_TABLE}_note ON runs_app_runevent;
CREATE TRIGGER {SEEN_TABLE}_note AFTER INSERT ON runs_app_runevent FOR EACH ROW EXECUTE FUNCTION {SEEN_TABLE}_note();
"""


def seen_in_database(cursor) -> dict[str, set[str]]:
    cursor.execute(f"SELECT type, field FROM {SEEN_TABLE}")
    seen: dict[str, set[str]] = {}
    for kind, field in cursor.fetchall():
        seen.setdefault(kind, set())
        if field:
            seen[kind].add(field)
    return seen
