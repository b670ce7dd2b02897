"""Code anchor checks: the CodeAnchor statuses, POST /anchors/check and ``manage.py check_anchors``.

An anchor is **invalidated** when its file is gone, **stale** when the file changed since the
anchored commit (or its content hash no longer matches), **valid** otherwise. Both checks end
the same way: statuses and ``checked_at`` written set-based (one UPDATE per status per batch)
and, in the same transaction, the stored scores of the entries whose anchor status changed are
refreshed (an anchor multiplies importance by 0.8 when stale and 0.1 when invalidated).

``check_anchors`` reads a local git checkout with the ``git`` CLI (no new dependency) and never
its working tree: only ``HEAD`` and the anchored commits, so uncommitted edits do not count.
The git work is constant per check plus one ``git diff`` per distinct anchored commit.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory.errors import InvalidInput
from memory.models import CodeAnchor, Workspace
from memory.models.choices import AnchorStatus
from memory.policy_model import MaintenancePolicy
from memory.scoring_db import refresh_scores

BATCH_SIZE = 1000  # anchors per UPDATE batch (and per transaction)
PATH_CHUNK = 300  # paths per ``path IN (...)`` lookup
GIT_TIMEOUT = 120  # seconds one git command may take
# Anchored commits come from writers: only a hex object name is ever passed to git, so a value
# like "--output=/tmp/x" can never become an option.
_COMMIT_RE = re.compile(r"^[0-9a-fA-F]{4,64}$")

# (anchor id, entry id, path, commit, content hash, current status)
AnchorRow = tuple[int, int, str, str, str, str]


def normalise_path(path: str) -> str:
    """The repository-relative form a path is compared in: forward slashes, no leading "./"
    or "/"."""
    path = path.strip().replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


def _counts() -> dict[str, int]:
    return {"checked": 0, "valid": 0, "stale": 0, "invalidated": 0, "changed": 0}


def _apply(
    workspace: Workspace, rows: Sequence[AnchorRow], verdicts: Mapping[int, str], now: datetime
) -> dict[str, int]:
    """Write ``verdicts`` (anchor id → status) and rescore the entries whose anchors changed."""
    counts = _counts()
    params = MaintenancePolicy.for_workspace(workspace).decay_params
    for start in range(0, len(rows), BATCH_SIZE):
        batch = rows[start : start + BATCH_SIZE]
        by_status: dict[str, list[int]] = defaultdict(list)
        changed_entries: set[int] = set()
        for anchor_id, entry_id, _path, _commit, _hash, old_status in batch:
            status = verdicts[anchor_id]
            by_status[status].append(anchor_id)
            counts[status] += 1
            if status != old_status:
                counts["changed"] += 1
                changed_entries.add(entry_id)
        with transaction.atomic():
            for status, ids in by_status.items():
                CodeAnchor.objects.filter(workspace=workspace, pk__in=ids).update(
                    status=status, checked_at=now
                )
            if changed_entries:
                refresh_scores(workspace, now=now, params=params, ids=changed_entries)
    counts["checked"] = len(rows)
    return counts


def _anchor_rows(
    workspace: Workspace, *, repo: str | None, paths: Iterable[str] | None = None
) -> list[AnchorRow]:
    """The workspace's anchors (optionally only those of ``repo`` or with no repo, and only
    those whose path is among ``paths``), ordered so that an entry's anchors share a batch."""
    qs = CodeAnchor.objects.filter(workspace=workspace)
    if repo:
        qs = qs.filter(repo__in=["", repo])
    qs = qs.order_by("entry_id", "pk")
    fields = ("pk", "entry_id", "path", "commit", "content_hash", "status")
    if paths is None:
        return list(qs.values_list(*fields))
    # Stored paths are kept as written; match the usual spellings of each normalised path.
    wanted = sorted({form for p in paths for form in (p, f"./{p}", f"/{p}")})
    rows: dict[int, AnchorRow] = {}
    for start in range(0, len(wanted), PATH_CHUNK):
        for row in qs.filter(path__in=wanted[start : start + PATH_CHUNK]).values_list(*fields):
            rows[row[0]] = row
    return sorted(rows.values(), key=lambda r: (r[1], r[0]))


# --- a git checkout --------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            env=env,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise InvalidInput("the git command is not installed") from None
    except subprocess.TimeoutExpired:
        raise InvalidInput(f"git {args[0]} took longer than {GIT_TIMEOUT} s in {repo}") from None


def _z_list(output: bytes) -> set[str]:
    return {name.decode("utf-8", "surrogateescape") for name in output.split(b"\0") if name}


