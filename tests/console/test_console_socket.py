"""The console's websocket against a real daphne (and real workers where runs must move):
who may connect and watch, nothing lost or doubled on reconnect, text that joins mid-stream,
and live delivery worker → web → client over both channel layers."""

import json

import pytest
from django.contrib.auth.models import Permission
from django.test import override_settings
from websockets.exceptions import ConnectionClosed, InvalidStatus

from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus
from operations.models import OpenStream
from runs_app.live import session_group
from runs_app.models import Run, RunStatus, Step, StepKind, StepStatus, WaitReason
from demo.model import HELP_TEXT
from engine.state import run_event_append
from sessions_app.models import Message, MessageRole
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from tests.support.console import REDIS_TEST_URL, ConsoleSocket, open_socket, redis_layer, require_redis, session_cookie
from tests.support.factories import ApprovalFactory, RunFactory, UserFactory
from tests.support.processes import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

WEATHER = "What's the weather in Paris?"


def gap_free(seqs: list[int]) -> bool:
    return seqs == list(range(1, len(seqs) + 1))


def run_status(run_id) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


# --- who may connect and watch -------------------------------------------------------------------


@pytest.mark.parametrize("debug", ["0", "1"])
def test_only_the_exact_trusted_origin_may_open_a_socket(procs, debug):
    """The Origin must be one of CSRF_TRUSTED_ORIGINS to the letter — scheme, host and port — with
    DEBUG off and on: a page on another port or scheme of the same host is another site, and the
    browser would send it the logged-in operator's cookie (cross-site websocket hijacking)."""
    procs.base_env["DEBUG"] = debug
    procs.start_web()
    user = UserFactory()
    foreign = [
        "http://127.0.0.1:9999", "https://127.0.0.1:8000", "http://localhost:1", "http://evil.example",
        f"https://127.0.0.1:{procs.port}", f"http://127.0.0.1:{procs.port + 1}", f"http://localhost:{procs.port}",
        f"http://127.0.0.1:{procs.port}/console/", "null",
    ]
    refused = {}
    for origin in foreign:
        with pytest.raises(InvalidStatus) as denied:
            open_socket(procs, user=user, origin=origin)
        refused[origin] = denied.value.response.status_code
    assert refused == {origin: 403 for origin in foreign}
    with ConsoleSocket(open_socket(procs, user=user, origin=procs.base_url)) as console:
        # The console's own origin is let in, and the socket works.
        assert console.subscribe(session_open(owner=user, title="mine").pk)["type"] == "subscribed"


def test_anonymous_handshake_is_refused(procs):
    procs.start_web()
    with pytest.raises(InvalidStatus) as refused:
        open_socket(procs, user=None)
    assert refused.value.response.status_code == 403


def test_another_users_session_is_refused_and_none_of_its_events_arrive(procs):
    procs.start_web()
    owner, stranger = UserFactory(), UserFactory()
    private = session_open(owner=owner, title="private")
    own = session_open(owner=stranger, title="mine")
    with ConsoleSocket(open_socket(procs, user=stranger)) as console:
        refused = console.subscribe(private.pk)
        assert (refused["type"], refused["code"]) == ("error", "not_found")
        console.send(action="post", session=str(private.pk), content="hello", ref="p")
        assert console.until(lambda m: m.get("ref") == "p")["code"] == "not_found"
        assert console.subscribe(own.pk)["type"] == "subscribed"

        # No workers run: each post publishes exactly its run's `queued` event, in this order.
        foreign = message_post(session=private, content="my secret", acting_user=owner).run
        mine = message_post(session=own, content="hello", acting_user=stranger).run
        console.until(lambda m: m["type"] == "events" and m["run_id"] == str(mine.pk))
        console.send(action="cancel", run=str(foreign.pk), ref="c")
        assert console.until(lambda m: m.get("ref") == "c")["code"] == "not_found"
    assert all(str(foreign.pk) not in json.dumps(m) for m in console.received)
    assert run_status(foreign.pk) == RunStatus.QUEUED


def test_leaving_removes_the_console_from_the_sessions_group(procs):
    from channels_postgres.models import GroupChannel

    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="leave")
    members = GroupChannel.objects.filter(group_key=f"asgi:group:{session_group(session.pk)}")
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        assert members.count() == 1
    wait_for(lambda: not members.exists(), message="the closed console to leave the group")


