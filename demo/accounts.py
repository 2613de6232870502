"""The demo world's accounts and names (`manage.py demo_setup` creates them; `serve_all` prints them)."""

DEMO_OPERATOR = ("operator", "operator-demo-pass")
DEMO_CUSTOMER = ("alice", "alice-demo-pass")
# alice is the simulated shop's customer u1: the demo tools show and refund u1's orders only.
DEMO_CUSTOMER_SHOP_ID = "u1"
# The webhook endpoint `manage.py demo_setup` wires to the simulated services' receiver page.
DEMO_WEBHOOK_ENDPOINT = "Demo receiver"
