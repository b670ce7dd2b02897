"""Importance and retention: pure functions, no ORM, ``now`` never read here.

Callers pass ages in fractional days. ``memory.scoring_db`` holds the database twin of
both formulas; ``tests/test_scoring_parity.py`` proves they agree to 1e-9.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# Importance weights (dimensionless; they sum to 1.0 before the multipliers).
W_SIGNIFICANCE = 0.30
W_RELATIONSHIPS = 0.35
W_CAUSAL = 0.20
W_RECENCY = 0.15
RELATIONSHIPS_CAP = 5  # links for the full relationship weight
CAUSAL_CAP = 3  # causal links for the full causal weight
RECENCY_DAYS = 90.0  # days until the recency term reaches zero
SIGNIFICANCE_FLOOR = 0.5  # what a set significance_type is worth as impact

ANCHOR_MULTIPLIER = {"valid": 1.0, "stale": 0.8, "invalidated": 0.1}
TRUST_DEFAULT = 0.5  # confidence assumed when trust_score is null
TRUST_BASE = 0.5
VALIDATION_BONUS = {"passed": 0.5, "failed": -0.4, "none": 0.0}

SALIENCE_MIN = 0.25
SALIENCE_MAX = 2.0
SALIENCE_STEP = 0.25  # one helpful / not_helpful feedback


NEGLIGIBLE = 1e-12


@dataclass(frozen=True)
class DecayParams:
    lam: float = 0.02  # per day: time decay rate of the salience term
    sigma: float = 0.6  # weight of access reinforcement
    mu: float = 0.04  # per day: decay rate of the access term since the last access
    salience_default: float = 1.0  # salience of an entry that has none
    cold_threshold: float = 0.20  # retention below this (strictly) is cold
    breadth_weight: float = 0.0  # weight of ln(readers) on the access term

    def __post_init__(self) -> None:
        # A rate or weight below NEGLIGIBLE is 0: its effect on a score is below any precision
        # kept, and the SQL twin must never multiply two tiny non-zero floats (PostgreSQL
        # refuses a product that underflows to 0 where Python returns 0.0).
        for name in ("lam", "sigma", "mu", "breadth_weight"):
            if 0 < abs(getattr(self, name)) < NEGLIGIBLE:
                object.__setattr__(self, name, 0.0)


@dataclass(frozen=True)
class ImportanceBreakdown:
    significance: float
    relationships: float
    causal: float
    recency: float
    anchor_multiplier: float
    trust_multiplier: float
    importance: float


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def worst_anchor(statuses: Iterable[str]) -> str:
    """The status of the anchor that weighs an entry down most (the smallest multiplier; an
    unknown status counts as valid); valid when it has none."""
    return min(statuses, key=lambda status: ANCHOR_MULTIPLIER.get(status, 1.0), default="valid")


def importance_breakdown(
    *,
    impact_score: float | None,
    significance_type: str | None,
    relationship_count: int,
    causal_count: int,
    age_days: float,
    trust_score: float | None,
    validation_status: str,
    anchor_status: str,
) -> ImportanceBreakdown:
    significance = max(impact_score or 0.0, SIGNIFICANCE_FLOOR if significance_type else 0.0) * W_SIGNIFICANCE
    relationships = min(relationship_count / RELATIONSHIPS_CAP, 1.0) * W_RELATIONSHIPS
    causal = min(causal_count / CAUSAL_CAP, 1.0) * W_CAUSAL
    # Negative ages (clock skew, future-dated imports) clamp to 0 here as they do in retention,
    # so a future-dated entry never outranks a brand-new one.
    recency = max(0.0, 1.0 - max(age_days, 0.0) / RECENCY_DAYS) * W_RECENCY
    anchor = ANCHOR_MULTIPLIER.get(anchor_status, 1.0)
    trust = TRUST_BASE + (trust_score if trust_score is not None else TRUST_DEFAULT)
    trust += VALIDATION_BONUS.get(validation_status, 0.0)
    total = (significance + relationships + causal + recency) * anchor * trust
    return ImportanceBreakdown(
        significance=significance,
        relationships=relationships,
        causal=causal,
        recency=recency,
        anchor_multiplier=anchor,
        trust_multiplier=trust,
        importance=_clamp(total, 0.0, 1.0),
    )


def importance(
    *,
    impact_score: float | None,
    significance_type: str | None,
    relationship_count: int,
    causal_count: int,
    age_days: float,
    trust_score: float | None,
    validation_status: str,
    anchor_status: str,
) -> float:
    """Blast radius × confidence, in [0, 1]."""
    return importance_breakdown(
        impact_score=impact_score,
        significance_type=significance_type,
        relationship_count=relationship_count,
        causal_count=causal_count,
        age_days=age_days,
        trust_score=trust_score,
        validation_status=validation_status,
        anchor_status=anchor_status,
    ).importance


def retention(
    *,
    age_days: float,
    access_count: int,
    days_since_access: float | None,
    salience: float | None,
    readers: int,
    params: DecayParams = DecayParams(),
) -> float:
    """R = s·e^(−λ·age) + A; A rewards access (count, recency and breadth of readers)."""
    age = max(age_days, 0.0)
    s = salience if salience is not None else params.salience_default
    time_term = s * math.exp(-params.lam * age)
    if access_count <= 0 or days_since_access is None:
        return time_term
    since = max(days_since_access, 0.0)
    breadth = 1.0 + params.breadth_weight * math.log(max(readers, 1))
    access_term = params.sigma * math.log(1 + access_count) * math.exp(-params.mu * since) * breadth
    return time_term + access_term


def is_cold(retention_value: float, params: DecayParams = DecayParams()) -> bool:
    return retention_value < params.cold_threshold


def step_salience(current: float | None, signal: str, *, default: float = 1.0) -> float:
    """Feedback on an entry: helpful +0.25, not_helpful −0.25, stale/wrong drop to the floor."""
    base = current if current is not None else default
    if signal == "helpful":
        base += SALIENCE_STEP
    elif signal == "not_helpful":
        base -= SALIENCE_STEP
    elif signal in ("stale", "wrong"):
        base = SALIENCE_MIN
    else:
        raise ValueError(f"unknown feedback signal {signal!r}")
    return _clamp(base, SALIENCE_MIN, SALIENCE_MAX)


def days_between(later_epoch: float, earlier_epoch: float) -> float:
    """Fractional days between two POSIX timestamps (the unit every age above uses)."""
    return (later_epoch - earlier_epoch) / 86400.0