def test_an_operator_may_watch_any_session_but_not_write_in_it(procs):
    procs.start_web()
    owner = UserFactory()
    operator = UserFactory(is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_run"))
    session = session_open(owner=owner, title="watched")
    run = message_post(session=session, content="hello", acting_user=owner).run
    with ConsoleSocket(open_socket(procs, user=operator)) as console:
        subscribed = console.subscribe(session.pk)
        assert subscribed["runs"] == {str(run.pk): 1}
        console.send(action="post", session=str(session.pk), content="not mine", ref="p")
        assert console.until(lambda m: m.get("ref") == "p")["code"] == "not_permitted"


def test_an_open_console_leaves_what_its_user_may_no_longer_see_and_closes_on_logout(procs):
    """Checked on connect and subscribe, and again while the socket stays open."""
    from django.contrib.sessions.models import Session as BrowserSession
    from websockets.exceptions import ConnectionClosed

    procs.base_env["WARDEN_CONSOLE_RECHECK_SECONDS"] = "0.2"
    procs.start_web()
    owner = UserFactory()
    operator = UserFactory(is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_run"))
    session = session_open(owner=owner, title="watched")
    cookie = session_cookie(operator)
    with ConsoleSocket(open_socket(procs, cookie=cookie)) as console:
        assert console.subscribe(session.pk)["type"] == "subscribed"
        operator.user_permissions.clear()
        left = console.until(lambda m: m["type"] == "unsubscribed")
        assert (left["session"], left["reason"]) == (str(session.pk), "access_revoked")
        run = message_post(session=session, content="not for the operator any more", acting_user=owner).run
        BrowserSession.objects.filter(session_key=cookie.removeprefix("sessionid=")).delete()  # logged out
        with pytest.raises(ConnectionClosed) as closed:
            console.until(lambda m: False)
    assert closed.value.rcvd.code == 4401
    assert all(str(run.pk) not in json.dumps(m) for m in console.received)


# --- nothing lost, nothing twice ----------------------------------------------------------------------


def test_reconnecting_catches_up_with_no_gaps_or_duplicates(procs, demo_world):
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    user = UserFactory()
    session = session_open(owner=user, title="reconnect")
    with ConsoleSocket(open_socket(procs, user=user)) as first:
        first.subscribe(session.pk)
        run = message_post(session=session, content=WEATHER, acting_user=user, provider_options={"delay": 0.2}).run
        first.until(lambda m: m["type"] == "events" and "tool_call" in [e["type"] for e in m["events"]])
    seen_first = first.seqs[str(run.pk)]

    # Reconnect while the run goes on: only what the first connection did not see, then live.
    with ConsoleSocket(open_socket(procs, user=user)) as second:
        subscribed = second.subscribe(session.pk, after={str(run.pk): seen_first[-1]})
        second.until_run_status(run.pk, {"completed", "failed"})
    assert subscribed["runs"][str(run.pk)] >= seen_first[-1]
    combined = seen_first + second.seqs[str(run.pk)]
    assert gap_free(combined), combined
    assert Run.objects.get(pk=run.pk).event_seq == combined[-1]
    assert "completed" in second.statuses(run.pk)

    # Once more after the end: nothing is sent again.
    with ConsoleSocket(open_socket(procs, user=user)) as third:
        subscribed = third.subscribe(session.pk, after={str(run.pk): combined[-1]})
    assert subscribed["runs"] == {str(run.pk): combined[-1]}
    assert not [m for m in third.received if m["type"] == "events"]


def test_a_lost_doorbell_is_filled_from_the_event_log(procs):
    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="lossy")
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        run = message_post(session=session, content="hello", acting_user=user).run
        console.until(lambda m: m["type"] == "events" and m["run_id"] == str(run.pk))
        with override_settings(CHANNEL_LAYERS={}):  # this event is committed but never announced
            run_event_append(run_id=run.pk, events=[("input_queued", {"content": "1"})])
        run_event_append(run_id=run.pk, events=[("input_queued", {"content": "2"})])
        console.until(lambda m: m["type"] == "events" and m["events"][-1]["seq"] == 3)
    assert console.seqs[str(run.pk)] == [1, 2, 3]
    notes = [e["payload"] for m in console.received if m["type"] == "events" for e in m["events"] if e["type"] == "input_queued"]
    assert notes == [{"content": "1"}, {"content": "2"}]


def test_streamed_text_goes_out_without_waiting_for_the_models_next_piece(procs):
    """The worker coalesces a step's text, but a piece never waits for the next one: when the
    model goes quiet, what it has sent still reaches the console; `close` sends the rest."""
    from runs_app.live import StepDeltas

    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="quiet model")
    run = message_post(session=session, content="hello", acting_user=user).run
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        out = StepDeltas(session_id=session.pk, run_id=run.pk, step=0)
        assert out.text("Hel")  # nothing in flight: this starts a send
        out.text("Hello")  # coalesced into that send or the next one; then the model is quiet
        console.until(lambda m: m["type"] == "delta" and m["delta"]["offset"] + len(m["delta"]["text"]) == 5)
        out.text("Hello, world")
        out.close("Hello, world!")
        console.until(lambda m: m["type"] == "delta" and m["delta"]["text"].endswith("!"))
    deltas = [m["delta"] for m in console.received if m["type"] == "delta"]
    offsets = [len("".join(d["text"] for d in deltas[:i])) for i in range(len(deltas))]
    assert [d["offset"] for d in deltas] == offsets  # in order, each where the last ended
    assert console.texts[(str(run.pk), 0)].text == "Hello, world!"