class GitCheckout:
    """Read-only questions about the committed state of a local git repository."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.is_dir():
            raise InvalidInput(f"{self.path} is not a directory")
        head = _git(self.path, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        if head.returncode != 0:
            why = head.stderr.decode(errors="replace").strip().splitlines()
            raise InvalidInput(
                f"{self.path} is not a git checkout with at least one commit"
                + (f" ({why[0]})" if why else "")
            )
        self.head = head.stdout.decode().strip()
        self._changed: dict[str, set[str] | None] = {}

    def files_at_head(self) -> set[str]:
        listing = _git(self.path, "ls-tree", "-r", "-z", "--name-only", "--full-tree", "HEAD")
        if listing.returncode != 0:
            raise InvalidInput(f"git ls-tree failed: {listing.stderr.decode(errors='replace').strip()}")
        return _z_list(listing.stdout)

    def changed_since(self, commit: str) -> set[str] | None:
        """Paths that differ between ``commit`` and HEAD; None when the commit is unknown here
        (or not a commit name at all). Cached per commit."""
        if commit not in self._changed:
            result: set[str] | None = None
            if _COMMIT_RE.match(commit):
                diff = _git(self.path, "diff", "--name-only", "-z", "--no-renames", commit, self.head, "--")
                if diff.returncode == 0:
                    result = _z_list(diff.stdout)
            self._changed[commit] = result
        return self._changed[commit]


def git_verdict(path: str, commit: str, *, present: set[str], checkout: GitCheckout) -> str:
    """The status of one anchor against HEAD (the rules of the module docstring). An anchor
    without a commit has no baseline: its file existing is all we can vouch for. A commit
    this repository does not know cannot be compared, so an existing file counts as stale."""
    if normalise_path(path) not in present:
        return AnchorStatus.INVALIDATED
    if not commit:
        return AnchorStatus.VALID
    changed = checkout.changed_since(commit)
    if changed is None or normalise_path(path) in changed:
        return AnchorStatus.STALE
    return AnchorStatus.VALID


def check_anchors(
    workspace: Workspace,
    repo_path: str | os.PathLike[str],
    *,
    repo_name: str | None = None,
    now: datetime | None = None,
) -> dict[str, int]:
    """Check every anchor of ``workspace`` (or only those whose repo is ``repo_name`` or
    blank) against the HEAD of the git checkout at ``repo_path``.

    Raises InvalidInput when ``repo_path`` is not a git checkout. Returns the counts
    ``{checked, valid, stale, invalidated, changed}`` (``changed``: anchors whose status moved).
    """
    now = now or timezone.now()
    checkout = GitCheckout(repo_path)
    rows = _anchor_rows(workspace, repo=repo_name)
    if not rows:
        return _counts()
    present = checkout.files_at_head()
    verdicts = {row[0]: git_verdict(row[2], row[3], present=present, checkout=checkout) for row in rows}
    return _apply(workspace, rows, verdicts, now)


# --- files reported by a client (POST /anchors/check) ------------------------------------------


def file_verdict(reported_hash: str | None, *, anchor_hash: str, current: str) -> str:
    """The status of one anchor whose file a client reported.

    None (the file was deleted) invalidates. Against a stored hash, a different one is stale
    and the same one valid. Without a stored hash there is no baseline, so the status stays,
    except that an invalidated anchor whose file exists again becomes stale: it is there, but
    nothing vouches for its content (and staying invalidated would cut its entry's importance
    to a tenth on no evidence).
    """
    if reported_hash is None:
        return AnchorStatus.INVALIDATED
    if anchor_hash:
        return AnchorStatus.VALID if reported_hash == anchor_hash else AnchorStatus.STALE
    return AnchorStatus.STALE if current == AnchorStatus.INVALIDATED else current


def check_anchor_files(
    workspace: Workspace,
    repo: str,
    files: Iterable[Mapping[str, Any]],
    now: datetime | None = None,
) -> dict[str, int]:
    """Mark the anchors of the reported files: ``files`` is ``[{"path", "content_hash"}]``
    with ``content_hash`` None for a deleted file. Only anchors whose repo is ``repo`` (or
    blank) are touched; with ``repo`` blank, every anchor of the workspace on those paths. If
    a path is reported twice, the last report wins. Returns the same counts as
    ``check_anchors``, over the anchors the report matched.
    """
    now = now or timezone.now()
    reported: dict[str, str | None] = {}
    for item in files:
        path = normalise_path(str(item.get("path") or ""))
        if not path:
            raise InvalidInput("files: every file needs a path")
        digest = item.get("content_hash")
        reported[path] = None if digest is None else str(digest)
    if not reported:
        return _counts()
    rows = _anchor_rows(workspace, repo=repo or None, paths=reported)
    verdicts = {
        anchor_id: file_verdict(reported[normalise_path(path)], anchor_hash=anchor_hash, current=status)
        for anchor_id, _entry, path, _commit, anchor_hash, status in rows
    }
    return _apply(workspace, rows, verdicts, now)
