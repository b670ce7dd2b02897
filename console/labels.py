"""The words the console shows for the API's identifiers.

A run's counts and the hygiene queue's reasons are identifiers in the API and the MCP tools
(``stale_marked``, ``incomplete_fragment``); a page names them in words and keeps the
identifier in the element's ``title``, so an operator who reads both can match them. An
identifier without a label here is shown as it is.
"""

from __future__ import annotations

COUNT_LABELS = {
    "scored": "scored",
    "staged_graduated": "graduated from staging",
    "staged_expired": "expired in staging",
    "stale_marked": "marked stale",
    "archived": "archived",
    "low_quality_archived": "archived as low quality",
    "summaries_created": "summaries written",
    "consolidated": "consolidated",
    "pruned": "pruned",
    "evicted": "evicted",
    "expired": "expired",
    "reclaimed": "reclaimed",
    "reclaimed_rows": "bookkeeping rows removed",
    "links_pruned": "links pruned",
    "hard_deleted": "purged",
    "disputes_flagged": "disputes flagged",
    "orphans": "orphans",
    "held_skipped": "held, left alone",
}

REASON_LABELS = {
    "incomplete_fragment": "incomplete fragment",
    "truncated_or_unbalanced": "truncated or unbalanced",
    "code_heavy": "mostly code",
    "implementation_residue": "implementation residue",
    "exact_duplicate": "exact duplicate",
    "flagged_by_feedback": "flagged by feedback",
    "legacy_import": "legacy import",
}


def count_label(key: str) -> str:
    return COUNT_LABELS.get(key, key)


def reason_label(code: str) -> str:
    return REASON_LABELS.get(code, code)
