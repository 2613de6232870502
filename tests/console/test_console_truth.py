"""The console tells the truth in plain words (issue #29, point 4): steps numbered without gaps,
one badge per state, a wait said once, tool cards with the business result their tool declares,
ask_user as a question to answer — and the run-time's internals (a discarded turn, the name of a
tool nobody registered, error codes) never on the customer's page or socket, while an operator
watching the same run sees them."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import Client
from django.utils import timezone

from console.presenters import console_event, draft_call_shown, tool_card_text
from engine.actions.sessions import session_open
from engine.state import run_write
from runs_app.models import RunStatus, StepKind, StepStatus, WaitReason
from tests.support.factories import RunFactory, StepFactory, ToolCallFactory, UserFactory
from tools_app.models import ToolCallStatus, ToolEffect
from tools_app.registry import Tool, tool_get
from pydantic import BaseModel

pytestmark = pytest.mark.django_db

UNKNOWN_TOOL = "transfer_all_funds"
DISCARD_REASON = f"the model asked for unknown tool {UNKNOWN_TOOL!r}"
INTERNALS = (UNKNOWN_TOOL, "unknown tool", "Discarded", "step-discarded", "invalid_output", "order_not_found")


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(user, path: str) -> str:
    response = client_for(user).get(path)
    assert response.status_code == 200, (response.status_code, path)
    return response.content.decode()


def events(run, *items) -> None:
    with transaction.atomic():
        run_write(run_id=run.pk, events=list(items))


def operator():
    user = UserFactory(is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    return user


def run_section(html: str, run) -> str:
    start = html.rindex("<section", 0, html.index(f'id="run-{run.pk}"'))
    return html[start:html.index("</section>", start)]


def step_numbers(html: str) -> list[str]:
    """The step bars' labels on the timeline, in order."""
    return re.findall(r'<svg class="bar kind-\S+ step-[^"]*"[^>]*>.*?<text x="3" y="12">([^<]*)</text>', html)


def refund_story(*, owner):
    """A finished refund with a discarded turn first: the model asked for a tool nobody registered,
    was asked again, looked the order up, refunded it and said so."""
    now = timezone.now()
    session = session_open(owner=owner, title="refund")
    run = RunFactory(session=session, status=RunStatus.COMPLETED, phase="", finished_at=now, outcome="applied")
    at = run.created_at
    StepFactory(run=run, index=0, kind=StepKind.MODEL, status=StepStatus.DISCARDED, discard_reason=DISCARD_REASON,
                streamed_text="Moving everything now.", finished_at=at + timedelta(milliseconds=300))
    StepFactory(run=run, index=1, kind=StepKind.MODEL, status=StepStatus.COMPLETED, finished_at=at + timedelta(milliseconds=500))
    lookup = StepFactory(run=run, index=2, kind=StepKind.TOOLS, status=StepStatus.COMPLETED, finished_at=at + timedelta(milliseconds=700))
    ToolCallFactory(step=lookup, index=0, status=ToolCallStatus.SUCCEEDED, started_at=at, finished_at=at + timedelta(milliseconds=600),
                    result={"order_id": "9527", "status": "delivered", "amount": "25.00", "currency": "USD",
                            "refund_eligible": True, "refunded": False})
    StepFactory(run=run, index=3, kind=StepKind.MODEL, status=StepStatus.COMPLETED, finished_at=at + timedelta(milliseconds=800))
    refund = StepFactory(run=run, index=4, kind=StepKind.TOOLS, status=StepStatus.COMPLETED, finished_at=at + timedelta(milliseconds=900))
    ToolCallFactory(step=refund, index=0, tool_name="execute_refund", effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED,
                    arguments={"order_id": "9527", "amount": "25.00", "reason": "customer request"},
                    result={"refund_id": "rf_5e1f", "amount": "25.00", "currency": "USD"},
                    started_at=at, finished_at=at + timedelta(milliseconds=850))
    StepFactory(run=run, index=5, kind=StepKind.MODEL, status=StepStatus.COMPLETED, finished_at=now)
    events(run, ("run_status", {"status": "running", "phase": "calling_model", "wait_reason": ""}),
           ("step_discarded", {"step": 0, "reason": DISCARD_REASON}),
           ("run_status", {"status": "completed", "phase": "", "wait_reason": ""}))
    return session, run


