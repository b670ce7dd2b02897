"""The immediate contradiction check on write: a constitutional entry or an operator's
rule is compared at once, and the create/update response names the dispute."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from maintenance import contradictions
from maintenance.models import Dispute
from memory import accounts, entry_changes, new_entries
from memory.models import Entry

API = "/api/v1"
ALWAYS = "Always deploy the billing service on Fridays after the freeze."
NEVER = "Never deploy the billing service on Fridays after the freeze."


@pytest.fixture(autouse=True)
def _no_rate_limit(settings):
    settings.API_RATE_LIMIT_PER_MINUTE = 0


def write(workspace, content: str, **fields: Any) -> Entry:
    return new_entries.entry_create(workspace=workspace, content=content, **fields)


def operator_rule(workspace, content: str, **fields: Any) -> Entry:
    return write(workspace, content, source="operator", entry_type="rule", **fields)


def test_a_constitutional_write_is_checked_against_an_operator_rule(workspace):
    existing = operator_rule(workspace, NEVER)
    entry = write(workspace, ALWAYS, tier="constitutional")
    [dispute] = entry.disputes
    assert (dispute.entry_a_id, dispute.entry_b_id) == (existing.pk, entry.pk)
    assert dispute.detected_by == "write" and dispute.run is None and dispute.status == "open"
    assert dispute.similarity == 1.0 and dispute.details["polarity_a"] == -1
    assert Dispute.objects.get().pk == dispute.pk


def test_an_operator_rule_is_checked_against_constitutional_and_important_entries(workspace):
    constitutional = write(workspace, ALWAYS, tier="constitutional")
    important = write(workspace, "Always deploy the billing service on Fridays after the freeze!")
    Entry.objects.filter(pk=important.pk).update(importance=contradictions.WRITE_CHECK_IMPORTANCE)
    unimportant = write(workspace, "Always deploy the billing service on Fridays, after the freeze.")
    entry = operator_rule(workspace, NEVER)
    assert {d.entry_a_id for d in entry.disputes} == {constitutional.pk, important.pk}
    assert not Dispute.objects.filter(entry_a=unimportant).exists()


def test_writes_that_are_not_checked(workspace):
    write(workspace, ALWAYS, tier="constitutional")
    agent_observation = write(workspace, NEVER)  # an agent's observation
    agent_rule = write(workspace, NEVER + " ", entry_type="rule")  # a rule, but not an operator's
    operator_note = write(workspace, NEVER + "  ", source="operator")  # an operator's observation
    for entry in (agent_observation, agent_rule, operator_note):
        assert entry.disputes == []
    assert not Dispute.objects.exists()


def test_the_check_looks_at_the_40_newest_candidates(workspace, now):
    operator_rule(workspace, NEVER, created_at=now - timedelta(days=2))
    newer = [
        write(
            workspace,
            f"Document release step {i}.",
            tier="constitutional",
            created_at=now - timedelta(days=1),
        )
        for i in range(contradictions.WRITE_CHECK_LIMIT)
    ]
    first = write(workspace, ALWAYS, tier="constitutional")
    assert first.disputes == []
    # With one candidate fewer (and the first write tombstoned), the rule is among the 40.
    for entry in (first, newer[0]):
        entry_changes.entry_tombstone(workspace=workspace, entry_id=entry.pk)
    assert len(write(workspace, ALWAYS, tier="constitutional").disputes) == 1


def test_an_update_into_a_new_version_is_checked(workspace):
    existing = operator_rule(workspace, NEVER)
    entry = write(workspace, "Deploy the billing service with the release train.", tier="constitutional")
    assert entry.disputes == []
    result = entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, content=ALWAYS)
    [dispute] = result.disputes
    assert (dispute.entry_a_id, dispute.entry_b_id) == (existing.pk, result.entry.pk)
    # A later write that changes nothing the check reads does not check again.
    assert (
        entry_changes.entry_update(workspace=workspace, entry_id=result.entry.pk, pinned=True).disputes == ()
    )


def test_making_an_entry_constitutional_checks_it_and_names_open_disputes_again(workspace):
    existing = operator_rule(workspace, NEVER)
    entry = write(workspace, ALWAYS)
    assert entry.disputes == []
    first = entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, tier="constitutional")
    second = entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, title="Friday deploys")
    assert [d.pk for d in first.disputes] == [d.pk for d in second.disputes]
    assert Dispute.objects.count() == 1
    # Once resolved, the pair is neither flagged nor named again.
    contradictions.resolve(workspace, first.disputes[0].pk, "keep_both", actor="user:ann")
    third = entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, title="Friday deploys!")
    assert third.disputes == () and Dispute.objects.count() == 1
    assert existing.pk in (first.disputes[0].entry_a_id, first.disputes[0].entry_b_id)


def test_the_check_stays_in_its_workspace_and_skips_its_own_lineage(workspace, other_workspace):
    operator_rule(other_workspace, NEVER)
    entry = write(workspace, NEVER, tier="constitutional")
    assert entry.disputes == []
    # The new version is not compared with its own earlier version.
    result = entry_changes.entry_update(workspace=workspace, entry_id=entry.pk, content=ALWAYS)
    assert result.disputes == () and not Dispute.objects.exists()


# --- through the API ------------------------------------------------------------------------------


def client(workspace, role: str) -> tuple[Client, dict[str, str]]:
    _, raw = accounts.api_key_create(workspace=workspace, name=role, role=role)
    return Client(), {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def send(workspace, role: str, method: str, path: str, body: dict[str, Any]) -> Any:
    http, headers = client(workspace, role)
    response = getattr(http, method)(
        API + path, data=json.dumps(body), content_type="application/json", **headers
    )
    return response.status_code, response.json()


def test_the_create_response_names_the_dispute(workspace):
    existing = operator_rule(workspace, NEVER)
    status, body = send(
        workspace, "operator", "post", "/entries", {"content": ALWAYS, "tier": "constitutional"}
    )
    assert status == 201, body
    dispute = Dispute.objects.get()
    assert body["disputes"] == [
        {"id": dispute.pk, "entry_a": existing.pk, "entry_b": body["id"], "similarity": 1.0}
    ]


def test_an_agent_observation_response_has_no_disputes(workspace):
    write(workspace, ALWAYS, tier="constitutional")
    status, body = send(workspace, "agent", "post", "/entries", {"content": NEVER})
    assert status == 201 and body["disputes"] == []
    assert not Dispute.objects.exists()


def test_the_update_response_names_the_dispute(workspace):
    existing = operator_rule(workspace, ALWAYS)
    entry = write(workspace, "Deploy the billing service with the release train.", tier="constitutional")
    status, body = send(workspace, "agent", "patch", f"/entries/{entry.pk}", {"content": NEVER})
    assert status == 200, body
    assert body["new_version"] is True
    [named] = body["disputes"]
    assert (named["entry_a"], named["entry_b"]) == (existing.pk, body["entry"]["id"])
    assert named["id"] == Dispute.objects.get().pk
    status, body = send(workspace, "agent", "patch", f"/entries/{body['entry']['id']}", {"pinned": True})
    assert status == 200 and body["disputes"] == []