def test_tool_call_fragments_arrive_in_order_once_each_with_their_offsets(procs):
    from runs_app.live import StepDeltas, publish_delta

    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="drafts")
    run = message_post(session=session, content="hello", acting_user=user).run
    arguments = '{"order_id": "A-1001", "amount": "20.00"}'
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        out = StepDeltas(session_id=session.pk, run_id=run.pk, step=0)
        out.call(index=0, id="call_1", name="execute_refund", arguments="")
        for cut in range(4, len(arguments) + 1, 4):
            out.call(index=0, id="call_1", name="execute_refund", arguments=arguments[:cut])
        out.call(index=0, id="call_1", name="execute_refund", arguments=arguments)
        out.close("")
        # A doorbell rung twice (or late) is not passed on: the client has those characters.
        publish_delta(session_id=session.pk, run_id=run.pk, delta={
            "kind": "tool_call_delta", "step": 0, "index": 0, "id": "call_1", "name": "execute_refund", "offset": 0,
            "arguments": arguments[:8]})
        run_event_append(run_id=run.pk, events=[("input_queued", {"content": "fence"})])
        console.until(lambda m: m["type"] == "events" and m["events"][-1]["type"] == "input_queued")
    fragments = [m["delta"] for m in console.received if m["type"] == "delta"]
    assert all(f["kind"] == "tool_call_delta" and f["name"] == "execute_refund" for f in fragments)
    assert [f["offset"] for f in fragments] == [len("".join(f["arguments"] for f in fragments[:i])) for i in range(len(fragments))]
    assert "".join(f["arguments"] for f in fragments) == arguments


def test_a_lost_text_doorbell_is_repaired_by_the_next_delta_carrying_the_text_so_far(procs):
    """Deltas are sent to a client as they come; only one that follows a gap keeps the text so
    far (the worker adds it about once a second), and the client is whole again from it."""
    from runs_app.live import publish_delta

    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="lossy text")
    run = message_post(session=session, content="hello", acting_user=user).run

    def text(offset, piece, so_far=None):
        delta = {"kind": "text_delta", "step": 0, "offset": offset, "text": piece}
        if so_far is not None:
            delta["so_far"] = so_far
        publish_delta(session_id=session.pk, run_id=run.pk, delta=delta)

    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        text(0, "Hello", so_far="Hello")
        with override_settings(CHANNEL_LAYERS={}):
            text(5, ", wor")  # never announced
        text(10, "ld")  # after the gap, without the text so far: kept aside by the client
        text(12, "!", so_far="Hello, world!")  # repairs the gap
        text(13, " Bye.", so_far="Hello, world! Bye.")  # no gap any more: sent without it
        console.until(lambda m: m["type"] == "delta" and m["delta"]["text"] == " Bye.")
    sent = [m["delta"] for m in console.received if m["type"] == "delta"]
    assert [(d["offset"], "so_far" in d) for d in sent] == [(0, False), (10, False), (12, True), (13, False)]
    streamed = console.texts[(str(run.pk), 0)]
    assert (streamed.text, streamed.stash) == ("Hello, world! Bye.", [])


