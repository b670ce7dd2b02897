"""Maintenance policy: defaults, ranges, clamping, and the per-workspace row."""

import math
import re
from dataclasses import fields

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from memory import accounts
from memory.models import Workspace
from memory.policy import LIMITS, PolicyValues, clamp_value, clean_tags
from memory.policy_model import MaintenancePolicy
from memory.scoring import DecayParams

# The policy limits written out by hand, independent of policy.LIMITS: (default, low, high).
POLICY_TABLE = {
    "importance_threshold": (0.15, 0, 1),
    "archive_older_than_days": (0, 0, 3650),
    "prune_older_than_days": (0, 0, 3650),
    "hard_delete_older_than_days": (0, 0, 3650),
    "decay_lambda": (0.02, 0, 1),
    "decay_sigma": (0.6, 0, 5),
    "decay_mu": (0.04, 0, 1),
    "salience_default": (1.0, 0.25, 2.0),
    "cold_threshold": (0.20, 0, 1),
    "breadth_weight": (0.0, 0, 5),
    "tombstone_grace_days": (180, 0, 3650),
    "decay_interval_seconds": (600, 60, 86400),
    "maintenance_interval_hours": (24, 1, 168),
    "stale_after_days": (90, 7, 365),
    "archive_after_days": (180, 14, 730),
    "reclaim_archived_after_days": (365, 30, 3650),
    "low_quality_min_age_days": (30, 1, 365),
    "contradiction_batch": (150, 10, 2000),
    "contradiction_max_flags": (20, 1, 500),
    "consolidation_min_group": (10, 2, 1000),
    "consolidation_min_age_days": (14, 1, 365),
    "max_tombstone_fraction": (0.5, 0.01, 1),
    "backups_keep": (5, 1, 100),
    "operator_hold_days": (0, 0, 3650),
    "audit_retention_days": (730, 0, 3650),
}
# Settings counted in whole units (days, seconds, hours, entries, files).
INTEGER_SETTINGS = {
    name
    for name in POLICY_TABLE
    if name.endswith(("_days", "_seconds", "_hours"))
    or name in ("contradiction_batch", "contradiction_max_flags", "consolidation_min_group", "backups_keep")
}
NON_NUMERIC = ["abc", "", None, [], {}, True, False, math.nan, math.inf, -math.inf, "nan", "inf", object()]


# --- the limits table ------------------------------------------------------------------------


def test_limits_cover_exactly_the_settings_of_the_policy_table():
    assert set(LIMITS) == set(POLICY_TABLE)


@pytest.mark.parametrize("name", sorted(POLICY_TABLE))
def test_each_default_and_range_equals_the_policy_table(name):
    default, low, high = POLICY_TABLE[name]
    limit = LIMITS[name]
    assert (limit.default, limit.low, limit.high) == (default, low, high)
    assert limit.integer == (name in INTEGER_SETTINGS)


@pytest.mark.parametrize("name", sorted(POLICY_TABLE))
def test_policy_values_defaults_equal_the_policy_table(name):
    assert getattr(PolicyValues(), name) == POLICY_TABLE[name][0]


def test_policy_values_exclude_tags_default_to_empty():
    assert PolicyValues().exclude_tags == ()


@pytest.mark.parametrize("name", sorted(POLICY_TABLE))
def test_model_field_defaults_equal_the_policy_table(name):
    assert MaintenancePolicy._meta.get_field(name).default == POLICY_TABLE[name][0]


def test_policy_values_has_a_field_for_every_limit_and_exclude_tags():
    assert {f.name for f in fields(PolicyValues)} == {*LIMITS, "exclude_tags", "review_mode"}


def test_a_new_workspace_proposes_and_an_unknown_review_mode_reads_as_propose(db):
    assert PolicyValues().review_mode == "propose"
    ws = accounts.workspace_create(slug="fresh")
    row = MaintenancePolicy.objects.get(workspace=ws)
    assert row.review_mode == "propose" and row.values().proposes
    row.review_mode = "yolo"
    row.save()
    assert MaintenancePolicy.objects.get(workspace=ws).review_mode == "propose"
    assert PolicyValues.from_mapping({"review_mode": "apply"}).review_mode == "apply"
    assert PolicyValues.from_mapping({"review_mode": ["apply"]}).review_mode == "propose"


