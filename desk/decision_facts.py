"""What every page that decides about one write shows beside the decision: the customer's request,
the conversation so far, what the run's reads found, the tool's declared business fields with their
currency, the agent's limit windows with this call in them, and the other calls that asked for the
same business key — on the approve and reject pages (desk.approval_views) and the record-outcome
page (desk.tool_call_views) alike, so an operator decides with everything on one page."""

from agents.selectors import tool_call_limit_windows
from approvals_app.selectors import call_conversation, call_customer_request, call_read_results, call_same_key_calls
from desk.display import (
    conversation_table, declared_fields, limit_windows_table, read_results_table, same_key_table,
)
from tools_app.models import ToolCall


def call_facts(*, tool_call: ToolCall) -> dict:
    """The template context of templates/admin/desk/_call_facts.html and _call_context.html."""
    return {
        "customer": tool_call.run.session.owner.get_username(),
        "customer_request": call_customer_request(tool_call=tool_call),
        "business_fields": declared_fields(tool_call),
        "limit_windows": limit_windows_table(tool_call_limit_windows(tool_call=tool_call)),
        "same_key_calls": same_key_table(call_same_key_calls(tool_call=tool_call), business_key=tool_call.business_key),
        "read_results": read_results_table(call_read_results(tool_call=tool_call)),
        "conversation": conversation_table(call_conversation(tool_call=tool_call)),
    }
