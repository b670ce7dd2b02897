"""Proposals: in ``propose`` review mode the archiving and tombstoning passes
record what they would change, and an operator approves or rejects it.

- ``record`` turns a propose-mode run's plan into the workspace's open proposal set: an open
  proposal the run proposes again moves to the run (keeping the deciding values of the run
  that first proposed it for that pass), a new one is added, and an open proposal of the
  passes the run evaluated that it no longer proposes is ``superseded``. Proposals of passes
  the run did not evaluate (a decay sweep does not judge archives) stay open. So the set
  never grows past what automation wants now.
- ``approve`` re-checks every proposal against the current data with the pass's own rule (the
  protection rule, an operator hold included) and applies it exactly as a run would — the
  circuit breaker before anything changes (``force`` to pass it), the pre-prune backup before
  the first tombstone, LifecycleEvents of the proposing run naming the approving operator, so
  a whole-run revert undoes them too. What no longer holds is closed ``skipped`` with why.
- ``reject`` closes proposals and puts an operator hold on their entries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from maintenance import backups, compaction, hygiene_actions, lease, passes
from maintenance.models import MaintenanceRun, Proposal, ProposalAction, ProposalStatus, RunKind
from maintenance.pass_tools import PassResult, RunContext
from maintenance.run_results import PRUNE_PARAMS, Outcome, effective_policy, live_count, tombstones_trip
from memory import holds, lifecycle, rawsql
from memory.errors import Conflict, InvalidInput
from memory.models import Entry, LifecycleEvent, Workspace
from memory.models.choices import ID_MAX, MANAGED_SOURCES, HoldReason, Status, Tier
from memory.models.entries import protected, stored_retention
from memory.policy import PolicyValues
from memory.relationships import neighbour_ids
from memory.scoring_db import refresh_scores

# The proposing passes (count keys) in run order, each with its action.
ACTIONS: dict[str, str] = {
    "staged_expired": ProposalAction.ARCHIVE,
    "archived": ProposalAction.ARCHIVE,
    "low_quality_archived": ProposalAction.ARCHIVE,
    "consolidated": ProposalAction.ARCHIVE,
    "pruned": ProposalAction.TOMBSTONE,
    "evicted": ProposalAction.TOMBSTONE,
    "expired": ProposalAction.TOMBSTONE,
    "reclaimed": ProposalAction.TOMBSTONE,
}
REASON_LABELS = {
    "staged_expired": "staged trace expired",
    "archived": "stale or old and unimportant",
    "low_quality_archived": "low quality (hygiene)",
    "consolidated": "compacted into a retrospective",
    "pruned": "pruned: old and unimportant",
    "evicted": "decayed: retention below the cold threshold",
    "expired": "the writer's TTL passed",
    "reclaimed": "archived long enough",
}
CHUNK = 500  # ids per IN (...), rows per rewrite: far below SQLite's parameter limit


def _chunks(items: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


_ENTRY_VALUES = (
    "pk",
    "status",
    "importance",
    "access_count",
    "last_accessed_at",
    "created_at",
    "status_changed_at",
    "archived_at",
    "expires_at",
    "ttl_expires_at",
    "staged_class",
    "project",
    "session_key",
    "pinned",
)


def _days(now: datetime, moment: datetime | None) -> float | None:
    return None if moment is None else max(0.0, (now - moment).total_seconds() / 86400)


def deciding_values(
    key: str, row: Mapping[str, Any], policy: PolicyValues, now: datetime, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The values behind one proposal of pass ``key`` (``row``: the entry's columns now)."""
    age = round(_days(now, row["created_at"]) or 0.0, 1)
    accessed = _days(now, row["last_accessed_at"])
    if key == "evicted":
        return {
            "retention": row["retention"],
            "cold_threshold": policy.cold_threshold,
            "access_count": row["access_count"],
            "days_since_access": None if accessed is None else round(accessed, 1),
            "age_days": age,
        }
    stale_days = round(_days(now, row["status_changed_at"]) or 0.0, 1)
    if key == "archived" and row["status"] == Status.STALE and stale_days >= policy.archive_after_days:
        return {"stale_days": stale_days, "archive_after_days": policy.archive_after_days}
    if key in ("pruned", "archived"):
        limit = policy.prune_older_than_days if key == "pruned" else policy.archive_older_than_days
        return {
            "importance": row["importance"],
            "importance_threshold": policy.importance_threshold,
            "age_days": age,
            "older_than_days": limit,
        }
    if key == "reclaimed":
        return {
            "archived_days": round(_days(now, row["archived_at"]) or 0.0, 1),
            "reclaim_archived_after_days": policy.reclaim_archived_after_days,
        }
    if key == "expired":
        return {"expires_at": row["expires_at"].isoformat() if row["expires_at"] else None}
    if key == "staged_expired":
        return {
            "staged_class": row["staged_class"],
            "ttl_expires_at": row["ttl_expires_at"].isoformat() if row["ttl_expires_at"] else None,
        }
    if key == "consolidated":
        return {"project": row["project"], "session_key": row["session_key"], "age_days": age}
    return {**extra, "age_days": age, "access_count": row["access_count"]}  # low_quality_archived


