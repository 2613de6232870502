"""Reading the project's own source in tests (the floor plan's and the state module's checks)."""

import ast


def source_tree(source: str, filename: str = "<source>") -> ast.Module:
    """`ast.parse(source)`. The CPython 3.11 here (3.11.7) keeps the AST converter's recursion counter per
    interpreter, not per call (gh-106905): when another thread parses at the same moment — Python 3.11's
    traceback module parses source lines to underline errors, so any thread logging an exception does —
    the conversion fails with "AST constructor recursion depth mismatch". Parsing is deterministic, so
    such a failure is the interpreter's, never the file's: it is parsed again."""
    for attempt in range(5):
        try:
            return ast.parse(source, filename)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error) or attempt == 4:
                raise
    raise AssertionError("unreachable")