# --- clamp_value ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_a_value_below_the_range_clamps_to_the_low_bound(name):
    limit = LIMITS[name]
    assert clamp_value(name, limit.low - 1) == limit.low
    assert clamp_value(name, -1e12) == limit.low


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_a_value_above_the_range_clamps_to_the_high_bound(name):
    limit = LIMITS[name]
    assert clamp_value(name, limit.high + 1) == limit.high
    assert clamp_value(name, 1e12) == limit.high


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_the_bounds_themselves_are_kept(name):
    limit = LIMITS[name]
    assert clamp_value(name, limit.low) == limit.low
    assert clamp_value(name, limit.high) == limit.high
    assert clamp_value(name, limit.default) == limit.default


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_an_integer_too_large_for_a_float_clamps_instead_of_crashing(name):
    limit = LIMITS[name]
    assert clamp_value(name, 10**400) == limit.high
    assert clamp_value(name, -(10**400)) == limit.low


@pytest.mark.parametrize(
    "value", NON_NUMERIC, ids=lambda v: type(v).__name__ if type(v) is object else repr(v)
)
@pytest.mark.parametrize("name", sorted(LIMITS))
def test_a_non_numeric_value_falls_back_to_the_default(name, value):
    assert clamp_value(name, value) == LIMITS[name].default


def test_infinity_is_not_clamped_to_a_bound_but_replaced_by_the_default():
    assert clamp_value("tombstone_grace_days", math.inf) == 180
    assert clamp_value("tombstone_grace_days", -math.inf) == 180


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("importance_threshold", "0.3", 0.3),
        ("importance_threshold", " 0.3 ", 0.3),
        ("importance_threshold", "7", 1.0),
        ("decay_sigma", "1e0", 1.0),
        ("tombstone_grace_days", "30", 30),
        ("tombstone_grace_days", "-5", 0),
        ("backups_keep", "12.9", 12),
    ],
)
def test_numeric_strings_are_accepted(name, value, expected):
    assert clamp_value(name, value) == expected


@pytest.mark.parametrize("name", sorted(INTEGER_SETTINGS))
def test_integer_settings_round_down_and_come_back_as_int(name):
    limit = LIMITS[name]
    inside = limit.low + 1.9  # every integer range is wider than 2
    result = clamp_value(name, inside)
    assert result == int(limit.low) + 1
    assert type(result) is int
    assert type(clamp_value(name, None)) is int
    assert type(clamp_value(name, limit.high + 0.5)) is int
    assert clamp_value(name, limit.high + 0.5) == limit.high


@pytest.mark.parametrize("name", sorted(set(LIMITS) - INTEGER_SETTINGS))
def test_float_settings_keep_their_fraction(name):
    limit = LIMITS[name]
    middle = (limit.low + limit.high) / 2 + 0.0001
    assert clamp_value(name, middle) == pytest.approx(middle)
    assert isinstance(clamp_value(name, middle), float)


def test_an_unknown_setting_is_a_programming_error():
    with pytest.raises(KeyError):
        clamp_value("no_such_setting", 1)


# --- clean_tags ----------------------------------------------------------------------------------


def test_clean_tags_trims_and_deduplicates_keeping_order():
    assert clean_tags([" keep ", "keep", "b", "", "   ", "a", "b"]) == ["keep", "b", "a"]


def test_clean_tags_accepts_a_comma_separated_string():
    assert clean_tags("keep, frozen ,,keep,") == ["keep", "frozen"]


@pytest.mark.parametrize("value", [None, 3, {"a": 1}, True])
def test_clean_tags_of_anything_else_is_empty(value):
    assert clean_tags(value) == []


def test_clean_tags_skips_non_string_items():
    assert clean_tags(["a", 1, None, ["b"], "c"]) == ["a", "c"]


def test_clean_tags_accepts_a_tuple():
    assert clean_tags(("x", " y")) == ["x", "y"]


# --- PolicyValues --------------------------------------------------------------------------------


def test_policy_values_from_an_empty_mapping_are_the_defaults():
    assert PolicyValues.from_mapping({}) == PolicyValues()


def test_policy_values_from_a_mapping_clamp_every_value():
    values = PolicyValues.from_mapping(
        {
            "importance_threshold": 3,
            "stale_after_days": 1,
            "decay_lambda": "abc",
            "backups_keep": "7.5",
            "exclude_tags": "a, b, a",
        }
    )
    assert values.importance_threshold == 1.0
    assert values.stale_after_days == 7
    assert values.decay_lambda == 0.02
    assert values.backups_keep == 7
    assert values.exclude_tags == ("a", "b")


