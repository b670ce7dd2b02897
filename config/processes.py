"""Process trees, for the commands that must stop with nothing left behind (``serve``,
``qcluster``): which processes descend from one, and signalling them all.

Linux: read from /proc. Elsewhere no descendant is found, and only the direct children the
commands started themselves are signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def _parents() -> dict[int, int]:
    """pid → parent pid of every living process (zombies have exited: left out)."""
    found: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; split after it.
        state, ppid = text[text.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            found[int(text.split(" ", 1)[0])] = int(ppid)
    return found


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid``: children, their children, and so on."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def kill_descendants(pid: int) -> list[int]:
    """SIGKILL every descendant of ``pid``; the pids killed."""
    left = descendants(pid)
    signal_all(left, signal.SIGKILL)
    return left


def become_subreaper() -> None:
    """Linux: processes orphaned below this one (a child that died before its children) become
    this process's children instead of init's, so ``descendants`` still finds them."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
