"""Seed the MCP tests' server database (run as a script, against ``DATABASE_URL``).

    python tests/mcp_seed.py SLUG [SLUG ...]

Migrates the database first. For each slug: a workspace (apply review mode) whose memories all
carry the slug as a word (so a search of another workspace's slug must find nothing), one
constitutional rule, a link, a code anchor, a tombstoned memory, and API keys of every role
plus spare agent keys (for tests that spend a rate limit) and a revoked one. Prints one JSON
object: per slug its ids and raw keys.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

KEY_ROLES = {
    "viewer": "viewer",
    "agent": "agent",
    "operator": "operator",
    "admin": "admin",
    "fuzz": "agent",
    "limit": "agent",
    "spare": "agent",
    "revoked": "agent",
}


def seed(slug: str) -> dict[str, object]:
    from memory import accounts, entry_changes, new_entries, relationships, writes
    from memory.models import CodeAnchor

    workspace = accounts.workspace_create(slug=slug, name=slug.title(), review_mode="apply")
    made = {}
    for name, text in [
        ("entry", f"{slug} caches are warmed before the deploy"),
        ("other_entry", f"{slug} retries use exponential backoff"),
        ("third", f"{slug} the index rebuild runs nightly"),
    ]:
        made[name] = new_entries.entry_create(
            workspace=workspace, title=f"{slug} {name}", content=text, tags=[slug, "seed"], project=slug
        ).pk
    made["rule"] = new_entries.entry_create(
        workspace=workspace,
        title=f"{slug} rule",
        content=f"{slug} never deploy on a Friday",
        tier="constitutional",
        entry_type="rule",
    ).pk
    gone = new_entries.entry_create(
        workspace=workspace, title=f"{slug} gone", content=f"{slug} forgotten words"
    )
    entry_changes.entry_tombstone(workspace=workspace, entry_id=gone.pk)
    made["tombstoned"] = gone.pk
    link, _ = relationships.relationship_create(
        workspace=workspace, from_id=made["entry"], to_id=made["other_entry"]
    )
    made["relationship"] = link.pk
    entry = writes.entry_get(workspace=workspace, entry_id=made["entry"])
    CodeAnchor.objects.create(workspace=workspace, entry=entry, repo=slug, path=f"{slug}.py")
    keys = {}
    for name, role in KEY_ROLES.items():
        key, raw = accounts.api_key_create(workspace=workspace, role=role, name=f"mcp tests {name}")
        keys[name] = raw
        if name == "revoked":
            accounts.api_key_revoke(workspace=workspace, key_id=key.pk)
    return {"ids": made, "keys": keys}


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)  # a copy of a migrated database: nothing left to apply
    print(json.dumps({slug: seed(slug) for slug in sys.argv[1:]}))


if __name__ == "__main__":
    main()
