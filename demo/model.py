"""The demo world's model: the scripted model (runs_app/providers/scripted.py: faults, scripts,
streaming) with the demo's understanding — refunds, order lookups, user levels, the weather and
no-op benchmark runs — read from the user messages of the current request and the tool results
since it started. Registered as the `scripted` provider in demo mode (config/settings.py)."""

import re

from runs_app.providers.rules import NUMBER, USER_ID, Request, ToolResult, current_requests, noop_count
from runs_app.providers.scripted import Plan, PlannedCall, ScriptedProvider

HELP_TEXT = (
    "I can check an order's status, refund an eligible order, look up a user's level, "
    'or tell you the weather. For example: "refund order 9527".'
)
ASK_REFUND_ORDER_TEXT = "I can help with that refund. Could you tell me the order number?"
ASK_CHECK_ORDER_TEXT = "Which order should I check? Could you tell me the order number?"
NO_ANSWER_TEXT = "I still need the order number to go on. Send it whenever you have it and I'll pick this up."

_ORDER_NUMBER_AFTER_WORD = re.compile(r"\border\b\D{0,20}?(\d{3,})")


class DemoModel(ScriptedProvider):
    """The `scripted` provider of demo mode."""

    def plan(self, messages: list[dict]) -> Plan:
        return scripted_plan(messages)


def scripted_plan(messages: list[dict]) -> Plan:
    """What the scripted model answers next, without faults: the tool work of the request (and
    of whatever was added to it meanwhile) first, then one answer covering all of it."""
    planners = {
        "noop": _plan_noop,
        "refund": _plan_refund,
        "order_status": _plan_order_status,
        "user_level": _plan_user_level,
        "weather": _plan_weather,
    }
    plans = []
    for current in current_requests(messages):
        planner = planners.get(current.intent)
        plans.append(planner(current) if planner else Plan(text=HELP_TEXT))
    working = next((plan for plan in plans if plan.calls), None)
    if working is not None:
        return working
    return Plan(text=" ".join(plan.text for plan in plans))


def _order_number(texts: list[str]) -> str | None:
    """The latest user message that names a number wins: a supplement corrects or fills in."""
    for text in reversed(texts):
        after_word = _ORDER_NUMBER_AFTER_WORD.search(text.lower())
        if after_word:
            return after_word.group(1)
        anywhere = NUMBER.search(text)
        if anywhere:
            return anywhere.group(0)
    return None


def _city(text: str) -> str:
    _, found, after = text.rpartition(" in ")
    if not found:
        return "Paris"
    clause = re.split(r"[.,;:!?]", after, maxsplit=1)[0]
    words = [word.strip("'\"()") for word in clause.split()]
    capitalised = []
    for word in words:
        if not word[:1].isupper():
            break
        capitalised.append(word)
    city = " ".join(capitalised) or (words[0].capitalize() if words else "")
    return city or "Paris"


def _error_text(error: dict) -> str:
    """The customer reads this: the tool message's plain-language `message` (tools_app.outcomes),
    never a raw code. Without one (an older or foreign tool), a general sentence."""
    message = str(error.get("message") or "").strip() or "something went wrong on the other side."
    return message[:1].lower() + message[1:] if not message[:2].isupper() else message


def _ask_for_the_order(current: Request, question: str) -> Plan:
    """Ask the user (and wait for the answer); if the question went unanswered, say what is missing."""
    if any(result.error for result in current.results_of("ask_user")):
        return Plan(text=NO_ANSWER_TEXT)
    return Plan(calls=(PlannedCall("ask_user", {"question": question}),))


