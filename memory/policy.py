"""Maintenance policy limits and the clamping every stored or submitted value goes
through. Pure: no ORM, so the rules are testable on their own."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

from memory.scoring import DecayParams


@dataclass(frozen=True)
class Limit:
    default: float
    low: float
    high: float
    integer: bool = False


LIMITS: dict[str, Limit] = {
    "importance_threshold": Limit(0.15, 0.0, 1.0),
    "archive_older_than_days": Limit(0, 0, 3650, integer=True),
    "prune_older_than_days": Limit(0, 0, 3650, integer=True),
    "hard_delete_older_than_days": Limit(0, 0, 3650, integer=True),
    "decay_lambda": Limit(0.02, 0.0, 1.0),
    "decay_sigma": Limit(0.6, 0.0, 5.0),
    "decay_mu": Limit(0.04, 0.0, 1.0),
    "salience_default": Limit(1.0, 0.25, 2.0),
    "cold_threshold": Limit(0.20, 0.0, 1.0),
    "breadth_weight": Limit(0.0, 0.0, 5.0),
    "tombstone_grace_days": Limit(180, 0, 3650, integer=True),
    "decay_interval_seconds": Limit(600, 60, 86400, integer=True),
    "maintenance_interval_hours": Limit(24, 1, 168, integer=True),
    "stale_after_days": Limit(90, 7, 365, integer=True),
    "archive_after_days": Limit(180, 14, 730, integer=True),
    "reclaim_archived_after_days": Limit(365, 30, 3650, integer=True),
    "low_quality_min_age_days": Limit(30, 1, 365, integer=True),
    "contradiction_batch": Limit(150, 10, 2000, integer=True),
    "contradiction_max_flags": Limit(20, 1, 500, integer=True),
    "consolidation_min_group": Limit(10, 2, 1000, integer=True),
    "consolidation_min_age_days": Limit(14, 1, 365, integer=True),
    "max_tombstone_fraction": Limit(0.5, 0.01, 1.0),
    "backups_keep": Limit(5, 1, 100, integer=True),
    "operator_hold_days": Limit(0, 0, 3650, integer=True),
    # How long the bookkeeping of maintenance (runs, their events, records of purged lineages)
    # is kept; 0 = for ever. What an operator can still revert is kept regardless.
    "audit_retention_days": Limit(730, 0, 3650, integer=True),
}

# Who has the last word on archives and tombstones: in ``propose`` mode the passes
# record proposals an operator approves; in ``apply`` mode they change entries at once.
PROPOSE = "propose"
APPLY = "apply"
REVIEW_MODES = (PROPOSE, APPLY)


def clean_review_mode(value: Any) -> str:
    """A known review mode, else ``propose``: the reading that can never lose data."""
    return value if value in REVIEW_MODES else PROPOSE


def clamp_value(name: str, value: Any) -> float | int:
    """Clamp ``value`` into the setting's range; anything non-numeric gives the default.

    Booleans, NaN and infinities count as non-numeric: none of them is a meaningful setting.
    Integer settings round down after clamping (3.9 days is 3 whole days).
    """
    limit = LIMITS[name]
    number: float | None
    if isinstance(value, bool) or value is None:
        number = None
    else:
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float is finite: clamp it
            number = float(limit.high if value > 0 else limit.low)
        except (TypeError, ValueError):
            number = None
    if number is None or not math.isfinite(number):
        number = float(limit.default)
    number = min(max(number, limit.low), limit.high)
    if limit.integer:
        return math.floor(number)
    return number


def clean_tags(value: Any) -> list[str]:
    """exclude_tags: a list (or comma-separated string) of tag names, trimmed, deduplicated."""
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return []
    seen: dict[str, None] = {}
    for item in items:
        # A tag with a NUL character cannot exist (PostgreSQL stores none): it protects nothing.
        if isinstance(item, str) and item.strip() and "\x00" not in item:
            seen.setdefault(item.strip(), None)
    return list(seen)


@dataclass(frozen=True)
class PolicyValues:
    """The effective, clamped policy a run works with."""

    importance_threshold: float = 0.15
    archive_older_than_days: int = 0
    prune_older_than_days: int = 0
    hard_delete_older_than_days: int = 0
    decay_lambda: float = 0.02
    decay_sigma: float = 0.6
    decay_mu: float = 0.04
    salience_default: float = 1.0
    cold_threshold: float = 0.20
    breadth_weight: float = 0.0
    tombstone_grace_days: int = 180
    decay_interval_seconds: int = 600
    maintenance_interval_hours: int = 24
    stale_after_days: int = 90
    archive_after_days: int = 180
    reclaim_archived_after_days: int = 365
    low_quality_min_age_days: int = 30
    contradiction_batch: int = 150
    contradiction_max_flags: int = 20
    consolidation_min_group: int = 10
    consolidation_min_age_days: int = 14
    max_tombstone_fraction: float = 0.5
    backups_keep: int = 5
    operator_hold_days: int = 0
    audit_retention_days: int = 730
    exclude_tags: tuple[str, ...] = ()
    review_mode: str = PROPOSE

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> PolicyValues:
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "exclude_tags":
                values[f.name] = tuple(clean_tags(data.get("exclude_tags", [])))
            elif f.name == "review_mode":
                values[f.name] = clean_review_mode(data.get("review_mode"))
            else:
                values[f.name] = clamp_value(f.name, data.get(f.name))
        return cls(**values)

    @property
    def decay_params(self) -> DecayParams:
        return DecayParams(
            lam=self.decay_lambda,
            sigma=self.decay_sigma,
            mu=self.decay_mu,
            salience_default=self.salience_default,
            cold_threshold=self.cold_threshold,
            breadth_weight=self.breadth_weight,
        )

    @property
    def proposes(self) -> bool:
        return self.review_mode == PROPOSE

    @property
    def purge_grace_days(self) -> int:
        """Grace between tombstone and purge: hard_delete_older_than_days if set, else the
        tombstone grace."""
        return self.hard_delete_older_than_days or self.tombstone_grace_days


# Hygiene's implementation_residue patterns, as an operator stores them: ``SOURCE_PATH`` stands
# for the built-in source-path detector.
SOURCE_PATH = "<source-path>"
MAX_PATTERNS = 50
MAX_PATTERN_CHARS = 200


def clean_residue_patterns(value: Any) -> list[str]:
    """Validate residue patterns for storage: a list of strings, each a regular expression
    that compiles (or ``<source-path>``). Blank entries are dropped, duplicates removed; None
    gives [] (= the built-in defaults). Raises ValueError with a message naming the problem."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ValueError("residue_patterns: must be a list of strings (regular expressions)")
    if len(value) > MAX_PATTERNS:
        raise ValueError(f"residue_patterns: at most {MAX_PATTERNS} patterns")
    out: dict[str, None] = {}
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"residue_patterns: {item!r} is not a string")
        if "\x00" in item:
            raise ValueError("residue_patterns: a pattern may not contain a NUL character")
        item = item.strip()
        if not item:
            continue
        if len(item) > MAX_PATTERN_CHARS:
            raise ValueError(
                f"residue_patterns: {item[:40]!r}… is longer than {MAX_PATTERN_CHARS} characters"
            )
        if item != SOURCE_PATH:
            try:
                re.compile(item, re.I)
            except re.error as exc:
                raise ValueError(
                    f"residue_patterns: {item!r} is not a valid regular expression ({exc})"
                ) from None
        out.setdefault(item, None)
    return list(out)
