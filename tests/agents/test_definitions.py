"""An agent definition is checked as a whole before anything is saved: an unknown tool or
provider, rules that do not parse, a rule the earlier ones already cover — each refused in the
admin and the API with the field named, nothing saved. Saving makes an immutable version."""

import pytest
from django.db import IntegrityError, InternalError, transaction
from django.test import Client

from approvals_app.models import AuditEntry
from agents.errors import AgentRefusal
from config.errors import WardenError
from agents.definitions import AgentDefinitionInvalid, agent_definition_check, approval_rule_match
from agents.models import Agent, AgentVersion
from sessions_app.models import Session
from tests.support.agents import define
from tests.support.api import Api
from tests.support.factories import ApiKeyFactory, UserFactory

pytestmark = pytest.mark.django_db

ISSUE_RULES = [
    {"when": "amount <= 20", "approval": "none"},
    {"when": "amount <= 500", "approval": "user"},
    {"when": "amount <= 5000", "approval": "operator"},
    {"when": "amount > 5000", "approval": "operator", "approvers": 2},
]


def refund_agent(**changes) -> dict:
    return {"name": "Refunds", "instructions": "Refund eligible orders.", "provider": "scripted",
            "tools": ["query_order", "execute_refund"], "approval_rules": {"execute_refund": ISSUE_RULES}, **changes}


def refused_fields(definition: dict) -> dict[str, str]:
    with pytest.raises(AgentDefinitionInvalid) as refused:
        agent_definition_check(definition)
    return refused.value.errors


# --- what a definition may say ---------------------------------------------------------------------

def test_the_issues_rules_are_a_valid_definition():
    assert agent_definition_check(refund_agent())["approval_rules"] == {"execute_refund": ISSUE_RULES}


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"tools": ["query_order", "transfer_all_funds"]}, "tools", "unknown tool 'transfer_all_funds'"),
    ({"provider": "acme-llm"}, "provider", "unknown provider 'acme-llm'"),
    ({"approval_rules": {"execute_refund": [{"when": "amount <== 20", "approval": "none"}]}},
     "approval_rules.execute_refund[0].when", "cannot read"),
    ({"approval_rules": {"execute_refund": [{"when": "amount <= 20", "approval": "nobody"}]}},
     "approval_rules.execute_refund[0].approval", "none, user, operator"),
    ({"approval_rules": {"execute_refund": [{"when": "total <= 20", "approval": "none"}]}},
     "approval_rules.execute_refund[0].when", "no argument 'total'"),
    ({"approval_rules": {"execute_refund": [{"when": "amount <= 500", "approval": "user"},
                                            {"when": "amount <= 20", "approval": "none"}]}},
     "approval_rules.execute_refund[1].when", "overlaps the rules before it"),
    ({"approval_rules": {"execute_refund": [*ISSUE_RULES, {"when": "always", "approval": "operator"}]}},
     "approval_rules.execute_refund[4].when", "could never apply"),
    ({"approval_rules": {"execute_refund": [{"when": "amount <= 20", "approval": "none"},
                                            {"when": "amount < 10 and reason == \"x\"", "approval": "user"}]}},
     "approval_rules.execute_refund[1].when", "overlaps"),
    ({"approval_rules": {"query_order": [{"when": "always", "approval": "operator"}]}},
     "approval_rules.query_order", "read tool"),
    ({"approval_rules": {"execute_refund": [{"when": "amount <= 20", "approval": "user", "approvers": 2}]}},
     "approval_rules.execute_refund[0].approvers", "only operator"),
])
def test_a_bad_definition_is_refused_naming_the_field(changes, field, words):
    errors = refused_fields(refund_agent(**changes))
    assert field in errors and words in errors[field], errors


def test_rules_that_only_partly_overlap_are_accepted_first_match_wins():
    rules = [{"when": "amount > 10", "approval": "user"}, {"when": "amount <= 20", "approval": "none"}]
    agent_definition_check(refund_agent(approval_rules={"execute_refund": rules}))
    assert approval_rule_match(tool_name="execute_refund", rules=rules, arguments={"amount": "15.00"}).approval == "user"
    assert approval_rule_match(tool_name="execute_refund", rules=rules, arguments={"amount": "5.00"}).approval == "none"


@pytest.mark.parametrize(("amount", "approval", "approvers", "index"), [
    ("20.00", "none", 1, 0), ("20.01", "user", 1, 1), ("5000.00", "operator", 1, 2), ("5000.01", "operator", 2, 3),
])
def test_the_first_matching_rule_decides_and_says_why(amount, approval, approvers, index):
    match = approval_rule_match(tool_name="execute_refund", rules=ISSUE_RULES, arguments={"order_id": "1", "amount": amount})
    assert (match.approval, match.approvers) == (approval, approvers)
    assert match.rule.startswith(f"execute_refund[{index}]: {ISSUE_RULES[index]['when']}")
    assert f"amount is {amount}" in match.reason


