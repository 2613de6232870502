"""The task queue's doorbell (issue 16): django-q2's ORM broker, except that queueing a task also
rings a PostgreSQL NOTIFY, and an idle cluster waits for it on a connection of its own (which
LISTENs, and claims) instead of sleeping `poll` between queries. Pickup after a commit is then a
notification's trip, not half a poll interval.

What rings no bell is still found by looking: a task whose claim ran out (`retry`) is looked for
when its lock falls due, and every WARDEN_Q_FALLBACK_POLL_SECONDS the queue is looked at anyway
(a notification sent while the listener was reconnecting is covered by looking after LISTEN)."""

import logging
import os
from datetime import timedelta
from time import monotonic, sleep

import psycopg
from django.conf import settings
from django.db import connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ

logger = logging.getLogger("warden.queue")

CHANNEL = "warden_queue"
# How the listener shows in pg_stat_activity.
LISTENER_APPLICATION_NAME = "warden-queue-listener"
# django-q2's pusher checks its stop event only between dequeue() calls: an idle wait returns
# this often, so a cluster stops within a second.
WAIT_SLICE_SECONDS = 1.0
# Between attempts while the database stays unreachable, so an outage is not a busy loop.
RETRY_PAUSE_SECONDS = 1.0


def _orm_q_names() -> tuple[str, ...]:
    """OrmQ's table and its id, key, payload and lock columns, quoted for SQL."""
    meta, quote = OrmQ._meta, connections[Conf.ORM].ops.quote_name
    return quote(meta.db_table), *(quote(meta.get_field(name).column) for name in ("id", "key", "payload", "lock"))


