"""The worker runtime: claim, execute (async / thread / process), keep leases, acknowledge."""

from fencepost.worker.context import Context
from fencepost.worker.runtime import Worker

__all__ = ["Context", "Worker"]
