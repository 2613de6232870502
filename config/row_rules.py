"""A hot table's row invariants: named rules, checked by ONE constraint that calls a PL/pgSQL function.

Why not a CHECK constraint per rule, as everywhere else: PostgreSQL reads each CHECK of a table
from its stored text and plans it anew in every statement that writes the table (ExecConstraints
builds them per statement, not per connection). A run row carries thirteen rules, ~25 KB of stored
expression; the engine's one-statement step commits (engine/state/fast.py) write a run, its steps,
tool calls and messages in every model turn, and at a thousand runs in flight reading those
expressions was 18 % of PostgreSQL's CPU. A PL/pgSQL function is compiled once per connection: the
table's constraint is one call.

The rules stay what they were: Django Q conditions with their names, kept beside the model. The
function is generated from them — each rule's SQL is the SQL Django would have put in its own CHECK
— and raises a check_violation naming the rule a row breaks, as that CHECK would have. A migration
creates it with its text frozen there; tests/foundation/test_row_rules.py fails when the rules and
the database's function differ (a changed rule needs a migration: `function_sql()` gives its text).
"""

from dataclasses import dataclass

from django.db import connection as default_connection
from django.db import models
from django.db.models import F, Func, Q


def _fields(condition: Q) -> list[str]:
    """The field names a condition reads, in order of first appearance."""
    found: list[str] = []
    for child in condition.children:
        names = _fields(child) if isinstance(child, Q) else [child[0].split("__")[0]]
        found += [name for name in names if name not in found]
    return found


@dataclass(frozen=True)
class RowRules:
    """One table's rules (name, condition) and the function and constraint that check them."""

    table: str  # the model's db_table, for the error a broken rule raises
    function: str
    name: str  # the table's one constraint
    rules: tuple[tuple[str, Q], ...]

    def fields(self) -> list[str]:
        found: list[str] = []
        for _, condition in self.rules:
            found += [name for name in _fields(condition) if name not in found]
        return found

    def constraint(self) -> models.CheckConstraint:
        call = Func(*(F(name) for name in self.fields()), function=self.function, output_field=models.BooleanField())
        return models.CheckConstraint(condition=call, name=self.name)

    def function_sql(self, model, connection=default_connection) -> str:
        """CREATE OR REPLACE FUNCTION: the rules' CHECK expressions, over parameters named after the
        columns, raising check_violation with the name of a rule the row breaks (NULL passes, as a
        CHECK lets it)."""
        editor = connection.schema_editor()
        params = []
        for name in self.fields():
            field = model._meta.get_field(name)
            params.append(f"{editor.quote_name(field.column)} {field.db_type(connection).split('(')[0]}")
        sqls = [models.CheckConstraint(condition=condition, name=rule)._get_check_sql(model, editor)
                for rule, condition in self.rules]
        # Every rule at once first: the common case is one expression, not one per rule (PL/pgSQL
        # prepares each expression anew in every transaction). Only a row failing it (or NULL
        # somewhere, which passes) is looked at rule by rule.
        checks = [f"    IF {' AND '.join(f'({sql})' for sql in sqls)} THEN\n        RETURN true;\n    END IF;\n"]
        for (rule, _), sql in zip(self.rules, sqls):
            message = editor.quote_value(f'new row for relation "{self.table}" violates check constraint "{rule}"')
            checks.append(
                f"    IF NOT ({sql}) THEN\n"
                f"        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = {message},\n"
                f"            CONSTRAINT = {editor.quote_value(rule)}, TABLE = {editor.quote_value(self.table)};\n"
                f"    END IF;\n"
            )
        return (
            f"CREATE OR REPLACE FUNCTION {self.function}({', '.join(params)}) RETURNS boolean\n"
            f"LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $rules$\nBEGIN\n{''.join(checks)}    RETURN true;\nEND\n$rules$"
        )

    def function_body(self, model, connection=default_connection) -> str:
        """The function's body as PostgreSQL stores it (pg_proc.prosrc)."""
        return self.function_sql(model, connection).split("$rules$")[1]
