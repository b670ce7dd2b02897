"""Pure score functions: hand-computed values and properties. No database."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory.scoring import (
    DecayParams,
    importance,
    importance_breakdown,
    is_cold,
    retention,
    step_salience,
)

BASE = dict(
    impact_score=None,
    significance_type=None,
    relationship_count=0,
    causal_count=0,
    age_days=0.0,
    trust_score=None,
    validation_status="none",
    anchor_status="valid",
)


def imp(**overrides):
    return importance(**{**BASE, **overrides})


def test_a_brand_new_bare_entry_scores_only_recency():
    # recency 1 × 0.15, trust multiplier 0.5 + 0.5 = 1.0
    assert imp() == pytest.approx(0.15)


def test_null_impact_counts_as_zero_and_significance_type_as_half():
    assert imp(age_days=90) == 0.0
    assert imp(age_days=90, significance_type="decision") == pytest.approx(0.5 * 0.30)
    assert imp(age_days=90, impact_score=0.8, significance_type="decision") == pytest.approx(0.8 * 0.30)
    assert imp(age_days=90, impact_score=0.2, significance_type="release") == pytest.approx(0.5 * 0.30)


def test_relationships_and_causal_links_are_capped():
    assert imp(age_days=100, relationship_count=2) == pytest.approx(2 / 5 * 0.35)
    assert imp(age_days=100, relationship_count=5) == pytest.approx(0.35)
    assert imp(age_days=100, relationship_count=50) == pytest.approx(0.35)
    assert imp(age_days=100, causal_count=1) == pytest.approx(0.20 / 3)
    assert imp(age_days=100, causal_count=3) == pytest.approx(0.20)
    assert imp(age_days=100, causal_count=9) == pytest.approx(0.20)


def test_recency_falls_linearly_to_zero_at_90_days_and_stays_there():
    assert imp(age_days=45) == pytest.approx(0.5 * 0.15)
    assert imp(age_days=89.999) > 0
    assert imp(age_days=90) == 0.0
    assert imp(age_days=400) == 0.0


def test_trust_multiplier_uses_trust_and_validation():
    full = dict(impact_score=1.0, relationship_count=5, causal_count=3, age_days=100)  # sum 0.85
    assert imp(**full) == pytest.approx(0.85 * 1.0)
    assert imp(**full, trust_score=0.0) == pytest.approx(0.85 * 0.5)
    assert imp(**full, trust_score=0.2, validation_status="failed") == pytest.approx(0.85 * (0.5 + 0.2 - 0.4))
    # 0.85 × (0.5 + 1 + 0.5) = 1.7 → clamped to 1
    assert imp(**full, trust_score=1.0, validation_status="passed") == 1.0


def test_failed_validation_with_zero_trust_still_scores_positive():
    assert imp(trust_score=0.0, validation_status="failed") == pytest.approx(0.15 * 0.1)


def test_anchor_multiplier_uses_the_worst_anchor():
    full = dict(impact_score=0.5, age_days=100)  # sum 0.15
    assert imp(**full, anchor_status="valid") == pytest.approx(0.15)
    assert imp(**full, anchor_status="stale") == pytest.approx(0.15 * 0.8)
    assert imp(**full, anchor_status="invalidated") == pytest.approx(0.15 * 0.1)


def test_breakdown_names_every_term():
    b = importance_breakdown(**{**BASE, "impact_score": 0.4, "relationship_count": 1, "causal_count": 1})
    assert b.significance == pytest.approx(0.12)
    assert b.relationships == pytest.approx(0.07)
    assert b.causal == pytest.approx(0.2 / 3)
    assert b.recency == pytest.approx(0.15)
    assert b.anchor_multiplier == 1.0
    assert b.trust_multiplier == 1.0
    assert b.importance == pytest.approx(0.12 + 0.07 + 0.2 / 3 + 0.15)


def test_unused_entry_goes_cold_after_about_80_days():
    # ln(0.2) / -0.02 = 80.47 days
    assert retention(age_days=80.4, access_count=0, days_since_access=None, salience=None, readers=0) > 0.2
    assert retention(age_days=80.5, access_count=0, days_since_access=None, salience=None, readers=0) < 0.2
    assert is_cold(retention(age_days=81, access_count=0, days_since_access=None, salience=None, readers=0))


def test_retention_hand_computed():
    r = retention(age_days=10, access_count=3, days_since_access=2, salience=1.5, readers=1)
    assert r == pytest.approx(1.5 * math.exp(-0.2) + 0.6 * math.log(4) * math.exp(-0.08))


def test_never_accessed_entries_get_no_access_term():
    assert retention(
        age_days=5, access_count=0, days_since_access=1.0, salience=1, readers=3
    ) == pytest.approx(math.exp(-0.1))
    assert retention(
        age_days=5, access_count=4, days_since_access=None, salience=1, readers=3
    ) == pytest.approx(math.exp(-0.1))


def test_breadth_weight_rewards_several_readers():
    params = DecayParams(breadth_weight=0.5)
    one = retention(age_days=0, access_count=2, days_since_access=0, salience=1, readers=1, params=params)
    four = retention(age_days=0, access_count=2, days_since_access=0, salience=1, readers=4, params=params)
    access = 0.6 * math.log(3)
    assert one == pytest.approx(1 + access)
    assert four == pytest.approx(1 + access * (1 + 0.5 * math.log(4)))
    # zero readers are treated as one (ln 1 = 0)
    zero = retention(age_days=0, access_count=2, days_since_access=0, salience=1, readers=0, params=params)
    assert zero == pytest.approx(one)


def test_negative_ages_clamp_to_zero():
    assert retention(age_days=-3, access_count=0, days_since_access=None, salience=None, readers=0) == 1.0
    assert imp(age_days=-3) == pytest.approx(0.15)


def test_salience_default_comes_from_params():
    params = DecayParams(salience_default=2.0)
    assert (
        retention(age_days=0, access_count=0, days_since_access=None, salience=None, readers=0, params=params)
        == 2.0
    )


@pytest.mark.parametrize(
    ("current", "signal", "expected"),
    [
        (None, "helpful", 1.25),
        (1.0, "not_helpful", 0.75),
        (2.0, "helpful", 2.0),
        (0.25, "not_helpful", 0.25),
        (1.75, "stale", 0.25),
        (None, "wrong", 0.25),
    ],
)
def test_feedback_steps_salience_within_bounds(current, signal, expected):
    assert step_salience(current, signal) == expected


def test_unknown_feedback_signal_is_rejected():
    with pytest.raises(ValueError, match="unknown feedback"):
        step_salience(1.0, "meh")


unit = st.floats(min_value=0, max_value=1, allow_nan=False)
maybe_unit = st.none() | unit
ages = st.floats(min_value=0, max_value=5000, allow_nan=False)
importance_inputs = st.fixed_dictionaries(
    {
        "impact_score": maybe_unit,
        "significance_type": st.sampled_from([None, "milestone", "security"]),
        "relationship_count": st.integers(0, 50),
        "causal_count": st.integers(0, 50),
        "age_days": ages,
        "trust_score": maybe_unit,
        "validation_status": st.sampled_from(["none", "passed", "failed"]),
        "anchor_status": st.sampled_from(["valid", "stale", "invalidated"]),
    }
)


@given(importance_inputs)
def test_importance_is_always_between_zero_and_one(inputs):
    assert 0.0 <= importance(**inputs) <= 1.0


@given(importance_inputs, st.floats(min_value=0, max_value=100))
def test_importance_never_rises_with_age(inputs, extra):
    older = {**inputs, "age_days": inputs["age_days"] + extra}
    assert importance(**older) <= importance(**inputs)


retention_inputs = st.fixed_dictionaries(
    {
        "age_days": ages,
        "access_count": st.integers(0, 10_000),
        "days_since_access": st.none() | ages,
        "salience": st.none() | st.floats(min_value=0.25, max_value=2.0),
        "readers": st.integers(0, 100),
    }
)
params_st = st.builds(
    DecayParams,
    lam=st.floats(0, 1),
    sigma=st.floats(0, 5),
    mu=st.floats(0, 1),
    salience_default=st.floats(0.25, 2.0),
    breadth_weight=st.floats(0, 5),
)


@given(retention_inputs, params_st, st.floats(min_value=0, max_value=365))
def test_retention_decays_monotonically_with_age(inputs, params, extra):
    older = {**inputs, "age_days": inputs["age_days"] + extra}
    assert retention(**older, params=params) <= retention(**inputs, params=params)


@given(retention_inputs, params_st, st.integers(1, 100), st.floats(min_value=0, max_value=100))
def test_access_only_helps(inputs, params, more, since):
    never = {**inputs, "access_count": 0, "days_since_access": None}
    accessed = {**inputs, "access_count": inputs["access_count"] + more, "days_since_access": since}
    assert retention(**accessed, params=params) >= retention(**never, params=params)
    busier = {**accessed, "access_count": accessed["access_count"] + more}
    assert retention(**busier, params=params) >= retention(**accessed, params=params)


@given(retention_inputs, params_st, st.floats(min_value=0.25, max_value=2.0))
def test_salience_scales_only_the_time_term(inputs, params, salience):
    base = {**inputs, "salience": 1.0}
    scaled = {**inputs, "salience": salience}
    time_term = math.exp(-params.lam * max(inputs["age_days"], 0))
    diff = retention(**scaled, params=params) - retention(**base, params=params)
    assert diff == pytest.approx((salience - 1.0) * time_term, abs=1e-9)


def test_the_worst_anchor_is_the_one_with_the_smallest_multiplier():
    from memory.scoring import worst_anchor

    assert worst_anchor([]) == "valid"
    assert worst_anchor(["valid", "stale", "valid"]) == "stale"
    assert worst_anchor(["stale", "invalidated", "valid"]) == "invalidated"
