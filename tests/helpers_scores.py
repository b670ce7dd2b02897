"""Setting stored scores by hand: importance on the entry row, retention and ``scored_at`` on
its narrow ``EntryScore`` row (made where missing)."""

from collections.abc import Iterable
from typing import Any

from memory.models import Entry, EntryScore


def set_scores(pks: Iterable[int], *, importance: float | None = None, **score: Any) -> None:
    pks = list(pks)
    if importance is not None:
        Entry.objects.filter(pk__in=pks).update(importance=importance)
    for pk in pks if score else ():
        EntryScore.objects.update_or_create(entry_id=pk, defaults=score)
