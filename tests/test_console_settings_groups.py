"""The settings page groups the maintenance policy by purpose, with one sentence per setting on
what it does and which pass (or the scheduler, the circuit breaker) uses it, and its default and
range apart: the help no longer only repeats the range."""

from __future__ import annotations

import re

import pytest

from console.settings_help import GROUPS, HELP, range_text
from console.views_settings import POLICY_FIELDS
from memory.policy import LIMITS
from tests.helpers_console import login


def test_every_policy_setting_is_in_exactly_one_group_with_its_sentence():
    grouped = [name for group in GROUPS for name in group.names]
    assert sorted(grouped) == sorted(POLICY_FIELDS) and len(grouped) == len(set(grouped))
    assert set(HELP) == set(POLICY_FIELDS)
    for name, sentence in HELP.items():
        assert sentence.endswith(".") and len(sentence) > 40, name
        assert "range" not in sentence.lower(), name
    assert range_text("stale_after_days") == "Default 90 · range 7–365 days"
    assert range_text("max_tombstone_fraction") == "Default 0.5 · range 0.01–1"
    # Each sentence names what uses the setting: a pass, the scheduler, the breaker, a sweep.
    for name in LIMITS:
        assert re.search(r"pass|scheduler|circuit breaker|sweep|full run", HELP[name]), name


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "admin"])
def test_the_settings_page_groups_the_policy_by_purpose(client, workspace, role):
    login(client, workspace, role)

    html = client.get(f"/console/{workspace.slug}/settings/").content.decode()

    starts = [html.index(f'id="group-{group.key}"') for group in GROUPS]
    assert starts == sorted(starts)
    ends = [*starts[1:], len(html)]
    for group, start, end in zip(GROUPS, starts, ends, strict=True):
        for name in group.names:
            assert f'id="policy-{name}"' in html[start:end], (group.key, name)
    for name in POLICY_FIELDS:
        shown = HELP[name].replace("'", "&#x27;").replace("<", "&lt;").replace(">", "&gt;")
        assert shown in html, name
    assert html.count('class="range"') == len(LIMITS)
    assert "None<code>" not in html  # every setting has its label