def test_consoles_connecting_together_get_each_doorbell_once_even_a_big_one(procs):
    """A web process whose first consoles connect at the same moment (a restart, a reconnect
    storm) must still hand each message to each console once, including one too big for
    NOTIFY's 8000 bytes (config/channel_layers.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from runs_app.live import publish_delta

    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="storm")
    run = message_post(session=session, content="hello", acting_user=user).run
    cookie = session_cookie(user)  # here: a database connection opened in a pool thread would outlive the test
    with ThreadPoolExecutor(max_workers=8) as pool:
        consoles = [ConsoleSocket(c) for c in pool.map(lambda _: open_socket(procs, cookie=cookie), range(8))]
        list(pool.map(lambda console: console.subscribe(session.pk), consoles))
    big = {"kind": "tool_call_delta", "step": 0, "index": 0, "id": "call_1", "name": "query_order", "offset": 0,
           "arguments": "x" * 9000}
    publish_delta(session_id=session.pk, run_id=run.pk, delta=big)
    publish_delta(session_id=session.pk, run_id=run.pk, delta={**big, "offset": 9000, "arguments": "small"})
    run_event_append(run_id=run.pk, events=[("input_queued", {"content": "fence"})])
    for console in consoles:
        with console:
            console.until(lambda m: m["type"] == "events" and m["events"][-1]["type"] == "input_queued")
        deltas = [m["delta"]["arguments"][:5] for m in console.received if m["type"] == "delta"]
        assert deltas == ["xxxxx", "small"], deltas


def test_live_delivery_outlives_the_web_servers_listen_connection(procs):
    """The web process's LISTEN connection is terminated (as a PostgreSQL restart or an
    administrator would), and somebody NOTIFYs channels_postgres's shutdown message, which every
    listener on the database hears: the console still hears the next doorbell
    (config/channel_layers.py, 4.)."""
    from django.db import connection

    procs.keep_shared = False  # its web server's connection is terminated below
    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="listener")
    run = message_post(session=session, content="hello", acting_user=user).run

    def listeners() -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                           "AND application_name = %s AND query LIKE 'LISTEN%%'", [procs.web_application_name])
            return [pid for (pid,) in cursor.fetchall()]

    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        run_event_append(run_id=run.pk, events=[("input_queued", {"content": "before"})])
        console.until(lambda m: m["type"] == "events" and m["events"][-1]["payload"].get("content") == "before")
        (lost,) = listeners()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify('channels_postgres_messages', '1:shutdown'), pg_terminate_backend(%s)", [lost])
        wait_for(lambda: listeners() and lost not in listeners(), message="the web server to LISTEN again")
        run_event_append(run_id=run.pk, events=[("input_queued", {"content": "after"})])
        console.until(lambda m: m["type"] == "events" and m["events"][-1]["payload"].get("content") == "after")


def test_a_console_joining_mid_stream_shows_the_text_so_far_without_duplicates(procs, demo_world):
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    user = UserFactory()
    session = session_open(owner=user, title="late")
    # "hello" gets the long help text, streamed two words every 0.3 s.
    run = message_post(session=session, content="hello", acting_user=user, provider_options={"delay": 0.3}).run
    step = wait_for(
        lambda: Step.objects.filter(run=run, kind=StepKind.MODEL, status=StepStatus.RUNNING).exclude(streamed_text="").first(),
        message="the worker's heartbeat to save some streamed text",
    )
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        console.until_run_status(run.pk, {"completed", "failed"})
    snapshot = next(m for m in console.received if m["type"] == "stream")
    assert snapshot["step"] == step.index and HELP_TEXT.startswith(snapshot["text"])
    assert len(snapshot["text"]) < len(HELP_TEXT)  # it really joined in the middle
    streamed = console.texts[(str(run.pk), step.index)]
    assert streamed.text == HELP_TEXT == console.final_texts[(str(run.pk), step.index)]
    assert not streamed.stash
    assert gap_free(console.seqs[str(run.pk)])


# --- live delivery over both layers ---------------------------------------------------------------------


def layer_holds_group(layer: str, group: str) -> bool:
    """Whether the named layer — and only it — has members for `group`."""
    import redis
    from channels_postgres.models import GroupChannel

    in_postgres = GroupChannel.objects.filter(group_key=f"asgi:group:{group}").exists()
    client = redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=2)
    try:
        in_redis = bool(client.pubsub_channels(f"asgi__group__{group}"))  # daphne's subscription
    except redis.exceptions.ConnectionError:
        in_redis = False  # no Redis on this machine (a fresh laptop): nobody can be subscribed there
    finally:
        client.close()
    return (in_postgres, in_redis) == ((True, False) if layer == "postgres" else (False, True))


@pytest.mark.parametrize("layer", ["postgres", pytest.param("redis", marks=pytest.mark.redis)])
def test_workers_answer_reaches_the_client_live_through_each_layer(procs, demo_world, layer):
    if layer == "redis":
        require_redis()
        procs.base_env["REDIS_URL"] = REDIS_TEST_URL
        switch = override_settings(CHANNEL_LAYERS=redis_layer())
    else:
        procs.base_env.pop("REDIS_URL", None)
        switch = override_settings()
    with switch:
        procs.start_web(simulator=True)
        procs.start_workers(workers=1)
        user = UserFactory()
        session = session_open(owner=user, title=f"live over {layer}")
        with ConsoleSocket(open_socket(procs, user=user)) as console:
            console.subscribe(session.pk)
            # Proof of which layer daphne joined the session's group on.
            assert layer_holds_group(layer, session_group(session.pk))
            console.send(action="post", session=str(session.pk), content=WEATHER, mode="auto", ref="ask")
            posted = console.until(lambda m: m.get("ref") == "ask")
            assert (posted["type"], posted["disposition"]) == ("posted", "started_run")
            run_id = posted["run_id"]
            console.until_run_status(run_id, {"completed", "failed"})

    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error_detail
    assert gap_free(console.seqs[run_id]) and console.seqs[run_id][-1] == run.event_seq
    statuses = console.statuses(run_id)
    assert statuses[0] == "queued" and statuses[-1] == "completed" and "running" in statuses
    types = console.event_types[run_id]
    assert {"step_started", "tool_call", "step_completed"} <= set(types)
    # The answer's text came as deltas from the worker and adds up to exactly the stored answer.
    answer = Message.objects.filter(run=run, role=MessageRole.ASSISTANT).exclude(content="").get()
    assert (run_id, answer.step.index) in console.texts
    assert console.texts[(run_id, answer.step.index)].text == answer.content
    assert "Paris" in answer.content


@pytest.mark.redis
def test_an_idle_console_on_redis_stays_connected(procs):
    """A console that hears nothing for longer than Redis clients' usual 5 s read timeout keeps
    its socket and its subscription (the core layer's 5 s waits once killed every quiet one)."""
    import time

    require_redis()
    procs.base_env["REDIS_URL"] = REDIS_TEST_URL
    with override_settings(CHANNEL_LAYERS=redis_layer()):
        procs.start_web()
        user = UserFactory()
        session = session_open(owner=user, title="quiet")
        with ConsoleSocket(open_socket(procs, user=user)) as console:
            console.subscribe(session.pk)
            time.sleep(7)  # quiet for longer than one wait (not a timing assertion)
            run = message_post(session=session, content="hello", acting_user=user).run
            console.until(lambda m: m["type"] == "events" and m["run_id"] == str(run.pk))


# --- actions through the services ----------------------------------------------------------------------------


def test_post_and_cancel_go_through_the_services(procs):
    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="actions")
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        console.send(action="post", session=str(session.pk), content="hello", ref="1")
        first = console.until(lambda m: m.get("ref") == "1")
        console.send(action="post", session=str(session.pk), content="and also this", mode="queue", ref="2")
        second = console.until(lambda m: m.get("ref") == "2")
        assert first["disposition"] == "started_run"
        assert (second["disposition"], second["run_id"]) == ("pending", first["run_id"])
        console.until(lambda m: m["type"] == "events" and m["events"][-1]["type"] == "input_queued")

        console.send(action="post", session=str(session.pk), content="  ", ref="3")
        assert console.until(lambda m: m.get("ref") == "3")["code"] == "empty_message"
        console.send(action="cancel", run=first["run_id"], reason="changed my mind", ref="4")
        assert console.until(lambda m: m.get("ref") == "4")["type"] == "cancel_requested"
        console.until_run_status(first["run_id"], {"cancelled"})
        # The queued input starts the next run as the cancelled one ends.
        following = console.until(lambda m: m["type"] == "events" and m["run_id"] != first["run_id"])
    cancelled = Run.objects.get(pk=first["run_id"])
    assert (cancelled.status, cancelled.cancel_requested_by, cancelled.cancel_reason) == (RunStatus.CANCELLED, user, "changed my mind")
    assert Message.objects.get(run_id=following["run_id"], role=MessageRole.USER).content == "and also this"



