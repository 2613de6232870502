"""What PostgreSQL can store, checked on input (a database helper of the infrastructure layer): a
value refused here is a clear error, never a database error after validation."""


def storable_text(value: str) -> str:
    # PostgreSQL text cannot hold NUL, and lone surrogates cannot be encoded as UTF-8: both
    # would otherwise surface as a database error after validation.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode (no lone surrogates)") from exc
    return value