def test_purge_grace_days_is_the_tombstone_grace_when_hard_delete_is_off():
    assert PolicyValues().purge_grace_days == 180
    assert PolicyValues(tombstone_grace_days=30).purge_grace_days == 30


def test_purge_grace_days_is_hard_delete_older_than_days_when_it_is_set():
    assert PolicyValues(hard_delete_older_than_days=7, tombstone_grace_days=30).purge_grace_days == 7
    assert PolicyValues(hard_delete_older_than_days=400).purge_grace_days == 400


def test_purge_grace_days_may_be_zero_when_the_tombstone_grace_is_zero():
    assert PolicyValues(tombstone_grace_days=0).purge_grace_days == 0


def test_decay_params_map_each_policy_field_to_its_parameter():
    values = PolicyValues(
        decay_lambda=0.1,
        decay_sigma=0.2,
        decay_mu=0.3,
        salience_default=0.4,
        cold_threshold=0.5,
        breadth_weight=0.6,
    )
    assert values.decay_params == DecayParams(
        lam=0.1, sigma=0.2, mu=0.3, salience_default=0.4, cold_threshold=0.5, breadth_weight=0.6
    )


def test_default_policy_gives_the_default_decay_params():
    assert PolicyValues().decay_params == DecayParams()


# --- the MaintenancePolicy row ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_new_workspace_gets_a_policy_row_with_the_defaults(workspace):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    for name, (default, _low, _high) in POLICY_TABLE.items():
        assert getattr(row, name) == default, name
    assert row.exclude_tags == []


@pytest.mark.django_db
def test_saving_a_policy_clamps_what_is_stored(workspace):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    row.importance_threshold = 5
    row.stale_after_days = 1
    row.decay_sigma = "abc"
    row.tombstone_grace_days = "45.8"
    row.backups_keep = math.nan
    row.max_tombstone_fraction = -1
    row.exclude_tags = " keep , keep,frozen"
    row.save()
    stored = MaintenancePolicy.objects.values().get(pk=row.pk)
    assert stored["importance_threshold"] == 1.0
    assert stored["stale_after_days"] == 7
    assert stored["decay_sigma"] == 0.6
    assert stored["tombstone_grace_days"] == 45
    assert stored["backups_keep"] == 5
    assert stored["max_tombstone_fraction"] == 0.01
    assert stored["exclude_tags"] == ["keep", "frozen"]


@pytest.mark.django_db
def test_a_hand_edited_out_of_range_row_is_clamped_again_when_read(workspace):
    MaintenancePolicy.objects.filter(workspace=workspace).update(
        importance_threshold=9.0, decay_interval_seconds=1, exclude_tags=[" x ", 3, "x"]
    )
    values = MaintenancePolicy.for_workspace(workspace)
    assert values.importance_threshold == 1.0
    assert values.decay_interval_seconds == 60
    assert values.exclude_tags == ("x",)


@pytest.mark.django_db
def test_for_workspace_returns_defaults_for_a_workspace_without_a_row(db):
    bare = Workspace.objects.create(slug="bare")
    assert not MaintenancePolicy.objects.filter(workspace=bare).exists()
    assert MaintenancePolicy.for_workspace(bare) == PolicyValues()


@pytest.mark.django_db
def test_for_workspace_reads_fresh_values_after_every_update(workspace):
    assert MaintenancePolicy.for_workspace(workspace).tombstone_grace_days == 180
    row = MaintenancePolicy.objects.get(workspace=workspace)
    row.tombstone_grace_days = 30
    row.save()
    assert MaintenancePolicy.for_workspace(workspace).tombstone_grace_days == 30
    MaintenancePolicy.objects.filter(workspace=workspace).update(tombstone_grace_days=12)
    assert MaintenancePolicy.for_workspace(workspace).tombstone_grace_days == 12


@pytest.mark.django_db
def test_each_workspace_reads_its_own_policy(workspace, other_workspace):
    MaintenancePolicy.objects.filter(workspace=workspace).update(cold_threshold=0.5)
    assert MaintenancePolicy.for_workspace(workspace).cold_threshold == 0.5
    assert MaintenancePolicy.for_workspace(other_workspace).cold_threshold == 0.2