def explain(key: str, values: Mapping[str, Any]) -> str:
    """The deciding values in words: "retention 0.12 < 0.20, never accessed, 412 days old"."""
    v = values
    age = f"{v['age_days']:.0f} days old" if "age_days" in v else ""
    if key == "evicted":
        seen = (
            "never accessed"
            if not v["access_count"]
            else f"accessed {v['access_count']}×, last {v['days_since_access']:.0f} days ago"
        )
        return f"retention {v['retention']:.2f} < {v['cold_threshold']:.2f}, {seen}, {age}"
    if "importance" in v:
        limit = v["older_than_days"]
        return f"importance {v['importance']:.2f} < {v['importance_threshold']:.2f}, {age} (> {limit})"
    if "stale_days" in v:
        return f"stale for {v['stale_days']:.0f} days (≥ {v['archive_after_days']})"
    if "archived_days" in v:
        return f"archived for {v['archived_days']:.0f} days (≥ {v['reclaim_archived_after_days']})"
    if key == "expired":
        return f"expires_at {str(v['expires_at'])[:16]} has passed"
    if key == "staged_expired":
        return f"staged {v['staged_class']} trace never reinforced; TTL ended {str(v['ttl_expires_at'])[:10]}"
    if key == "consolidated":
        return f"fragment of session {v['session_key']!r}, {age}: a retrospective replaces it"
    reasons = ", ".join(r.get("code", "?") for r in v.get("reasons", []) if isinstance(r, dict))
    return f"hygiene score {v.get('score', 0)} ({reasons}), never accessed, {age}"


def _rows(
    workspace: Workspace, ids: Sequence[int], policy: PolicyValues, now: datetime
) -> dict[int, dict[str, Any]]:
    """The proposed entries as they are now, if automation may still change them: a hold an
    operator placed (or a version written) while the run worked gets no new or rewritten
    proposal (a confirmed one moves to the run as it stands; an approval re-checks it)."""
    found: dict[int, dict[str, Any]] = {}
    rule = protected(
        now=now, hold_days=policy.operator_hold_days, exclude_tags=policy.exclude_tags, honour_pin=False
    )
    qs = Entry.objects.filter(workspace=workspace, pk__any_of=list(ids), is_latest=True).exclude(rule)
    for row in qs.values(*_ENTRY_VALUES, retention=stored_retention()):
        found[row["pk"]] = row
    return found


# Proposals a run makes or moves per part: its entries read and its proposals written a part at
# a time, so memory stays flat in the number of proposals (a first run at 1,000,000 entries
# proposes about 276,000 changes: held at once as model instances, 740 MB and then 1,085 MB in
# the next run; bench/reports/maintenance.md, "Propose mode at scale").
RECORD_PART = 5000