def test_the_customer_never_sees_a_discarded_turn_or_an_unknown_tool_while_an_operator_does():
    owner = UserFactory(username="dora")
    session, run = refund_story(owner=owner)
    for path in (f"/console/sessions/{session.pk}/", f"/console/runs/{run.pk}/"):
        customer_html = run_section(page(owner, path), run)
        for internal in INTERNALS:
            assert internal not in customer_html, (path, internal)
        assert "Moving everything now." not in customer_html
        # Steps are numbered as the customer sees them: no gap where the discarded turn was.
        assert step_numbers(customer_html) == ["1", "2", "3", "4", "5"], path

        operator_html = run_section(page(operator(), path), run)
        assert f"Discarded: {DISCARD_REASON}" .replace("'", "&#x27;") in operator_html
        assert "step-discarded" in operator_html and "thrown away" in operator_html
        assert step_numbers(operator_html) == ["1", "2", "3", "4", "5", "6"], path


def test_a_finished_run_has_one_badge_and_cards_say_what_was_done():
    owner = UserFactory()
    session, run = refund_story(owner=owner)
    html = run_section(page(owner, f"/console/sessions/{session.pk}/"), run)
    head = html[:html.index("</header>")]
    assert len(re.findall(r'class="badge ', head)) == 1
    assert re.search(r'data-role="status"[^>]*>done</span>', head)  # the outcome, not "completed" beside "done"
    assert "Order 9527: delivered, 25.00 USD, can be refunded." in html
    assert "Refunded 25.00 USD, ref rf_5e1f" in html
    assert ">Done.<" not in html


def test_a_question_for_the_customer_is_shown_as_a_question_and_the_wait_is_said_once():
    owner = UserFactory()
    session = session_open(owner=owner, title="which order")
    run = RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason=WaitReason.WAITING_INPUT)
    StepFactory(run=run, index=0, kind=StepKind.MODEL, status=StepStatus.COMPLETED, finished_at=timezone.now())
    asking = StepFactory(run=run, index=1, kind=StepKind.TOOLS)
    ToolCallFactory(step=asking, tool_name="ask_user", arguments={"question": "Which order should I refund?"},
                    status=ToolCallStatus.PENDING)
    events(run, ("run_status", {"status": "running", "phase": "calling_model", "wait_reason": ""}),
           ("run_status", {"status": "waiting", "phase": "", "wait_reason": "waiting_input"}))
    html = run_section(page(owner, f"/console/sessions/{session.pk}/"), run)
    card = html[html.index('<article class="tool-card'):html.index("</article>")]
    assert "Question for you" in card and "Which order should I refund?" in card
    assert re.search(r'data-role="tool-status">to answer<', card) and "Answer below to go on." in card
    assert "look-up" not in card and "About to run" not in card and "ask_user</code>" not in card
    head = html[:html.index("</header>")]
    assert head.count("waiting for your answer") == 1 and len(re.findall(r'class="badge ', head)) == 1
    words = re.sub(r"<[^>]+>", " ", html)  # what is read, not the markup's classes
    assert "waiting: waiting" not in words and "waiting_input" not in words
    # The timeline: still going, with its legend, its axis in fractions of the run so far.
    assert 'data-ongoing="1"' in html and 'data-role="timeline-legend"' in html and "waiting for a person" in html
    assert re.search(r'<text class="tick" data-fraction="1" x="100%"', html)
    for x, width in re.findall(r'<svg class="bar [^"]*" data-begin="[^"]*" data-end="[^"]*" x="([\d.]+)%" y="\d+" width="([\d.]+)%"', html):
        assert float(x) + float(width) <= 100.6


