"""Journal export: a workspace's latest entries in the format ``memory.journal_parse`` reads,
so export → import → export is byte-identical. Nothing here prints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from memory.models import CodeAnchor, Entry, Relationship, Workspace
from memory.models.choices import RelationshipType, Status

# Link type → commit reference relation, for export (the reverse of RELATION_TO_LINK).
LINK_TO_RELATION: dict[str, str] = {
    RelationshipType.CAUSED: "reverts",
    RelationshipType.RESOLVED: "fixes",
    RelationshipType.REFERENCES: "mentions",
}


@dataclass
class ExportCounts:
    workspace: str
    entries: int = 0
    anchors: int = 0
    links: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _sorted_json(value: Any) -> Any:
    """Dicts with sorted keys all the way down, so output does not depend on the database."""
    if isinstance(value, dict):
        return {k: _sorted_json(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_json(v) for v in value]
    return value


def export_id(entry_pk: int, external_id: str | None) -> str:
    return external_id or f"entry-{entry_pk}"


def export_records(workspace: Workspace, counts: ExportCounts | None = None) -> Iterator[dict[str, Any]]:
    """Every latest, not tombstoned entry of the workspace as a journal record, oldest first."""
    entries = list(
        Entry.objects.filter(workspace=workspace, is_latest=True)
        .exclude(status=Status.TOMBSTONED)
        .order_by("created_at", "id")
    )
    ids = {e.pk: export_id(e.pk, e.external_id) for e in entries}

    tags: dict[int, list[str]] = {}
    for entry_id, name in Entry.tags.through.objects.filter(
        entry__workspace=workspace, entry__is_latest=True, tag__workspace=workspace
    ).values_list("entry_id", "tag__name"):
        tags.setdefault(entry_id, []).append(name)

    anchors: dict[int, list[dict[str, Any]]] = {}
    for a in (
        CodeAnchor.objects.filter(workspace=workspace, entry__is_latest=True)
        .order_by("entry_id", "id")
        .values("entry_id", "path", "commit", "repo", "status", "line_start", "line_end", "content_hash")
    ):
        row: dict[str, Any] = dict(a)
        anchors.setdefault(row.pop("entry_id"), []).append(row)

    refs: dict[int, list[dict[str, str]]] = {}
    links: dict[int, list[dict[str, str]]] = {}
    for from_id, to_id, type_ in Relationship.objects.filter(
        workspace=workspace, pruned_at__isnull=True
    ).values_list("from_entry_id", "to_entry_id", "type"):
        if from_id not in ids or to_id not in ids:
            continue
        relation = LINK_TO_RELATION.get(type_)
        if relation is None:
            links.setdefault(from_id, []).append({"to": ids[to_id], "type": type_})
        else:
            refs.setdefault(from_id, []).append({"kind": "commit", "ref": ids[to_id], "relation": relation})

    for e in entries:
        details = sorted(refs.get(e.pk, []), key=lambda d: (d["ref"], d["relation"]))
        entry_links = sorted(links.get(e.pk, []), key=lambda d: (d["to"], d["type"]))
        entry_anchors = anchors.get(e.pk, [])
        if counts is not None:
            counts.entries += 1
            counts.anchors += len(entry_anchors)
            counts.links += len(details) + len(entry_links)
        yield {
            "id": ids[e.pk],
            "created_at": _iso(e.created_at),
            "entry_type": e.entry_type,
            "content": e.content,
            "tags": sorted(tags.get(e.pk, [])),
            "anchors": entry_anchors,
            "references": list(dict.fromkeys(d["ref"] for d in details)),
            "reference_details": details,
            "links": entry_links,
            "title": e.title,
            "tier": e.tier,
            "source": e.source,
            "pinned": e.pinned,
            "impact_score": e.impact_score,
            "trust_score": e.trust_score,
            "validation_status": e.validation_status,
            "significance_type": e.significance_type,
            "salience": e.salience,
            "expires_at": _iso(e.expires_at),
            "project": e.project,
            "session_key": e.session_key,
            "status": e.status,
            "staged_class": e.staged_class,
            "metadata": _sorted_json(e.metadata or {}),
        }


class Writer(Protocol):
    def write(self, text: str, /) -> object: ...


def export_journal(*, workspace: Workspace, out: Writer) -> ExportCounts:
    """Write the workspace as journal JSONL to ``out``; returns what was written."""
    counts = ExportCounts(workspace=workspace.slug)
    for record in export_records(workspace, counts):
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return counts