def test_the_owner_confirms_a_user_level_approval_over_the_socket(procs):
    procs.start_web()
    owner, stranger = UserFactory(), UserFactory()
    session = session_open(owner=owner, title="confirm")
    run = RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL)
    approval = ApprovalFactory(tool_call__step__run=run, policy=ApprovalPolicy.USER)
    elsewhere = RunFactory(session=session_open(owner=owner), status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL)
    operators_only = ApprovalFactory(tool_call__step__run=elsewhere, policy=ApprovalPolicy.OPERATOR)

    with ConsoleSocket(open_socket(procs, user=stranger)) as console:
        console.send(action="decide", approval=str(approval.pk), decision="approve", ref="s")
        assert console.until(lambda m: m.get("ref") == "s")["code"] == "not_found"
    with ConsoleSocket(open_socket(procs, user=owner)) as console:
        console.subscribe(session.pk)
        console.send(action="decide", approval=str(operators_only.pk), decision="approve", ref="o")
        assert console.until(lambda m: m.get("ref") == "o")["code"] == "not_permitted"
        console.send(action="decide", approval=str(approval.pk), decision="maybe", ref="m")
        assert console.until(lambda m: m.get("ref") == "m")["code"] == "bad_request"
        console.send(action="decide", approval=str(approval.pk), decision="approve", note="yes please", ref="a")
        decided = console.until(lambda m: m.get("ref") == "a")
        assert (decided["type"], decided["status"]) == ("decided", ApprovalStatus.APPROVED)
        resumed = console.until_run_status(run.pk, {"queued"})
        console.send(action="decide", approval=str(approval.pk), decision="reject", ref="again")
        assert console.until(lambda m: m.get("ref") == "again")["code"] == "already_decided"
    assert console.event_types[str(run.pk)] == ["approval_decided", "run_status"]
    assert resumed["events"][-1]["payload"]["resumed_from"] == WaitReason.APPROVAL
    assert Approval.objects.get(pk=approval.pk).decided_by == owner
    assert Approval.objects.get(pk=operators_only.pk).status == ApprovalStatus.PENDING


