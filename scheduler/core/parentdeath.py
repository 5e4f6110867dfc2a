"""Spawned children that die with their parent from their first line on, not after their imports.

multiprocessing's spawn start runs a fresh interpreter that unpickles the Process object, which
imports its target's module before the target's first line runs: for the worker's process-model
children and its pulser, fencepost.worker and all it imports (1-2 s on a loaded two-core machine).
A worker SIGKILLed in that window (a child being replaced after a timeout or a fence) left children
alive for as long as their imports took: the chaos soak's `children_outlived_worker`. `guarded` is
the Process target instead: its module imports the standard library only, asks Linux for SIGKILL at
the parent's death first, and only then imports and calls the real target.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import signal
from typing import Any

__all__ = ["die_with_parent", "guarded"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """In a child: ask Linux to send `sig` when the parent dies (PR_SET_PDEATHSIG), then exit at
    once if the parent died before that took effect (the child was already re-parented)."""
    with contextlib.suppress(Exception):  # not Linux: the caller's other fallbacks still apply
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def guarded(parent_pid: int, target: str, *args: Any) -> None:
    """A spawn Process target: die with `parent_pid`, then run `target` ("module:function") with `args`.
    Pass it only arguments whose classes import cheaply (multiprocessing's, builtins): they are
    unpickled before this runs."""
    die_with_parent(parent_pid)
    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)(*args)
