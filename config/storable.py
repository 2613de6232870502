"""What PostgreSQL can store, checked on input (a database helper of the infrastructure layer): a
value refused here is a clear error, never a database error after validation."""

import json


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


# Every JSON document Warden stores from outside (API bodies, a model's tool arguments) is at most
# this deep and this long (issue 27, finding 3): deeper documents broke every later read of them.
JSON_MAX_DEPTH = 32
JSON_MAX_CHARS = 256 * 1024
TOO_DEEP = f"[nested deeper than {JSON_MAX_DEPTH} levels: not shown]"


def _too_deep(value, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def json_problem(value) -> str:
    """Why `value` may not be stored ("" when it may): too deep, too long, or holding NUL or a lone
    surrogate (which PostgreSQL's jsonb cannot)."""
    if _too_deep(value, JSON_MAX_DEPTH):
        return f"must not be nested deeper than {JSON_MAX_DEPTH} levels"
    text = json.dumps(value, default=str)
    if len(text) > JSON_MAX_CHARS:
        return f"must be at most {JSON_MAX_CHARS} characters as JSON"
    if "\\u0000" in text:
        return "must not contain NUL characters"
    try:
        json.dumps(value, default=str, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no lone surrogates)"
    return ""


def storable_json(value):
    """A validator of JSON input: `value`, or ValueError saying why it cannot be stored."""
    if problem := json_problem(value):
        raise ValueError(problem)
    return value


def json_shown(value, _depth: int = 1):
    """A stored document as a read shows it: whatever lies deeper than JSON_MAX_DEPTH (stored before
    the limit, or by a path that skipped it) is replaced by a marker, so no read can fail on it."""
    if not isinstance(value, (dict, list)):
        return value
    if _depth > JSON_MAX_DEPTH:
        return TOO_DEEP
    if not _too_deep(value, JSON_MAX_DEPTH - _depth + 1):
        return value  # the common case: returned as it is, nothing copied
    if isinstance(value, dict):
        return {key: json_shown(child, _depth + 1) for key, child in value.items()}
    return [json_shown(child, _depth + 1) for child in value]
