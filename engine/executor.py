"""Many runs per worker process (issue 34). A model call takes seconds, and a process that drove
one run at a time waited through each of them with nothing else to do. Here django-q2's worker
process stays the queue's consumer and the supervisor's unit (the product is "django-q2 workers
execute runs with select_for_update leases"), but its task only hands the run to one of
WARDEN_RUNS_PER_WORKER threads; each thread drives its run exactly as before — the same claim,
fenced writes and checkpoint — while the others wait on their model streams.

Back-pressure: the task waits for a free slot before it returns, so a full process takes no more
tasks from the queue (they wait in the broker, where another process may take them); after
slot_wait_seconds() without a slot the run goes back to the queue's end and the task ends.

Resources stay per process: one lease keeper (engine/lease.py), and database connections from a
bounded pool (config/settings.py), given back while a run waits on its model (engine/model_step.py).
When the process ends (django-q2 recycles or stops it), its runs yield at their next step.
"""

import contextvars
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from psycopg_pool import ConnectionPool

from config.sockets import readable
from engine.lease import connection_give_back
from engine.loop import drive_stop_soon, run_drive
from engine.queue import run_enqueue_now
from operations import liveness
from runs_app.models import Run, RunStatus

logger = logging.getLogger("warden.engine")


def slot_wait_seconds() -> float:
    """How long a full process holds a task for a run before handing it back to the queue. Short:
    the task is then taken by a process with a free slot (django-q2's worker processes take tasks
    from one queue, whichever is idle first, so a full process can hold a task another could start
    now — with 1,000 runs for 4 × 250 slots, a few runs waited a whole run's length for a slot in the
    process that held them). A run handed back goes to the queue's end; when every process is full,
    each of them takes a task and hands it back about once per wait — a look at the queue, not a
    busy loop. Below django-q2's hard timeout of the task, which would kill the whole process."""
    return max(0.05, min(settings.WARDEN_SLOT_WAIT_SECONDS, settings.Q_CLUSTER["timeout"] / 4))


def _pool_connections() -> None:
    """A process driving many runs takes its database connections from a pool of
    WARDEN_WORKER_DB_POOL_SIZE (a run waits at most 30 s for one), instead of a persistent
    connection per thread: set on the process's first run, whatever started the cluster. A forked
    process never uses its parent's pool (operations/apps.py)."""
    settings_dict = connections.settings[DEFAULT_DB_ALIAS]
    if settings_dict["OPTIONS"].get("pool"):
        return
    connections.close_all()
    settings_dict["CONN_MAX_AGE"] = 0  # Django's pool refuses persistent connections
    # Django's health check is a round trip per checkout, and a run checks a connection out after
    # every model call: the pool's check looks at the socket instead (_idle_check).
    settings_dict["CONN_HEALTH_CHECKS"] = False
    # A new OPTIONS dict: the other aliases (the lease keeper's, the live layer's) share the old one.
    settings_dict["OPTIONS"] = {**settings_dict["OPTIONS"], "pool": {
        "min_size": 1, "max_size": settings.WARDEN_WORKER_DB_POOL_SIZE, "timeout": 30, "max_idle": 60}}
    connections[DEFAULT_DB_ALIAS].pool._check = _idle_check  # psycopg_pool keeps its check there


def _idle_check(conn) -> None:
    """Before a pooled connection is handed out: an idle connection has nothing to read unless the
    server closed it (a restart, an idle timeout) or sent a notice — only then is it asked, and a
    dead one is replaced (psycopg_pool's own check raises for it)."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("connection closed")
    if readable(conn.fileno()):
        ConnectionPool.check_connection(conn)


class RunExecutor:
    def __init__(self, size: int):
        _pool_connections()
        self.size = size
        self._slots = threading.BoundedSemaphore(size)
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="run")
        self._pid = os.getpid()

    def submit(self, run_id: str) -> str:
        # With a slot free, the run goes to its thread at once: the thread's claim refuses a run
        # that is not queued. This thread takes the queue's tasks one after another while the runs'
        # threads hold the GIL and the pool's connections, so it asks the database nothing then.
        if not self._slots.acquire(blocking=False) and (refused := self._slot_wait(run_id)):
            return refused
        liveness.gauge_add("runs_in_flight", 1)
        try:
            # A fresh context per run: log fields and spans never leak from the thread's last run.
            self._threads.submit(contextvars.Context().run, self._drive, run_id)
        except BaseException:
            liveness.gauge_add("runs_in_flight", -1)
            self._slots.release()
            raise
        return "submitted"

    def _slot_wait(self, run_id: str) -> str | None:
        """Every slot busy: a task for a run that is not queued (a duplicate: the sweeper re-announces
        runs that wait long in the queue) ends at once rather than wait behind the runs in flight;
        a queued one waits for a slot, and after slot_wait_seconds goes back to the queue. None: a
        slot is taken; else why the task ends."""
        queued = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).exists()
        connection_give_back()
        if not queued:
            liveness.count("tasks:not-claimable")
            return "not-claimable"
        if not self._slots.acquire(timeout=slot_wait_seconds()):
            liveness.count("tasks:no-free-slot")
            run_enqueue_now(run_id)  # every slot busy all that time: back to the queue
            return "no-free-slot"
        return None

    def _drive(self, run_id: str) -> None:
        try:
            run_drive(run_id=run_id)
        except Exception:  # run_drive handles its own; this is a bug in the plumbing around it
            logger.exception("run %s: the worker thread failed", run_id)
        finally:
            try:
                if settings.WARDEN_CUSTOMER_MAX_RUNNING:
                    _announce_next_of_owner(run_id)
            except Exception:  # noqa: BLE001 - the sweeper re-announces queued runs anyway
                logger.warning("run %s: could not announce its owner's next run", run_id, exc_info=True)
            connections.close_all()  # back to the pool: a thread holds no connection between runs
            liveness.gauge_add("runs_in_flight", -1)
            self._slots.release()


def _announce_next_of_owner(run_id: str) -> None:
    """With a per-customer limit, a claim refused for it leaves the run queued; when one of that
    customer's runs stops running, their oldest queued run is asked for again."""
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT q."id" FROM "runs_app_run" q JOIN "sessions_app_session" qs ON qs."id" = q."session_id" '
            'WHERE q."status" = %s AND qs."owner_id" = (SELECT s."owner_id" FROM "runs_app_run" r '
            'JOIN "sessions_app_session" s ON s."id" = r."session_id" WHERE r."id" = %s) '
            'ORDER BY q."updated_at" LIMIT 1', [RunStatus.QUEUED, run_id])
        row = cursor.fetchone()
    if row is not None:
        transaction.on_commit(lambda: run_enqueue_now(row[0]))


_executor: RunExecutor | None = None
_executor_lock = threading.Lock()


def run_executor() -> RunExecutor:
    """This process's executor, made on its first task (a forked child makes its own)."""
    global _executor
    with _executor_lock:
        if _executor is None or _executor._pid != os.getpid():
            _executor = RunExecutor(settings.WARDEN_RUNS_PER_WORKER)
            # Before concurrent.futures joins the threads at exit (its hook was registered
            # first; these hooks run last-registered first): runs yield at their next step.
            threading._register_atexit(drive_stop_soon)
        return _executor