def record(
    run: MaintenanceRun, plan: Outcome, *, keys: Sequence[str], policy: PolicyValues, now: datetime
) -> int:
    """Make the plan of a propose-mode run (the passes ``keys`` it evaluated) the workspace's
    open proposal set; returns the number of proposals the run made (confirmed, rewritten or
    new). The open proposals are locked and read as (entry, action, id, reason) only; then,
    ``RECORD_PART`` entries at a time, the confirmed ones are moved to this run, and the
    entries of the others are read again to rewrite or make theirs (``_record_part``)."""
    workspace = run.workspace
    wanted: dict[tuple[int, str], str] = {}  # (entry, action) → pass key; a later pass wins
    for key in keys:
        for entry_id in plan.ids.get(key, []):
            wanted[(entry_id, ACTIONS[key])] = key
    # A prune judges archives by importance and age only: it leaves the full run's proposals
    # of stale entries open (it confirms or adds, never supersedes, archive proposals).
    judged = [k for k in keys if not (run.kind == RunKind.PRUNE and k == "archived")]
    evaluated = {ACTIONS[k] for k in keys}
    mine = Q(reason__in=list(keys), action__in=evaluated)  # the open proposals this run judges
    made = 0
    with transaction.atomic():
        open_set_ = Proposal.objects.select_for_update().filter(
            workspace=workspace, status=ProposalStatus.OPEN
        )
        open_rows = {
            (ref, action): (pk, reason)
            for pk, ref, action, reason in open_set_.filter(mine).values_list(
                "pk", "entry_ref", "action", "reason"
            )
        }
        stale = sorted(
            pk for pair, (pk, reason) in open_rows.items() if pair not in wanted and reason in judged
        )
        for part in _chunks(stale, RECORD_PART):
            Proposal.objects.filter(pk__any_of=part).update(status=ProposalStatus.SUPERSEDED, decided_at=now)
        # Open from a pass this run did not evaluate (e.g. decay while a full run's prune
        # proposal stands): that one stays; the entry is proposed once.
        others = set(
            Proposal.objects.filter(workspace=workspace, status=ProposalStatus.OPEN)
            .exclude(mine)
            .values_list("entry_ref", "action")
        )
        for part in _chunks(sorted(wanted.items()), RECORD_PART):
            made += _record_part(run, plan, part, open_rows, others, policy, now)
    lifecycle.announce(workspace.pk)
    return made


def _record_part(
    run: MaintenanceRun,
    plan: Outcome,
    part: Sequence[tuple[tuple[int, str], str]],
    open_rows: Mapping[tuple[int, str], tuple[int, str]],
    others: set[tuple[int, str]],
    policy: PolicyValues,
    now: datetime,
) -> int:
    """One part of ``record``: its entries read as they are now; each wanted change confirmed
    (an open proposal of the same entry, action and pass: moved to this run, its values kept),
    rewritten (an open proposal of the same entry and action from another pass: moved, with
    this pass's values), counted (one standing from a pass this run did not evaluate) or made;
    returns how many it confirmed, rewrote, counted or made.

    A confirmation writes only the proposal's run, one statement for the part: a decay sweep
    every 10 minutes over a million entries confirms about 256,000 proposals, and rewriting
    their values each time took most of a 74 s sweep (bench/reports/maintenance.md,
    "Propose mode's steady state")."""

    confirmed: list[int] = []
    rest: list[tuple[tuple[int, str], str, tuple[int, str] | None]] = []
    for pair, key in part:
        current = open_rows.get(pair)
        if current is not None and current[1] == key:
            confirmed.append(current[0])
        else:
            rest.append((pair, key, current))
    # Only the entries of proposals to make or rewrite are read again (the confirmed ones stand
    # as they are; an approval re-checks every proposal anyway).
    rows = _rows(run.workspace, sorted({pair[0] for pair, _, _ in rest}), policy, now)
    new: list[tuple[Any, ...]] = []
    rewritten: list[tuple[int, int, str, dict[str, Any], str, datetime]] = []
    standing = 0
    for (entry_id, action), key, current in rest:
        row = rows.get(entry_id)
        if row is None or (row["pinned"] and key != "expired"):
            continue  # protected since the plan: nothing to propose
        if current is None and (entry_id, action) in others:
            standing += 1
            continue
        values = deciding_values(key, row, policy, now, plan.values.get(key, {}).get(entry_id, {}))
        why = explain(key, values)[:300]
        if current is not None:
            rewritten.append((current[0], run.pk, key, values, why, now))
        else:
            new.append(
                (run.workspace_id, run.pk, entry_id, entry_id, action, key, values, why, now, *UNDECIDED)
            )
    if confirmed:
        Proposal.objects.filter(pk__any_of=confirmed).update(run=run)
    for rows_ in _chunks(rewritten):
        rawsql.update_rows(Proposal, ["run", "reason", "values", "why", "created_at"], rows_)
    for rows_ in _chunks(new, INSERT_PART):
        rawsql.insert_records(Proposal, NEW_FIELDS, rows_)
    return len(confirmed) + len(rewritten) + len(new) + standing


