"""No-op handlers for the throughput benchmark."""

from fencepost.core.registry import Registry

registry = Registry()


@registry.job("bench.noop", queue="bench", max_retries=0)
async def noop(ctx) -> None:
    return None
