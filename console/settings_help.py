"""What each maintenance policy setting does, for the settings page: the settings grouped by
purpose, and one sentence per setting saying what it changes and which pass (or which part of
the product) uses it. Pure data: the page renders it, and a test checks that every setting of
the policy is in exactly one group and has its sentence."""

from __future__ import annotations

from dataclasses import dataclass

from memory.policy import LIMITS


@dataclass(frozen=True)
class Group:
    key: str
    title: str
    intro: str
    names: tuple[str, ...]


GROUPS: tuple[Group, ...] = (
    Group(
        "decisions",
        "Decisions and safety",
        "Who has the last word on archives and tombstones, and what keeps automation away from an entry.",
        ("review_mode", "operator_hold_days", "max_tombstone_fraction", "exclude_tags"),
    ),
    Group(
        "ageing",
        "Ageing out unused memories",
        "A memory nobody reads or updates goes from active to stale, then archived, then tombstoned "
        "(a pinned, protected or high-value one stays archived); each step is one pass of a full run.",
        ("stale_after_days", "archive_after_days", "reclaim_archived_after_days"),
    ),
    Group(
        "retention",
        "Retention and the decay pass",
        "Retention = salience × e^(−λ·age in days) + a read bonus (σ · ln(1 + reads) · e^(−μ·days since the "
        "last read), more with more readers). It starts at the salience (1 by default) and can exceed 1: "
        "it is not a 0–1 score. The decay pass compares it with the cold threshold.",
        ("cold_threshold", "decay_lambda", "decay_sigma", "decay_mu", "salience_default", "breadth_weight"),
    ),
    Group(
        "importance",
        "Importance rules",
        "Optional rules for old, unimportant entries. Importance is between 0 and 1: significance, links "
        "and recency, weighed by code anchors and trust (the entry page shows its parts).",
        ("importance_threshold", "archive_older_than_days", "prune_older_than_days"),
    ),
    Group(
        "hygiene",
        "Hygiene and compaction",
        "Low-quality fragments and the many small notes of one work session.",
        (
            "low_quality_min_age_days",
            "residue_patterns",
            "consolidation_min_group",
            "consolidation_min_age_days",
        ),
    ),
    Group(
        "contradictions",
        "Contradictions",
        "The contradiction sweep flags pairs of durable memories that seem to say opposite things; "
        "similarity alone never changes an entry.",
        ("contradiction_batch", "contradiction_max_flags"),
    ),
    Group(
        "purge",
        "Tombstones, purges and backups",
        "A tombstoned entry can be restored until the purge pass deletes it for good, after a backup.",
        ("tombstone_grace_days", "hard_delete_older_than_days", "backups_keep"),
    ),
    Group(
        "schedule",
        "Schedule and bookkeeping",
        "When the scheduler starts runs on its own, and how long their records are kept.",
        ("maintenance_interval_hours", "decay_interval_seconds", "audit_retention_days"),
    ),
)

