"""The worker runtime: claim, execute (async / thread / process), keep leases, acknowledge."""

from .context import Context
from .runtime import Worker

__all__ = ["Context", "Worker"]
