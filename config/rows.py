"""Model instances from the rows of hand-written statements.

The ORM compiles its SQL again on every call: for a run row of forty columns that costs a worker
more CPU than the round trip to PostgreSQL. The engine's hot paths read a few fixed shapes of row,
so they name the columns once (`columns`) and build instances from what comes back (`instance`),
each value through its field's database converters exactly as the ORM's iterator converts it
(JSON columns arrive as text on Django's connections, for instance).
"""

import functools

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