class DoorbellBroker(ORM):
    """Rows identical to the ORM broker's (key, payload, lock), claimed with the lock it would give them."""

    def __init__(self, list_key: str = None):
        super().__init__(list_key=list_key)
        self._listener_forget()

    def __setstate__(self, state):
        super().__setstate__(state)
        self._listener_forget()

    def enqueue(self, task):
        # One round trip: the row and its notification, delivered when the row commits. Queued on
        # its own (as run_enqueue does, after the caller's commit) the row is only a doorbell — a
        # crash losing it is what the sweeper's re-enqueue of stale queued runs covers, as it
        # covers a process dying before enqueueing — so its commit does not wait for the WAL
        # flush. Inside a caller's transaction nothing is changed: it commits as durably as theirs.
        self.get_connection()  # the parent's hygiene: stale connections closed outside a transaction
        key = self.list_key or Conf.CLUSTER_NAME
        db = connections[Conf.ORM]
        table, pk, key_column, payload, lock = _orm_q_names()
        flush = "" if db.in_atomic_block else ", set_config('synchronous_commit', 'off', true)"
        with db.cursor() as cursor:
            cursor.execute(
                f"WITH queued AS (INSERT INTO {table} ({key_column}, {payload}, {lock}) VALUES (%s, %s, %s) RETURNING {pk}) "
                f"SELECT queued.{pk}, pg_notify(%s, %s){flush} FROM queued",
                [key, task, timezone.now(), CHANNEL, key],
            )
            return cursor.fetchone()[0]

    def delete(self, task_id):
        """The parent's delete in one statement (Django's collects the row before deleting it): the
        monitor acknowledges every task this way. An acknowledgement lost in a crash hands the task
        out again, which the run's lease makes harmless: its commit need not wait for the WAL flush."""
        self.get_connection()  # the parent's hygiene, as in enqueue
        db = connections[Conf.ORM]
        table, pk, *_ = _orm_q_names()
        flush = "" if db.in_atomic_block else ", set_config('synchronous_commit', 'off', true)"
        with db.cursor() as cursor:
            cursor.execute(f"WITH gone AS (DELETE FROM {table} WHERE {pk} = %s RETURNING 1) "
                           f"SELECT (SELECT count(*) FROM gone){flush}", [task_id])

    def dequeue(self):
        try:
            self._listen()
            if monotonic() < self._next_look and not self._rung(timeout=min(WAIT_SLICE_SECONDS, self._next_look - monotonic())):
                return None
            tasks = self._claim()
            self._next_look = 0.0 if tasks else self._next_look_when_idle()
        except psycopg.Error as error:
            self._trouble(error)
            return None
        if self._failing:
            logger.info("task queue: database reachable again")
            self._failing = False
        return tasks or None

    def _claim(self) -> list:
        """The parent's claim in one statement: due rows get the lock its compare-and-set would
        give them (now + retry); SKIP LOCKED passes over rows another cluster is taking, and a row
        another cluster took first no longer matches `lock < now` when re-checked."""
        now = timezone.now()
        table, pk, key, payload, lock = _orm_q_names()
        return sorted(self._listener.execute(
            f"UPDATE {table} SET {lock} = %s WHERE {pk} IN (SELECT {pk} FROM {table} WHERE {key} = %s AND {lock} < %s "
            f"ORDER BY {pk} LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {pk}, {payload}",
            [now + timedelta(seconds=Conf.RETRY), self.list_key, now, Conf.BULK],
        ).fetchall())

    def _next_look_when_idle(self) -> float:
        """When to look again with no bell: when the earliest lock falls due (a claim that ran out,
        or a row stamped by a host whose clock is ahead), at the latest after the fallback poll."""
        wait = settings.WARDEN_Q_FALLBACK_POLL_SECONDS
        table, _, key, _, lock = _orm_q_names()
        (earliest,) = self._listener.execute(f"SELECT min({lock}) FROM {table} WHERE {key} = %s", [self.list_key]).fetchone()
        if earliest is not None:
            # At least a poll apart: a row due now but not claimed was just taken by another cluster.
            wait = min(wait, max(Conf.POLL, (earliest - timezone.now()).total_seconds()))
        return monotonic() + wait

    def _listen(self) -> None:
        """The broker's own connection, in the process that dequeues: it listens, and claims."""
        if self._listener is not None and self._listener_pid == os.getpid() and not self._listener.closed:
            return
        # A listener inherited across a fork is the parent's: dropped, never closed here (closing
        # would end the parent's session; psycopg does not close it when collected in a child).
        self._listener = None
        params = connections[Conf.ORM].get_connection_params()
        # A claim lost in a crash only hands its task out again, which the run's lease makes
        # harmless: its commit need not wait for the WAL flush.
        options = f"{params.get('options', '')} -c synchronous_commit=off".strip()
        listener = psycopg.connect(**(params | {"autocommit": True, "application_name": LISTENER_APPLICATION_NAME,
                                                "options": options}))
        listener.execute(f"LISTEN {CHANNEL}")
        self._listener, self._listener_pid = listener, os.getpid()
        # LISTEN first, then look: a task queued before the listener existed rang no bell we heard.
        self._next_look = 0.0

    def _rung(self, *, timeout: float) -> bool:
        """Wait up to `timeout` for a notification; then take every one already received, so a
        burst of them costs one look at the queue."""
        received = list(self._listener.notifies(timeout=max(0.0, timeout), stop_after=1))
        if received:
            received += self._listener.notifies(timeout=0)
        return any(notify.payload == self.list_key for notify in received)

    def _trouble(self, error: Exception) -> None:
        self.listener_close()
        self._next_look = 0.0
        if self._failing:
            sleep(RETRY_PAUSE_SECONDS)
        else:
            # The first failure is retried at once: a listener whose backend was ended is routine.
            logger.warning("task queue: database connection lost (%s); reconnecting", error)
            self._failing = True

    def listener_close(self) -> None:
        """Close the broker's own connection now (a pusher's closes with its process)."""
        listener, self._listener = self._listener, None
        if listener is not None and self._listener_pid == os.getpid():
            try:
                listener.close()
            except psycopg.Error:
                pass

    def _listener_forget(self) -> None:
        self._listener = None
        self._listener_pid = None
        self._next_look = 0.0  # monotonic time of the next look at the queue without a bell
        self._failing = False