def test_a_call_no_rule_matches_waits_for_an_operator():
    rules = [{"when": "amount <= 20", "approval": "none"}]
    match = approval_rule_match(tool_name="execute_refund", rules=rules, arguments={"amount": "21.00"})
    assert match.approval == "operator" and "no rule" in match.rule


# --- saving ---------------------------------------------------------------------------------------

def test_every_save_is_a_new_immutable_version_and_audited(agent_admin):
    first = define(refund_agent(), by=agent_admin)
    second = define(refund_agent(instructions="Refund politely."), by=agent_admin, agent=first.agent)
    agent = Agent.objects.get(slug="refunds")
    assert (first.number, second.number) == (1, 2) and agent.current_version == second
    assert AgentVersion.objects.get(pk=first.pk).instructions == "Refund eligible orders."
    assert AuditEntry.objects.filter(action="define_agent", object_id=str(agent.pk), actor=agent_admin).count() == 2
    with pytest.raises((InternalError, IntegrityError)), transaction.atomic():
        AgentVersion.objects.filter(pk=first.pk).update(instructions="rewritten")
    with pytest.raises((InternalError, IntegrityError)), transaction.atomic():
        AgentVersion.objects.filter(pk=first.pk).delete()


def test_without_the_permission_nothing_is_defined(db):
    with pytest.raises(WardenError) as refused:
        define(refund_agent(), by=UserFactory(username="nobody", is_staff=True))
    assert refused.value.code is AgentRefusal.NOT_PERMITTED
    assert not Agent.objects.exists()


# --- the API ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "field"), [
    ({"tools": ["transfer_all_funds"]}, "body.tools"),
    ({"provider": "acme-llm"}, "body.provider"),
    ({"approval_rules": {"execute_refund": [{"when": "amount ≤ 20", "approval": "none"}]}}, "body.approval_rules.execute_refund[0].when"),
    ({"approval_rules": {"execute_refund": [{"when": "amount <= 500", "approval": "user"},
                                            {"when": "amount <= 20", "approval": "none"}]}}, "body.approval_rules.execute_refund[1].when"),
])
def test_the_api_refuses_a_bad_definition_naming_the_field_and_saves_nothing(agent_admin_api, changes, field):
    response = agent_admin_api.post("/agents", refund_agent(**changes))
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "invalid_agent" and field in [f["field"] for f in body["fields"]], body
    assert not Agent.objects.exists() and not AgentVersion.objects.exists()


def test_the_api_defines_versions_and_binds_sessions_to_an_agent(agent_admin_api, agent_admin):
    created = agent_admin_api.post("/agents", refund_agent())
    assert created.status_code == 201, created.content
    assert created.json()["version"]["number"] == 1
    updated = agent_admin_api.client.put("/api/v1/agents/refunds", data=refund_agent(instructions="v2"), content_type="application/json",
                                         **agent_admin_api.headers)
    assert updated.status_code == 200 and updated.json()["versions"] == [2, 1]
    customer = Api(ApiKeyFactory(owner=UserFactory(username="carol")).secret)
    assert customer.post("/agents", refund_agent(slug="mine")).status_code == 403
    assert [a["slug"] for a in customer.get("/agents").json()] == ["refunds"]
    session = customer.post("/sessions", {"title": "refund", "agent": "refunds"})
    assert session.status_code == 201 and session.json()["agent"] == "refunds"
    unknown = customer.post("/sessions", {"title": "refund", "agent": "nope"})
    assert unknown.status_code == 404 and unknown.json()["fields"][0]["field"] == "body.agent"


def test_new_sessions_get_the_default_agent(agent_admin, settings):
    define(refund_agent(), by=agent_admin)
    settings.WARDEN_DEFAULT_AGENT = "refunds"
    customer = Api(ApiKeyFactory(owner=UserFactory(username="dave")).secret)
    assert customer.post("/sessions", {"title": "x"}).json()["agent"] == "refunds"


# --- the admin ----------------------------------------------------------------------------------------

def _admin_form(**changes) -> dict:
    form = {"name": "Refunds", "slug": "", "instructions": "Refund eligible orders.", "provider": "scripted", "model": "",
            "tools": "query_order, execute_refund", "interjection_classifier": "model",
            "approval_rules": '{"execute_refund": [{"when": "amount <= 20", "approval": "none"}]}',
            "budgets": "", "budget_limits": "", "provider_options": "",
            "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    return form | changes


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"tools": "query_order, transfer_all_funds"}, "tools", "unknown tool"),
    ({"provider": "acme-llm"}, "provider", "unknown provider"),
    ({"approval_rules": '{"execute_refund": [{"when": "amount <= 20", '}, "approval_rules", "not valid JSON"),
    ({"approval_rules": '{"execute_refund": [{"when": "amount <= 500", "approval": "user"}, '
                        '{"when": "amount <= 20", "approval": "none"}]}'}, "approval_rules", "overlaps"),
])
def test_the_admin_refuses_a_bad_definition_on_its_field_and_saves_nothing(agent_admin, changes, field, words):
    client = Client()
    client.force_login(agent_admin)
    response = client.post("/admin/agents/agent/add/", _admin_form(**changes))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors and words in " ".join(errors[field]), errors
    assert not Agent.objects.exists() and not AgentVersion.objects.exists()


