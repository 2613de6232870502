"""The console's truth in plain words (issue #29, point 4), in headless Chromium against the real
system (daphne, django-q2 workers, the demo's scripted model, the simulated payment service):

- a run whose first model turn asks for a tool nobody registered (the scripted `unknown_tool`
  fault): the customer's page never shows the discarded turn, the tool's name or an error code —
  checked on every change of the page while it runs, and after a reload — while an operator
  watching the same session, and the desk's run page, show them;
- a run waiting for the customer's answer: the question is a card to answer, the run has one badge
  saying what it waits for, and the timeline fits the phone's screen, has a legend and numbered
  steps without gaps, and keeps counting while the run waits.

Every wait is on a condition; screenshots go to test-artifacts/screenshots/."""

import pytest

from demo.model import ASK_REFUND_ORDER_TEXT
from engine.actions.messages import message_post
from runs_app.models import Run, RunStatus, StepStatus
from sessions_app.models import Session
from tests.e2e.conftest import browser_page, login, screenshot, scrolls_sideways
from tests.e2e.test_console_phone import new_session, send
from tests.support.factories import UserFactory
from tests.support.processes import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

UNKNOWN_TOOL = "transfer_all_funds"  # what the scripted model's `unknown_tool` fault asks for
# Words that give the run-time's internals away, and the markup of a discarded turn.
INTERNAL_WORDS = (UNKNOWN_TOOL, "unknown tool", "Discarded", "discarded", "invalid_output", "not_executable")
INTERNAL_MARKUP = '.step-discarded, [data-role="discarded"]'

# Watches the page from now on: every text it ever shows and every discarded-turn element it ever
# holds is checked, so a flash of an internal between two screenshots is caught too.
LEAK_WATCH = """([words, markup]) => {
  window.__leaks = [];
  const check = () => {
    const main = document.querySelector("main");
    const text = main.innerText + " " + main.textContent;
    words.forEach((word) => { if (text.includes(word)) window.__leaks.push(word); });
    if (main.querySelector(markup)) window.__leaks.push(main.querySelector(markup).outerHTML.slice(0, 200));
  };
  new MutationObserver(check).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
  check();
}"""

# Elements that reach past the right edge of the screen (the timeline's above all); and the
# timeline's bars, which must end inside its plot (in percent of it).
PAST_THE_EDGE = """() => {
  const width = document.documentElement.clientWidth;
  return Array.from(document.querySelectorAll("main *"))
    .filter((node) => node.getClientRects().length && node.getBoundingClientRect().right > width + 0.5)
    .filter((node) => !node.closest("details:not([open])"))
    // Inside the timeline's plot a box is its drawing's (a bar's clipped label too): the plot itself is checked.
    .filter((node) => !(node.ownerSVGElement && node.ownerSVGElement.closest("svg.timeline-plot")))
    .map((node) => node.tagName + "." + (node.getAttribute("class") || "") + " right=" + node.getBoundingClientRect().right);
}"""


BARS_PAST_THE_PLOT = """() => Array.from(document.querySelectorAll("svg.timeline-plot svg.bar"))
  .filter((bar) => bar.x.baseVal.valueInSpecifiedUnits + bar.width.baseVal.valueInSpecifiedUnits > 100.5)
  .map((bar) => bar.getAttribute("class"))"""


# The step numbers a reader sees (a label that does not fit its bar is hidden).
VISIBLE_STEP_NUMBERS = """(section) => Array.from(document.querySelectorAll(section + ' svg.bar[class*=" step-"] text'))
  .filter((text) => text.getAttribute("visibility") !== "hidden").map((text) => text.textContent)"""


def customer_text_is_clean(page) -> None:
    main = page.inner_text("main") + page.evaluate('document.querySelector("main").textContent')
    for word in INTERNAL_WORDS:
        assert word not in main, word
    assert page.locator(f"main :is({INTERNAL_MARKUP})").count() == 0