def test_socket_errors_are_json_with_a_code(procs):
    procs.start_web()
    user = UserFactory()
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.connection.send("not json")
        assert console.receive()["code"] == "bad_request"
        console.send(action="explode", ref="x")
        assert console.until(lambda m: m.get("ref") == "x")["code"] == "unknown_action"
        console.send(action="subscribe", session="not-a-uuid", ref="y")
        assert console.until(lambda m: m.get("ref") == "y")["code"] == "not_found"
        console.send(action="subscribe", session=str(session_open(owner=user).pk), after={"x": 1}, ref="z")
        assert console.until(lambda m: m.get("ref") == "z")["code"] == "bad_request"


def test_a_user_may_hold_only_so_many_sockets_open(procs):
    """Issue 27, finding 10: one user held 447 console websockets. With a cap of 2 (SSE streams and
    sockets together), a third socket is told why and closed (4429); closing one frees its slot; the
    cap is the user's, not everyone's."""
    procs.base_env["WARDEN_STREAMS_PER_USER"] = "2"
    procs.start_web()
    user, other = UserFactory(), UserFactory()
    first, second = open_socket(procs, user=user), open_socket(procs, user=user)
    third = open_socket(procs, user=user)
    told = json.loads(third.recv(timeout=30))
    assert told["type"] == "error" and told["code"] == "too_many_streams"
    with pytest.raises(ConnectionClosed):
        third.recv(timeout=30)
    assert third.close_code == 4429
    with ConsoleSocket(open_socket(procs, user=other)) as console:  # another user's own cap
        assert console.subscribe(session_open(owner=other, title="theirs").pk)["type"] == "subscribed"
    first.close()
    wait_for(lambda: OpenStream.objects.filter(user_id=user.pk).count() == 1, timeout=30,
             message="the closed socket's slot to be given back")
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        assert console.subscribe(session_open(owner=user, title="mine").pk)["type"] == "subscribed"
    second.close()