@pytest.mark.django_db
def test_the_row_values_are_the_clamped_policy_values(workspace):
    row = MaintenancePolicy.objects.get(workspace=workspace)
    row.hard_delete_older_than_days = 20
    row.save()
    assert row.values() == PolicyValues(hard_delete_older_than_days=20, review_mode="apply")
    assert row.values().purge_grace_days == 20


@pytest.mark.django_db
def test_workspace_create_makes_exactly_one_policy_row(db):
    ws = accounts.workspace_create(slug="solo")
    assert MaintenancePolicy.objects.filter(workspace=ws).count() == 1


# --- the one write ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_write_changes_only_the_named_settings_clamped(workspace):
    MaintenancePolicy.objects.filter(workspace=workspace).update(stale_after_days=30)
    row = MaintenancePolicy.write(workspace, {"cold_threshold": 7, "exclude_tags": " a , a,b"})
    stored = MaintenancePolicy.objects.values().get(workspace=workspace)
    assert (stored["cold_threshold"], stored["exclude_tags"], stored["stale_after_days"]) == (
        1.0,
        ["a", "b"],
        30,
    )
    assert row.pk == stored["id"]


@pytest.mark.django_db
def test_the_write_creates_the_row_of_a_workspace_without_one(workspace):
    MaintenancePolicy.objects.filter(workspace=workspace).delete()
    MaintenancePolicy.write(workspace, {"backups_keep": 9})
    row = MaintenancePolicy.objects.get(workspace=workspace)
    assert (row.backups_keep, row.stale_after_days) == (9, POLICY_TABLE["stale_after_days"][0])


@pytest.mark.django_db
@pytest.mark.parametrize(
    "changes, named",
    [
        ({"workspace_id": 2}, "workspace_id"),
        ({"updated_at": None}, "updated_at"),
        ({"residue_patterns": ["(["]}, "(["),
    ],
)
def test_the_write_refuses_what_is_not_a_setting_or_a_bad_pattern_and_changes_nothing(
    workspace, changes, named
):
    before = MaintenancePolicy.objects.values().get(workspace=workspace)
    with pytest.raises(ValueError, match=re.escape(named)):
        MaintenancePolicy.write(workspace, {"backups_keep": 9, **changes})
    assert MaintenancePolicy.objects.values().get(workspace=workspace) == before


@pytest.mark.django_db
def test_the_api_and_the_settings_page_both_write_through_it(workspace, monkeypatch):
    seen = []
    write = MaintenancePolicy.write.__func__

    def recorded(cls, ws, changes):
        seen.append(dict(changes))
        return write(cls, ws, changes)

    monkeypatch.setattr(MaintenancePolicy, "write", classmethod(recorded))
    raw = accounts.api_key_create(workspace=workspace, name="admin", role="admin")[1]
    response = Client().put(
        "/api/v1/policy",
        {"backups_keep": 8},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 200, response.content
    user = get_user_model().objects.create_user("boss", password="x")
    accounts.membership_set(workspace=workspace, user=user, role="admin")
    client = Client()
    client.force_login(user)
    row = MaintenancePolicy.objects.get(workspace=workspace)
    shown = {name: getattr(row, name) for name in LIMITS}
    shown.update(review_mode=row.review_mode, exclude_tags="", residue_patterns="")
    # As the page submits it: the values it showed (hidden), and the field the admin changed.
    form = {**shown, **{f"initial-{name}": value for name, value in shown.items()}, "backups_keep": 7}
    response = client.post(reverse("console:settings_policy", kwargs={"slug": workspace.slug}), form)
    assert response.status_code == 303, response.content
    assert seen == [{"backups_keep": 8}, {"backups_keep": 7}]
    assert MaintenancePolicy.objects.get(workspace=workspace).backups_keep == 7


@pytest.mark.django_db
def test_the_read_gives_the_row_or_unsaved_defaults_and_never_writes(workspace):
    MaintenancePolicy.objects.filter(workspace=workspace).update(backups_keep=9)
    assert MaintenancePolicy.read(workspace).backups_keep == 9
    MaintenancePolicy.objects.filter(workspace=workspace).delete()
    row = MaintenancePolicy.read(workspace)
    assert row.pk is None and row.backups_keep == POLICY_TABLE["backups_keep"][0]
    assert not MaintenancePolicy.objects.filter(workspace=workspace).exists()
    assert MaintenancePolicy.for_workspace(workspace) == PolicyValues()