# What ``_record_part`` writes of a new proposal (the rest is NULL: decided_at).
NEW_FIELDS = (
    "workspace",
    "run",
    "entry",
    "entry_ref",
    "action",
    "reason",
    "values",
    "why",
    "created_at",
    "status",
    "decided_by",
    "note",
)
UNDECIDED = (ProposalStatus.OPEN, "", "")  # a new proposal's status, decided_by and note
# New proposals per INSERT (``rawsql.insert_records``: one JSON document on PostgreSQL, one
# executemany on SQLite).
INSERT_PART = 5000


# --- reading ----------------------------------------------------------------------------------


def open_proposals(workspace: Workspace | int) -> QuerySet[Proposal]:
    """The proposals still waiting for an operator's decision, unordered."""
    return Proposal.objects.filter(workspace=workspace, status=ProposalStatus.OPEN)


def open_set(
    workspace: Workspace, *, reason: str | None = None, action: str | None = None
) -> QuerySet[Proposal]:
    qs = open_proposals(workspace)
    if reason:
        qs = qs.filter(reason=reason)
    if action:
        qs = qs.filter(action=action)
    return qs.order_by("reason", "entry_ref")


def counts_by_reason(workspace: Workspace) -> list[dict[str, Any]]:
    """The open set by reason, in run order: [{reason, label, action, count}] (one query)."""
    found = dict(
        open_proposals(workspace).values("reason").annotate(n=Count("pk")).values_list("reason", "n")
    )
    return [
        {"reason": key, "label": REASON_LABELS[key], "action": ACTIONS[key], "count": found[key]}
        for key in ACTIONS
        if found.get(key)
    ]


def open_count(workspace: Workspace | int) -> int:
    return open_proposals(workspace).count()


# --- deciding ---------------------------------------------------------------------------------


def _selected(
    workspace: Workspace, *, ids: Iterable[Any] | None, all: bool, reason: str | None
) -> tuple[list[Proposal], list[dict[str, Any]]]:
    """The open proposals an approve/reject names, and the requested ids that name none."""
    if reason is not None and reason not in ACTIONS:
        raise InvalidInput(f"reason: must be one of {', '.join(ACTIONS)}")
    if all == (ids is not None):
        raise InvalidInput('give either "ids" or "all": true')
    qs = open_set(workspace, reason=reason).select_related("run")
    if all:
        return list(qs), []
    wanted: list[int] = []
    for value in ids or []:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= ID_MAX:
            raise InvalidInput(f"ids: {value!r} is not an entry id")
        wanted.append(value)
    found = list(qs.filter(entry_ref__in=wanted))
    named = {p.entry_ref for p in found}
    missing = [
        {"id": i, "why": "no open proposal for this entry"} for i in dict.fromkeys(wanted) if i not in named
    ]
    return found, missing


def _why_not(
    row: Entry | None, key: str, policy: PolicyValues, now: datetime, since: datetime, *, tagged: bool
) -> str:
    """Why a proposal no longer holds at approval."""
    if row is None:
        return "the entry is gone (purged)"
    if not row.is_latest:
        return "the content changed since: a newer version exists"
    if row.hold_active(now=now, hold_days=policy.operator_hold_days):
        return f"held by {row.held_by} since {row.held_at:%Y-%m-%d %H:%M} ({row.hold_reason})"
    if row.pinned and key != "expired":
        return "pinned since it was proposed"
    if row.source not in MANAGED_SOURCES or row.tier == Tier.CONSTITUTIONAL:
        return f"protected now ({row.source} source, {row.tier} tier)"
    if tagged:
        return "carries an excluded tag now"
    if row.last_accessed_at is not None and row.last_accessed_at > since:
        return "accessed since it was proposed"
    if row.status in (Status.TOMBSTONED, Status.ARCHIVED) and (
        ACTIONS[key] == ProposalAction.ARCHIVE or row.status == Status.TOMBSTONED
    ):
        return f"already {row.status}"
    return (
        f"no longer meets the rule of the pass (status {row.status}, importance {row.importance:.2f}, "
        f"retention {row.retention:.2f})"
    )


