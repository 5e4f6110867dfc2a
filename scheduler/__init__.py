"""Fencepost: a job scheduler that loses nothing. The public names, importable from `fencepost`:

    from fencepost import Client, Registry, Submit

Names are loaded on first use (PEP 562), so `import fencepost.core` (what the worker, the
reconciler and the trigger import) does not load the client and its dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
"""The one version source: the wheel's metadata (pyproject, setuptools dynamic) and `fencepost --version`."""

_EXPORTS = {
    "Client": "fencepost.client", "SyncClient": "fencepost.client",
    "Registry": "fencepost.core.registry",
    "Submit": "fencepost.core.models", "JobSpec": "fencepost.core.models", "Outcome": "fencepost.core.models",
    "Status": "fencepost.core.states",
    "Node": "fencepost.workflows", "ScheduleSpec": "fencepost.core.schedules",
    "Context": "fencepost.worker.context",
    "FencepostError": "fencepost.core.errors", "InvalidInput": "fencepost.core.errors",
    "UnknownHandler": "fencepost.core.errors", "UnknownRun": "fencepost.core.errors",
    "IllegalTransition": "fencepost.core.errors", "WaitTimeout": "fencepost.core.errors",
    "StoreUnavailable": "fencepost.core.errors",
    # what a handler raises to say how it failed (docs/observability.md)
    "JobError": "fencepost.core.errors", "Transient": "fencepost.core.errors", "RateLimited": "fencepost.core.errors",
    "InvalidJobInput": "fencepost.core.errors", "SideEffectFailed": "fencepost.core.errors",
    "PolicyViolation": "fencepost.core.errors",
}
__all__ = [
    "Client",
    "Context",
    "FencepostError",
    "IllegalTransition",
    "InvalidInput",
    "InvalidJobInput",
    "JobError",
    "JobSpec",
    "Node",
    "Outcome",
    "PolicyViolation",
    "RateLimited",
    "Registry",
    "ScheduleSpec",
    "SideEffectFailed",
    "Status",
    "StoreUnavailable",
    "Submit",
    "SyncClient",
    "Transient",
    "UnknownHandler",
    "UnknownRun",
    "WaitTimeout",
    "__version__",
]

if TYPE_CHECKING:
    from fencepost.client import Client, SyncClient
    from fencepost.core.errors import (
        FencepostError,
        IllegalTransition,
        InvalidInput,
        InvalidJobInput,
        JobError,
        PolicyViolation,
        RateLimited,
        SideEffectFailed,
        StoreUnavailable,
        Transient,
        UnknownHandler,
        UnknownRun,
        WaitTimeout,
    )
    from fencepost.core.models import JobSpec, Outcome, Submit
    from fencepost.core.registry import Registry
    from fencepost.core.schedules import ScheduleSpec
    from fencepost.core.states import Status
    from fencepost.worker.context import Context
    from fencepost.workflows import Node


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fencepost' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
