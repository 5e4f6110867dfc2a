"""What a handler receives as its first argument."""

from __future__ import annotations

import logging
from typing import Any


class Context:
    """Run identity for the handler: pass `token` and `op_key()` to downstream side effects
    so a zombie attempt cannot overwrite a newer attempt's effects."""

    __slots__ = ("run_id", "attempt", "token", "queue", "handler", "fire_time", "trace", "worker_id",
                 "_log", "_stop")

    def __init__(self, run_id: int, attempt: int, token: int, queue: str, handler: str,
                 fire_time: int | None = None, trace: str | None = None, worker_id: str = "") -> None:
        self.run_id, self.attempt, self.token = run_id, attempt, token
        self.queue, self.handler, self.fire_time, self.trace = queue, handler, fire_time, trace
        self.worker_id = worker_id
        self._log: logging.LoggerAdapter[logging.Logger] | None = None
        self._stop = False

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose lines carry run_id, attempt and worker_id (made on first use: most jobs never log)."""
        if self._log is None:
            self._log = logging.LoggerAdapter(logging.getLogger(f"fencepost.job.{self.handler}"),
                                              {"run_id": self.run_id, "attempt": self.attempt,
                                               "worker_id": self.worker_id, "event": "job_log"})
        return self._log

    def op_key(self, item: Any) -> str:
        """A stable idempotency key for one unit of work: the same across attempts of this run."""
        return f"{self.run_id}:{item}"

    def should_stop(self) -> bool:
        """True once the worker is shutting down or the lease was lost: return at a safe boundary."""
        return self._stop

    def __repr__(self) -> str:
        return f"Context(run_id={self.run_id}, attempt={self.attempt}, token={self.token})"
