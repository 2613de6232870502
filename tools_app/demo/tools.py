"""Demo tools (query_order, query_user_level, execute_refund, get_weather, noop) — being written."""