def _apply(ctx: RunContext, key: str, ids: list[int]) -> PassResult:
    if key == "low_quality_archived":
        return hygiene_actions.archive_low_quality(ctx, only=ids)
    if key == "consolidated":
        return compaction.compact(ctx, only=ids)
    return passes.apply_change(ctx, key, ids)


def _run_policy(workspace: Workspace, run: MaintenanceRun, current: PolicyValues) -> PolicyValues:
    """The rule a proposal is re-checked with: today's policy, except that a prune run's own
    parameters (the caller's thresholds and excluded tags) still decide its
    proposals — excluded tags only ever add."""
    if run.kind != RunKind.PRUNE:
        return current
    return effective_policy(workspace, {k: run.params.get(k) for k in PRUNE_PARAMS})


def approve(
    workspace: Workspace,
    *,
    ids: Iterable[Any] | None = None,
    all: bool = False,
    reason: str | None = None,
    actor: str,
    force: bool = False,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Apply the named open proposals that still hold; returns {applied, skipped: [{id, why}],
    backup_file}. Refused (409) while a run holds the lease, and when the tombstones it would
    apply trip the circuit breaker without ``force``; the pre-prune backup is written before
    anything changes. Should a group fail midway (the lease lost, the database gone), what was
    applied is closed ``approved`` and the rest stays open."""
    now = now or timezone.now()
    holder = lease.new_holder()
    if not lease.acquire(workspace, holder=holder, now=timezone.now()):
        raise Conflict("a maintenance run is working on this workspace; approve again when it has ended")
    # Open pages hear once, at the end, of the entries changed and the proposals closed.
    with lifecycle.coalesced():
        return _approve(
            workspace, ids=ids, all=all, reason=reason, actor=actor, force=force, now=now, holder=holder
        )


def _approve(
    workspace: Workspace,
    *,
    ids: Iterable[Any] | None,
    all: bool,
    reason: str | None,
    actor: str,
    force: bool,
    now: datetime,
    holder: str,
) -> dict[str, Any]:
    try:
        # Read after taking the lease: a run that just ended may have superseded some.
        chosen, skipped = _selected(workspace, ids=ids, all=all, reason=reason)
        current = effective_policy(workspace, None)
        ctx = RunContext(
            workspace=workspace,
            now=now,
            policy=current,
            run=None,
            actor=actor,
            renew=lambda: lease.renew(workspace, holder=holder, now=timezone.now()),
        )
        groups: dict[tuple[str, int], list[Proposal]] = defaultdict(list)
        for proposal in chosen:
            groups[(proposal.reason, proposal.run_id)].append(proposal)
        ordered = [
            (key, replace(ctx, run=group[0].run, policy=_run_policy(workspace, group[0].run, current)), group)
            for (key, _), group in sorted(
                groups.items(), key=lambda i: (list(ACTIONS).index(i[0][0]), i[0][1])
            )
        ]
        tombstones = sum(
            passes.CHANGES[key].candidates(group_ctx).filter(pk__in=chunk).count()
            for key, group_ctx, group in ordered
            if ACTIONS[key] == ProposalAction.TOMBSTONE
            for chunk in _chunks([p.entry_ref for p in group])
        )
        live_entries = live_count(workspace)
        fraction = tombstones / live_entries if live_entries else 0.0
        if tombstones_trip(tombstones, live_entries, current) and not force:
            raise Conflict(
                f"circuit breaker: approving would tombstone {tombstones} of {live_entries} live entries "
                f"({fraction:.0%} > {current.max_tombstone_fraction:.0%}); approve with force to apply"
            )
        # Before anything changes: a failed backup leaves the whole approval undone.
        backup_file = (
            backups.write_backup(workspace, reason="pre-prune", now=now, run=None).file_name
            if tombstones
            else None
        )
        applied: list[int] = []
        last_event = LifecycleEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        for key, group_ctx, group in ordered:
            # A tombstone the re-check found only now (it was not counted above) gets the
            # backup first all the same.
            if backup_file is None:
                group_ctx.before_destructive = _late_backup
            try:
                done = {
                    i
                    for chunk in _chunks([p.entry_ref for p in group])
                    for i in _apply(group_ctx, key, list(chunk)).ids
                }
            except Exception:
                done = _applied_since(workspace, last_event, [p.entry_ref for p in group])
                _close(
                    group,
                    done,
                    key=key,
                    actor=actor,
                    now=now,
                    policy=group_ctx.policy,
                    skipped=skipped,
                    keep_open=True,
                )
                raise
            applied += sorted(done)
            _close(group, done, key=key, actor=actor, now=now, policy=group_ctx.policy, skipped=skipped)
        if applied:
            refresh_scores(
                workspace, now=now, params=current.decay_params, ids=[*applied, *neighbour_ids(applied)]
            )
    finally:
        lease.release(workspace, holder=holder)
        lifecycle.announce(workspace.pk)
    return {"applied": sorted(set(applied)), "skipped": skipped, "backup_file": backup_file}


def _late_backup() -> None:
    raise Conflict("the data changed during the approval (a tombstone nobody counted); approve again")


def _applied_since(workspace: Workspace, last_event: int, entry_ids: list[int]) -> set[int]:
    """The entries among ``entry_ids`` that an interrupted approval had already changed."""
    return {
        i
        for chunk in _chunks(entry_ids)
        for i in LifecycleEvent.objects.filter(
            workspace=workspace, pk__gt=last_event, automatic=True, entry_ref__in=list(chunk)
        ).values_list("entry_ref", flat=True)
    }


def _close(
    group: list[Proposal],
    done: set[int],
    *,
    key: str,
    actor: str,
    now: datetime,
    policy: PolicyValues,
    skipped: list[dict[str, Any]],
    keep_open: bool = False,
) -> None:
    """Close a group's proposals: approved (applied), or skipped with why — or, after a failure
    (``keep_open``), only the applied ones."""
    rest = [p.entry_ref for p in group if p.entry_ref not in done]
    rows: dict[int, Entry] = {}
    tagged: set[int] = set()
    if not keep_open:
        for chunk in _chunks(rest):
            rows.update((e.pk, e) for e in Entry.objects.filter(pk__in=list(chunk)).select_related("score"))
            if policy.exclude_tags:
                tagged.update(
                    Entry.tags.through.objects.filter(
                        entry_id__in=list(chunk), tag__name__in=list(policy.exclude_tags)
                    ).values_list("entry_id", flat=True)
                )
    closed = []
    for proposal in group:
        if proposal.entry_ref in done:
            proposal.status, proposal.note = ProposalStatus.APPROVED, ""
        elif keep_open:
            continue
        else:
            proposal.status = ProposalStatus.SKIPPED
            row = rows.get(proposal.entry_ref)
            why = _why_not(row, key, policy, now, proposal.created_at, tagged=proposal.entry_ref in tagged)
            proposal.note = why[:300]
            skipped.append({"id": proposal.entry_ref, "why": proposal.note})
        proposal.decided_at, proposal.decided_by = now, actor
        closed.append(proposal)
    Proposal.objects.bulk_update(closed, ["status", "note", "decided_at", "decided_by"], batch_size=CHUNK)


def reject(
    workspace: Workspace,
    *,
    ids: Iterable[Any] | None = None,
    all: bool = False,
    reason: str | None = None,
    actor: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Close the named open proposals and hold their entries: returns {rejected,
    skipped: [{id, why}]}."""
    now = now or timezone.now()
    chosen, skipped = _selected(workspace, ids=ids, all=all, reason=reason)
    with transaction.atomic():
        pks = list(
            Proposal.objects.select_for_update()
            .filter(pk__in=[p.pk for p in chosen], status=ProposalStatus.OPEN)
            .values_list("pk", flat=True)
        )
        Proposal.objects.filter(pk__in=pks).update(
            status=ProposalStatus.REJECTED, decided_at=now, decided_by=actor
        )
        kept = set(pks)
        entries = sorted({p.entry_ref for p in chosen if p.pk in kept})
        holds.hold(workspace, entries, reason=HoldReason.REJECT, actor=actor, now=now)
    lifecycle.announce(workspace.pk)
    return {"rejected": entries, "skipped": skipped}