def test_a_cards_line_comes_from_the_tools_declaration_or_plain_words():
    refund = dict(tool_name="execute_refund", effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED,
                  arguments={"order_id": "9527", "amount": "25.00"})
    assert tool_card_text(**refund, result={"refund_id": "rf_1", "amount": "25.00", "currency": "USD"}) == "Refunded 25.00 USD, ref rf_1"
    # The declaration cannot be filled in (confirmed by hand, no gateway answer): plain words.
    assert tool_card_text(**refund, result=None) == "Done."
    assert tool_card_text(tool_name="not_registered", effect=ToolEffect.READ, status=ToolCallStatus.SUCCEEDED,
                          arguments={}, result={"x": 1}) == "Answered."
    assert tool_card_text(tool_name="get_weather", effect=ToolEffect.READ, status=ToolCallStatus.SUCCEEDED, arguments={"city": "Paris"},
                          result={"city": "Paris", "summary": "sunny", "temperature_c": 21}) == "Paris: sunny, 21 °C."
    # A failure keeps its plain-language sentence (tools_app.outcomes), never the code.
    assert tool_card_text(tool_name="query_order", effect=ToolEffect.READ, status=ToolCallStatus.FAILED, arguments={},
                          result=None, error_code="order_not_found") == "There is no order with that number."


def test_a_tools_summary_declaration_is_checked_and_optional():
    class Arguments(BaseModel):
        amount: str

    def execute(ctx, args):
        return {}

    assert Tool(name="t", description="", arguments=Arguments, effect="read", execute=execute).summary_text({}, {}) is None
    tool = Tool(name="t", description="", arguments=Arguments, effect="read", execute=execute,
                summary=lambda arguments, result: f"Paid {arguments['amount']} to {result['to']}")
    assert tool.summary_text({"amount": "5"}, {"to": "acme"}) == "Paid 5 to acme"
    assert tool.summary_text({"amount": "5"}, None) is None  # the function failed: the card falls back
    from tools_app.registry import tool_register

    with pytest.raises(ValueError, match="summary"):
        tool_register(Tool(name="t_bad_summary", description="", arguments=Arguments, effect="read", execute=execute, summary=42))
    assert tool_get("t_bad_summary") is None


def test_the_socket_passes_the_customer_no_internals_and_an_operator_all_of_them():
    discarded = {"seq": 3, "type": "step_discarded", "payload": {"step": 0, "reason": DISCARD_REASON}}
    assert console_event(discarded, desk_view=False)["payload"] == {"step": 0, "reason": ""}
    assert console_event(discarded, desk_view=True)["payload"]["reason"] == DISCARD_REASON
    failed = {"seq": 4, "type": "tool_call", "payload": {
        "tool_call": "x", "tool": "query_order", "effect": "read", "status": "failed", "arguments": {"order_id": "1"},
        "result": None, "error_code": "order_not_found", "message": "There is no order with that number."}}
    customer = console_event(failed, desk_view=False)["payload"]
    assert customer["error_code"] == "" and customer["message"] == "There is no order with that number."
    assert console_event(failed, desk_view=True)["payload"]["error_code"] == "order_not_found"
    done = {"seq": 5, "type": "tool_call", "payload": {
        "tool_call": "y", "tool": "execute_refund", "effect": "write", "status": "succeeded", "arguments": {"amount": "9.00"},
        "result": {"refund_id": "rf_9", "amount": "9.00", "currency": "USD"}, "error_code": "", "message": "Done."}}
    assert console_event(done, desk_view=False)["payload"]["message"] == "Refunded 9.00 USD, ref rf_9"
    question = {"seq": 6, "type": "tool_call", "payload": {
        "tool_call": "z", "tool": "ask_user", "effect": "read", "status": "pending", "arguments": {"question": "Which?"},
        "result": None, "error_code": "", "message": "About to run."}}
    shown = console_event(question, desk_view=False)["payload"]
    assert (shown["status_label"], shown["message"]) == ("to answer", "Answer below to go on.")
    assert not draft_call_shown(UNKNOWN_TOOL) and draft_call_shown("query_order")
