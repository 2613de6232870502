"""Model instances from the rows of hand-written statements.

The ORM compiles its SQL again on every call: for a run row of forty columns that costs a worker
more CPU than the round trip to PostgreSQL. The engine's hot paths read a few fixed shapes of row,
so they name the columns once (`columns`) and build instances from what comes back (`instance`),
each value through its field's database converters exactly as the ORM's iterator converts it
(JSON columns arrive as text on Django's connections, for instance).
"""

import functools
import json

from django.db import connection


@functools.cache
def _layout(model) -> tuple[tuple[str, ...], tuple[str, ...], tuple]:
    fields = model._meta.concrete_fields
    converters = []
    for position, field in enumerate(fields):
        col = field.get_col(model._meta.db_table)
        found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        if found:
            converters.append((position, col, tuple(found)))
    return tuple(f.attname for f in fields), tuple(f.column for f in fields), tuple(converters)


def columns(model, alias: str) -> str:
    """The model's concrete columns, in field order, for a SELECT list: `"alias"."column", ...`."""
    return ", ".join(f'"{alias}"."{column}"' for column in _layout(model)[1])


def width(model) -> int:
    return len(_layout(model)[1])


def instance(model, row, offset: int = 0):
    """The instance for `row[offset:offset + width(model)]` (selected with `columns`), as the ORM
    would have loaded it."""
    attnames, names, converters = _layout(model)
    values = list(row[offset:offset + len(names)])
    for position, col, found in converters:
        for convert in found:
            values[position] = convert(values[position], col, connection)
    return model.from_db(connection.alias, attnames, values)


def insert_list(model, values: dict[str, str]) -> tuple[str, str]:
    """The column list and the matching SQL expressions of an INSERT … SELECT of `model`, from its
    concrete fields: `values` gives the expression of each field it names (by attname); every
    other field gets the value the ORM would give it (its default: NULL, a constant, '' for text,
    an empty JSON document) — so a field added to the model is written by the statement too, or
    refused here when its default is no constant a statement can spell."""
    columns, expressions = [], []
    for field in model._meta.concrete_fields:
        if field.primary_key and field.attname not in values:
            continue  # the database's (a serial id)
        expression = values[field.attname] if field.attname in values else _literal(field.get_default(), field)
        columns.append(f'"{field.column}"')
        expressions.append(expression)
    return ", ".join(columns), ", ".join(expressions)


def _literal(value, field) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (dict, list)):
        return "'" + json.dumps(value).replace("'", "''") + "'::jsonb"
    raise ValueError(f"{field.model.__name__}.{field.attname}: no value for the statement and no default it can spell")