def test_a_discarded_turn_for_an_unknown_tool_reaches_the_operator_never_the_customer(live_system, chromium, desk_operator):
    procs = live_system
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    customer_user = UserFactory(username="fern")
    customer = browser_page(chromium, procs.base_url, "phone")
    login(customer, "/console/login/", "fern")
    session_id = new_session(customer, "Two no-ops")
    watcher = browser_page(chromium, procs.base_url, "desktop")
    login(watcher, f"/console/login/?next=/console/sessions/{session_id}/", desk_operator.username)
    watcher.goto(f"/console/sessions/{session_id}/")
    watcher.wait_for_selector('[data-role="connection"][data-state="live"]')
    customer.evaluate(LEAK_WATCH, [list(INTERNAL_WORDS), INTERNAL_MARKUP])

    # The customer's message, as the composer posts it, with the scripted model's first turn asking
    # for a tool nobody registered (and a pause between chunks, so the pages see it stream).
    run = message_post(session=Session.objects.get(pk=session_id), content="please run noop 2", acting_user=customer_user,
                       provider_options={"faults": ["unknown_tool"], "delay": 0.05}).run
    section = f"section#run-{run.pk}"
    customer.wait_for_selector(f'{section}[data-status="completed"]')
    watcher.wait_for_selector(f'{section}[data-status="completed"]')
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == RunStatus.COMPLETED
    discarded = stored.steps.get(status=StepStatus.DISCARDED)
    assert UNKNOWN_TOOL in discarded.discard_reason  # the run really had the turn the customer must not see

    assert customer.evaluate("window.__leaks") == [], "the customer's page showed internals while the run went on"
    for moment in ("live", "reloaded"):
        customer_text_is_clean(customer)
        assert customer.locator(f"{section} .tool-card").count() == 2
        assert "Echoed 0." in customer.inner_text(section) and "Echoed 1." in customer.inner_text(section)
        assert customer.locator(f'{section} [data-role="status"]').inner_text() == "completed"
        # The live timeline catches up with the run's last steps a moment after its status: wait for them.
        customer.wait_for_function(
            """s => document.querySelectorAll(s + ' svg.bar[class*=" step-"] text').length >= 3""", arg=section)
        numbers = customer.locator(f'{section} svg.bar[class*=" step-"] text').all_text_contents()
        assert numbers == [str(n) for n in range(1, len(numbers) + 1)] and len(numbers) >= 3, numbers
        assert customer.evaluate(VISIBLE_STEP_NUMBERS, section) in ([], numbers)  # all or none: never "2 4 6"
        assert not scrolls_sideways(customer) and customer.evaluate(PAST_THE_EDGE) == []
        assert customer.evaluate(BARS_PAST_THE_PLOT) == []
        screenshot(customer, f"console-truth-unknown-tool-customer-{moment}", "phone")
        customer.reload()
        customer.wait_for_selector('[data-role="connection"][data-state="live"]')
        customer.evaluate(LEAK_WATCH, [list(INTERNAL_WORDS), INTERNAL_MARKUP])
    assert customer.evaluate("window.__leaks") == []

    # The operator watching the same session sees the turn that was thrown away, and why.
    note = watcher.locator(f'{section} [data-role="discarded"]')
    assert note.count() == 1 and UNKNOWN_TOOL in note.inner_text()
    assert watcher.locator(f"{section} li.step-discarded").count() == 1
    screenshot(watcher, "console-truth-unknown-tool-operator", "desktop")
    # And so does the desk's run page.
    watcher.goto(f"/admin/runs_app/run/{run.pk}/change/")
    assert UNKNOWN_TOOL in watcher.content()