def _plan_refund(current: Request) -> Plan:
    order_id = _order_number(current.user_texts)
    if order_id is None:
        return _ask_for_the_order(current, ASK_REFUND_ORDER_TEXT)
    lookups = [r for r in current.results_of("query_order") if str(r.arguments.get("order_id")) == order_id]
    refunds = [r for r in current.results_of("execute_refund") if str(r.arguments.get("order_id")) == order_id]
    order = lookups[-1].payload if lookups else {}
    if refunds:
        # Of duplicate refund calls, one booked refund is the outcome the user cares about.
        booked = next((r for r in refunds if "refund_id" in r.payload), refunds[-1])
        return Plan(text=_refund_outcome_text(order_id, booked, order))
    if not lookups:
        return Plan(calls=(PlannedCall("query_order", {"order_id": order_id}),))
    if lookups[-1].error:
        return Plan(text=f"I could not look up order {order_id}: {_error_text(lookups[-1].error)}")
    if order.get("refunded"):
        # The order says it was refunded already: asking for a second refund would only be refused.
        return Plan(text=f"Order {order_id} has already been refunded, so there is nothing more to refund.")
    if order.get("refund_eligible"):
        arguments = {"order_id": order_id, "amount": order.get("amount"), "reason": "customer request"}
        return Plan(calls=(PlannedCall("execute_refund", arguments),))
    reason = order.get("ineligible_reason") or "it does not meet the refund policy"
    return Plan(text=f"I'm sorry, but order {order_id} is not eligible for a refund: {reason}.")


def _refund_outcome_text(order_id: str, refund: ToolResult, order: dict) -> str:
    if refund.error:
        return f"I'm sorry, the refund for order {order_id} was not made: {_error_text(refund.error)}"
    amount = refund.payload.get("amount", refund.arguments.get("amount", order.get("amount")))
    currency = refund.payload.get("currency", order.get("currency", ""))
    money = f"{amount} {currency}".strip()
    # A refund an operator confirmed by hand may come without the gateway's answer: it is done all the same.
    reference = f" (refund id {refund.payload['refund_id']})" if "refund_id" in refund.payload else ""
    return f"Done: the refund of {money} for order {order_id} has been issued{reference}."


def _plan_order_status(current: Request) -> Plan:
    order_id = _order_number(current.user_texts)
    if order_id is None:
        return _ask_for_the_order(current, ASK_CHECK_ORDER_TEXT)
    lookups = [r for r in current.results_of("query_order") if str(r.arguments.get("order_id")) == order_id]
    if not lookups:
        return Plan(calls=(PlannedCall("query_order", {"order_id": order_id}),))
    if lookups[-1].error:
        return Plan(text=f"I could not look up order {order_id}: {_error_text(lookups[-1].error)}")
    order = lookups[-1].payload
    money = f"{order.get('amount', '?')} {order.get('currency', '')}".strip()
    return Plan(text=f"Order {order_id} is {order.get('status', 'unknown')}, amount {money}.")


def _plan_user_level(current: Request) -> Plan:
    ids = [match for text in current.user_texts for match in USER_ID.findall(text.lower())]
    user_id = ids[-1] if ids else "me"
    lookups = [r for r in current.results_of("query_user_level") if r.arguments.get("user_id") == user_id]
    if not lookups:
        return Plan(calls=(PlannedCall("query_user_level", {"user_id": user_id}),))
    if lookups[-1].error:
        return Plan(text=f"I could not look up the level of {user_id}: {_error_text(lookups[-1].error)}")
    result = lookups[-1].payload
    who = "Your" if user_id == "me" else f"User {result.get('user_id', user_id)}'s"
    return Plan(text=f"{who} level is {result.get('level', 'unknown')}.")


def _plan_weather(current: Request) -> Plan:
    city = _city(current.intent_text)
    lookups = [r for r in current.results_of("get_weather") if str(r.arguments.get("city")).lower() == city.lower()]
    if not lookups:
        return Plan(calls=(PlannedCall("get_weather", {"city": city}),))
    if lookups[-1].error:
        return Plan(text=f"I could not get the weather in {city}: {_error_text(lookups[-1].error)}")
    weather = lookups[-1].payload
    return Plan(text=f"The weather in {city} is {weather.get('summary')}, {weather.get('temperature_c')}°C.")


def _plan_noop(current: Request) -> Plan:
    wanted = noop_count(current.intent_text.lower()) or 0
    done = len(current.results_of("noop"))
    if done < wanted:
        return Plan(calls=(PlannedCall("noop", {"i": done}),))
    return Plan(text=f"Done: {wanted} no-op calls.")