HELP: dict[str, str] = {
    "review_mode": "Propose: runs record archives and tombstones as proposals that wait for an operator on "
    "the review page. Apply: runs make them at once, each one revertible. Purges past their grace happen "
    "in both modes.",
    "operator_hold_days": "How long an operator's decision (a restore, a rejected proposal) keeps the "
    "passes that mark stale, archive or tombstone away from the entry; 0 keeps it until the hold is "
    "released.",
    "max_tombstone_fraction": "The circuit breaker: a run or an approval that would tombstone more than this "
    "fraction of the live entries (and more than 20 of them) is blocked until an operator forces it.",
    "exclude_tags": "Entries with any of these tags (comma-separated) are never marked stale, archived "
    "or tombstoned by a pass (they are still scored, can graduate from staged, and are purged once an "
    "operator tombstones them).",
    "stale_after_days": "The stale pass marks an active entry stale once it has been neither read nor "
    "updated for this many days.",
    "archive_after_days": "The archive pass archives an entry that has been stale for this many days.",
    "reclaim_archived_after_days": "The reclaim pass tombstones an entry that has been archived for this "
    "many days (never a pinned, protected or high-value one).",
    "cold_threshold": "The decay pass tombstones an episodic memory whose retention is below this value "
    "(never a pinned, protected or high-value one).",
    "decay_lambda": "λ, how fast retention fades with age, per day: the larger, the sooner an unread "
    "memory falls below the decay pass's cold threshold.",
    "decay_sigma": "σ, the weight of reads in retention: how much being read keeps a memory away from the "
    "decay pass.",
    "decay_mu": "μ, how fast the read bonus fades, per day since the last read (the score pass of every run "
    "recomputes retention with it).",
    "salience_default": "The salience of a memory that has none of its own (its writer gave none and no "
    "feedback set one), i.e. its retention when new, as the score pass computes it; helpful and "
    "not-helpful feedback moves an entry's own salience between 0.25 and 2.",
    "breadth_weight": "How much more the read bonus counts for each additional distinct reader "
    "(× 1 + weight · ln readers) when the score pass computes retention; 0 ignores who read it.",
    "importance_threshold": "The importance below which the archive pass (archive older than) and the prune "
    "pass may act on an old entry; it does nothing while both ages are 0, unless a prune run is given "
    "ages of its own.",
    "archive_older_than_days": "When above 0, the archive pass also archives active or stale entries older "
    "than this whose importance is below the threshold.",
    "prune_older_than_days": "When above 0, the prune pass tombstones entries older than this whose "
    "importance is below the threshold (never high-value ones).",
    "low_quality_min_age_days": "The low-quality pass archives what hygiene recommends archiving only once "
    "it is this many days old and has never been read.",
    "residue_patterns": "What hygiene counts as implementation residue (its implementation_residue "
    "reason): one regular expression per line, or <source-path>; empty uses the built-in patterns.",
    "consolidation_min_group": "The compaction pass turns a work session's test and development notes "
    "into one digest when the session has more than this many of them (they are archived, linked to it).",
    "consolidation_min_age_days": "The compaction pass only groups notes older than this many days.",
    "contradiction_batch": "How many of the newest live durable entries the contradiction sweep compares "
    "pairwise in each run.",
    "contradiction_max_flags": "The contradiction sweep flags at most this many new disputes per run.",
    "tombstone_grace_days": "How long a tombstoned entry stays restorable before the purge pass deletes "
    "it for good.",
    "hard_delete_older_than_days": "When above 0, the purge pass uses this grace instead of the tombstone "
    "grace; lowering it never purges before the date the review page showed.",
    "backups_keep": "How many pre-prune backups (written before the first destructive pass of a run, or "
    "an approval, tombstones, prunes links or purges) are kept for this workspace; manual backups are "
    "never deleted automatically.",
    "maintenance_interval_hours": "The scheduler starts a full run (every pass) this many hours after the "
    "last completed one.",
    "decay_interval_seconds": "The scheduler starts a decay sweep (scores, then the decay, expiry and "
    "purge passes) this often.",
    "audit_retention_days": "A full run removes maintenance bookkeeping (runs, events, records of purged "
    "entries) older than this; what can still be reverted is always kept; 0 removes none of them (runs "
    "that changed nothing are still folded into daily counts after a week).",
}

UNITS: dict[str, str] = {
    "maintenance_interval_hours": "hours",
    "decay_interval_seconds": "seconds",
    "contradiction_batch": "entries",
    "contradiction_max_flags": "disputes",
    "consolidation_min_group": "notes",
    "backups_keep": "backups",
    "decay_lambda": "per day",
    "decay_mu": "per day",
}


def unit(name: str) -> str:
    """The unit a value is shown with: days for the *_days settings, else ``UNITS``."""
    if name.endswith("_days"):
        return "days"
    return UNITS.get(name, "")


def range_text(name: str) -> str:
    """ "Default 90 · 7–365 days": what the value may be (LIMITS settings only)."""
    limit = LIMITS[name]

    def shown(value: float) -> str:
        return str(int(value)) if limit.integer else f"{value:g}"

    tail = f" {unit(name)}" if unit(name) else ""
    return f"Default {shown(limit.default)} · range {shown(limit.low)}–{shown(limit.high)}{tail}"