def test_the_admin_saves_a_version_each_time(agent_admin):
    client = Client()
    client.force_login(agent_admin)
    response = client.post("/admin/agents/agent/add/", _admin_form())
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else response
    agent = Agent.objects.get(slug="refunds")
    page = client.get(f"/admin/agents/agent/{agent.pk}/change/")
    assert page.status_code == 200 and "amount &lt;= 20" in page.content.decode()
    client.post(f"/admin/agents/agent/{agent.pk}/change/", _admin_form(instructions="Refund politely."))
    agent.refresh_from_db()
    assert agent.current_version.number == 2 and agent.current_version.instructions == "Refund politely."
    # Without the permission the page is read-only.
    viewer = UserFactory(username="viewer", is_staff=True)
    client.force_login(viewer)
    assert client.post("/admin/agents/agent/add/", _admin_form(name="Other")).status_code == 403


# --- the console ---------------------------------------------------------------------------------------

def test_the_consoles_new_session_picks_an_agent(agent_admin):
    define(refund_agent(), by=agent_admin)
    define(refund_agent(name="Weather", tools=["get_weather"], approval_rules={}), by=agent_admin)
    customer = UserFactory(username="erin")
    client = Client()
    client.force_login(customer)
    home = client.get("/console/").content.decode()
    assert 'name="agent"' in home and ">Refunds (v1)<" in home and ">Weather (v1)<" in home
    created = client.post("/console/sessions/new/", {"title": "weather", "agent": "weather"})
    assert created.status_code == 302
    assert Session.objects.get(owner=customer).agent.slug == "weather"


# --- caps on writes and limits over time (SPEC §18) --------------------------------------------------

DAILY = {"window": "24h", "per": "customer", "max_amount": "30", "over": "operator"}


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"limits": {"execute_refund": [{**DAILY, "per": "account"}]}}, "limits.execute_refund[0].per",
     "neither customer, agent nor an argument of execute_refund"),
    ({"limits": {"execute_refund": [{**DAILY, "window": "a day"}]}}, "limits.execute_refund[0].window", "rolling window"),
    ({"limits": {"execute_refund": [{**DAILY, "window": "91d"}]}}, "limits.execute_refund[0].window", "at most 90 days"),
    ({"limits": {"execute_refund": [{**DAILY, "max_amount": "-5"}]}}, "limits.execute_refund[0].max_amount", "positive"),
    ({"limits": {"execute_refund": [{**DAILY, "currency": "EUR"}]}}, "limits.execute_refund[0].currency", "USD only"),
    ({"limits": {"execute_refund": [{**DAILY, "over": "nobody"}]}}, "limits.execute_refund[0].over", "refuse, user, operator"),
    ({"limits": {"execute_refund": [{"window": "1h", "per": "customer"}]}}, "limits.execute_refund[0]", "max_amount, max_count"),
    ({"limits": {"query_order": [DAILY]}}, "limits.query_order", "read tool"),
    ({"limits": {"get_weather": [DAILY]}}, "limits.get_weather", "not one of the agent's tools"),
    ({"write_caps": {"per_turn": 0}}, "write_caps.per_turn", "from 1 to 20"),
    ({"write_caps": {"per_turn": 3, "per_run": 2}}, "write_caps.per_turn", "more than per_run"),
    ({"write_caps": {"per_call": 1}}, "write_caps", "per_turn"),
])
def test_a_bad_limit_or_cap_is_refused_naming_the_field(changes, field, words):
    errors = refused_fields(refund_agent(**changes))
    assert field in errors and words in errors[field], errors


def test_limits_and_caps_are_kept_normalised_in_the_version(agent_admin):
    version = define(refund_agent(limits={"execute_refund": [DAILY, {"window": "1h", "per": "order_id", "max_count": 2,
                                                                      "over": "refuse"}]},
                                  write_caps={"per_turn": 1, "per_run": 3}), by=agent_admin)
    assert version.write_caps == {"per_turn": 1, "per_run": 3}
    assert version.limits == {"execute_refund": [
        {"window": "24h", "per": "customer", "max_amount": "30.00", "currency": "USD", "over": "operator", "approvers": 1},
        {"window": "1h", "per": "order_id", "max_count": 2, "currency": "USD", "over": "refuse", "approvers": 1},
    ]}


def test_the_api_refuses_a_limit_on_an_argument_the_tool_does_not_have(agent_admin_api):
    response = agent_admin_api.post("/agents", refund_agent(limits={"execute_refund": [{**DAILY, "per": "iban"}]}))
    assert response.status_code == 422, response.content
    assert "body.limits.execute_refund[0].per" in [f["field"] for f in response.json()["fields"]]
    assert not Agent.objects.exists() and not AgentVersion.objects.exists()
