"""Fencepost: the shared core and the public client."""

from .client import Client, SyncClient
from .errors import FencepostError
from .models import JobSpec, Outcome, Submit
from .registry import Registry
from .states import Status

__all__ = ["Client", "SyncClient", "Registry", "Submit", "JobSpec", "Outcome", "Status", "FencepostError"]
__version__ = "0.1.0"
