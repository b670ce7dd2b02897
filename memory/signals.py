"""The domain's signals: what changed, told after it committed, to whoever listens.

``entries_changed`` — entries of one workspace changed status (or were purged, or rows were
restored from a backup). Sent by ``memory.lifecycle`` once the transaction that made the change
has committed, once per transaction and workspace (or once per ``lifecycle.coalesced()``
block), never for a change that was rolled back. Keyword arguments:

- ``workspace_id`` (int);
- ``statuses`` (frozenset of str): the statuses entries moved into (``"purged"`` for a purge);
  empty when unknown (a restore from a backup may have changed any);
- ``count`` (int): how many entries changed (0 when unknown).

The console's live layer (``console.live``) receives it and pushes the new review counts to
every open page of the workspace, whichever door the change came through.
"""

from __future__ import annotations

from django.dispatch import Signal

entries_changed = Signal()
