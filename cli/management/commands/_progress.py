"""A row counter on a terminal (never with --json, never when stderr is not a TTY)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm


@contextmanager
def row_progress(desc: str, *, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    bar = tqdm(desc=desc, unit="rows", file=sys.stderr, leave=False)
    try:
        yield bar.update
    finally:
        bar.close()