@pytest.mark.parametrize("size", ["phone", "desktop"])
def test_a_question_waits_as_a_question_and_the_timeline_keeps_counting(live_system, chromium, size):
    procs = live_system
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    UserFactory(username="gus")
    page = browser_page(chromium, procs.base_url, size)
    login(page, "/console/login/", "gus")
    session_id = new_session(page, "A refund")
    send(page, "I'd like a refund please")
    run = wait_for(lambda: Run.objects.filter(session_id=session_id).first(), timeout=30, message="the run to start")
    section = f"section#run-{run.pk}"
    page.wait_for_selector(f'{section}[data-status="waiting"] .question-card')

    card = page.locator(f"{section} .question-card")
    assert card.locator('[data-role="question"]').inner_text() == ASK_REFUND_ORDER_TEXT
    assert card.locator('[data-role="tool-status"]').inner_text() == "to answer"
    assert "look-up" not in card.inner_text().lower() and "About to run" not in card.inner_text()
    head = page.locator(f"{section} .run-head")
    assert head.locator(".badge").count() == 1
    assert head.locator('[data-role="status"]').inner_text() == "waiting for your answer"
    assert head.inner_text().count("waiting for your answer") == 1  # the wait, said once
    assert "waiting: waiting" not in page.inner_text("main")

    timeline = f"{section} [data-role=timeline]"
    # The page redraws the timeline shortly after each status change: the question's bar is in it.
    page.wait_for_selector(f"{timeline} svg.bar.tool-question")
    # The run waits, and its timeline keeps counting: the figure changes with no event at all.
    before = page.inner_text(f'{timeline} [data-role="timeline-total"]')
    page.wait_for_function("([selector, before]) => document.querySelector(selector).textContent !== before",
                           arg=[f'{timeline} [data-role="timeline-total"]', before])
    assert Run.objects.get(pk=run.pk).status == RunStatus.WAITING  # still waiting: no event moved it
    assert "so far" in page.inner_text(f"{timeline} figcaption")
    # The axis ends at the run's duration so far, and the last bar reaches it.
    axis = page.evaluate("""(selector) => {
      const figure = document.querySelector(selector);
      const ticks = Array.from(figure.querySelectorAll("text.tick"));
      return {last: ticks[ticks.length - 1].textContent, total: figure.querySelector('[data-role="timeline-total"]').textContent,
              reach: Math.max(...Array.from(figure.querySelectorAll("svg.bar")).map((bar) => bar.x.baseVal.valueInSpecifiedUnits + bar.width.baseVal.valueInSpecifiedUnits))};
    }""", timeline)
    assert axis["last"] == axis["total"] and axis["reach"] >= 99.5, axis
    assert page.locator(f'{timeline} [data-role="timeline-legend"] li').count() >= 2
    numbers = page.locator(f'{timeline} svg.bar[class*=" step-"] text').all_text_contents()
    assert numbers == [str(n) for n in range(1, len(numbers) + 1)] and len(numbers) >= 2, numbers
    assert page.evaluate(VISIBLE_STEP_NUMBERS, section) in ([], numbers)
    plot = page.locator(f"{timeline} svg.timeline-plot").bounding_box()
    assert plot["x"] >= 0 and plot["x"] + plot["width"] <= page.viewport_size["width"]
    assert not scrolls_sideways(page) and page.evaluate(PAST_THE_EDGE) == [] and page.evaluate(BARS_PAST_THE_PLOT) == []
    screenshot(page, "console-truth-question-waiting", size)

    # The answer closes the question; the refund goes on to the operator's approval.
    send(page, "It's order 9527")
    page.wait_for_selector(f'{section} .question-card[class*="status-succeeded"]')
    page.wait_for_selector(f'{section}[data-status="waiting"][data-wait-reason="approval"]')
    assert card.locator('[data-role="tool-status"]').inner_text() == "answered"
    page.wait_for_function("(selector) => document.querySelector(selector).textContent === 'waiting for approval'",
                           arg=f'{section} [data-role="status"]')
    assert "Order 9527:" in page.inner_text(f"{section} .tool-card[data-tool=query_order]")
    page.wait_for_selector(f'{timeline} svg.bar[class*="tool-pending"]')  # redrawn with the refund waiting
    assert page.evaluate(VISIBLE_STEP_NUMBERS, section) in ([], [str(n) for n in range(1, page.locator(
        f'{timeline} svg.bar[class*=" step-"]').count() + 1)])
    assert not scrolls_sideways(page) and page.evaluate(PAST_THE_EDGE) == []
    screenshot(page, "console-truth-answered-waiting-for-approval", size)
