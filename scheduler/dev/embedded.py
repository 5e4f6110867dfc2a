"""The embedded Redis + PostgreSQL pair moved to fencepost.core.embedded (the store resolution rule in
fencepost.core.stores starts it); this name stays for existing imports and is the same module object,
so a test that patches `fencepost.dev.embedded.RUNTIME_ROOT` patches the one the core uses."""

from __future__ import annotations

import sys

from fencepost.core import embedded as _embedded
from fencepost.core.embedded import *  # noqa: F403
from fencepost.core.embedded import __all__ as __all__

sys.modules[__name__] = _embedded
