"""The demo agent, "Refund desk (demo)", that `manage.py demo_setup` defines (demo mode only).

Its approval rules use the demo world's order amounts (demo.services.DEMO_ORDERS) so
every branch can be walked in `make run` (docs/DEMO.md): order 9541 (4.50) is refunded with no
approval, 9542 (8.00) waits for the customer's own confirmation, the walk-through orders
(9527 25.00 and the others up to 100) for an operator, and 9543 (250.00) for two operators."""

DEMO_AGENT_SLUG = "refund-desk-demo"

DEMO_AGENT = {
    "slug": DEMO_AGENT_SLUG,
    "name": "Refund desk (demo)",
    "instructions": (
        "You are Warden's customer-service agent. You can look up orders, user levels and the "
        "weather, and request refunds. Refunds are executed only after the approvals Warden asks "
        "for; never claim a refund is approved or done unless a tool result says so. When you "
        "need something only the user can tell you, ask with the ask_user tool."
    ),
    "tools": ["query_order", "query_user_level", "get_weather", "execute_refund"],
    "approval_rules": {
        "execute_refund": [
            {"when": "amount <= 5", "approval": "none"},
            {"when": "amount <= 10", "approval": "user"},
            {"when": "amount <= 100", "approval": "operator"},
            {"when": "amount > 100", "approval": "operator", "approvers": 2},
        ],
    },
    "budgets": {"max_model_calls": 20},
    "interjection_classifier": "model",
}

# The demo agent's service level (docs/NOTIFICATIONS.md), added by demo_setup (which creates the
# "leads" group first; a group must exist when a definition names it): the deciders are reminded
# after 10 minutes, and the leads told after 30.
DEMO_LEADS_GROUP = "leads"
DEMO_SERVICE_LEVELS = {"operator": {"remind_after": "10m", "escalate_after": "30m", "escalate_to": DEMO_LEADS_GROUP}}
