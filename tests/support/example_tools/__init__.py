"""A deployment's own tool package, outside Warden's apps: docs/EXTENDING.md walks through it, and
tests/agents/test_bring_your_own_agent.py registers it only through WARDEN_TOOL_MODULES."""
