"""Fencepost: the shared core and the public client."""

from fencepost.client import Client, SyncClient
from fencepost.core.errors import FencepostError
from fencepost.core.models import JobSpec, Outcome, Submit
from fencepost.core.registry import Registry
from fencepost.core.states import Status

__all__ = ["Client", "SyncClient", "Registry", "Submit", "JobSpec", "Outcome", "Status", "FencepostError"]
__version__ = "0.1.0"
