"""The proposal endpoints of the agent API: the workspace's open proposal set,
and an operator's approval or rejection of it.

Reading is open to every role (members included): it is what automation wants to change, and
changes nothing. Deciding needs an operator. Approving re-checks each proposal against the
current data and is refused with 409 while a run holds the workspace's lease or when the
tombstones would trip the circuit breaker without ``force`` (``maintenance.proposals``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import F, QuerySet
from django.db.models.functions import Substr
from django.http import HttpRequest
from ninja import Query, Router

from api.maintenance_schemas import ERRORS
from api.review_schemas import (
    ProposalApproveIn,
    ProposalApproveOut,
    ProposalDecisionIn,
    ProposalListIn,
    ProposalPageOut,
    ProposalRejectOut,
)
from maintenance import proposals
from maintenance.models import Proposal
from memory.auth import require
from memory.models.choices import EXCERPT_CHARS
from memory.selectors import page

router = Router(tags=["proposals"])


def _listed(qs: QuerySet[Proposal]) -> QuerySet[Proposal]:
    """The open set with what a reader needs of each entry, in the page's one query."""
    return qs.annotate(
        title=F("entry__title"),
        content_excerpt=Substr("entry__content", 1, EXCERPT_CHARS),
        entry_status=F("entry__status"),
    )


def _item(p: Proposal) -> dict[str, Any]:
    return {
        "entry_id": p.entry_ref,
        "action": p.action,
        "reason": p.reason,
        "reason_label": proposals.REASON_LABELS.get(p.reason, p.reason),
        "values": p.values,
        "why": p.why,
        "run_id": p.run_id,
        "created_at": p.created_at,
        # None once the entry is purged (the proposal keeps its id as entry_ref).
        "title": getattr(p, "title", None) or "",
        "content_excerpt": getattr(p, "content_excerpt", None) or "",
        "entry_status": getattr(p, "entry_status", None),
    }


@router.get("/proposals", response={200: ProposalPageOut, **ERRORS})
def proposal_list(request: HttpRequest, filters: Query[ProposalListIn]) -> dict[str, Any]:
    """The open proposal set, by reason then entry: each with its deciding values, the run that
    proposed it and the entry's title and content excerpt."""
    who = require(request, "viewer")
    qs = proposals.open_set(who.workspace, reason=filters.reason, action=filters.action)
    key = f"proposals:{who.workspace.pk}:{filters.reason}:{filters.action}"
    found = page(_listed(qs), limit=filters.limit, offset=filters.offset, count_key=key)
    found["items"] = [_item(p) for p in found["items"]]
    return found


@router.post("/proposals/approve", response={200: ProposalApproveOut, **ERRORS})
def proposal_approve(request: HttpRequest, payload: ProposalApproveIn) -> dict[str, Any]:
    """Operator: apply the named open proposals that still hold, as a run would (pre-prune
    backup first, revertible); what no longer holds is skipped with why."""
    who = require(request, "operator")
    return proposals.approve(
        who.workspace,
        ids=payload.ids,
        all=payload.all,
        reason=payload.reason,
        actor=who.actor,
        force=payload.force,
    )


@router.post("/proposals/reject", response={200: ProposalRejectOut, **ERRORS})
def proposal_reject(request: HttpRequest, payload: ProposalDecisionIn) -> dict[str, Any]:
    """Operator: close the named open proposals; each entry gets an operator hold, so no run
    proposes or changes it again until it is released."""
    who = require(request, "operator")
    return proposals.reject(
        who.workspace, ids=payload.ids, all=payload.all, reason=payload.reason, actor=who.actor
    )
