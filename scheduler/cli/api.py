"""`fencepost api`: serve the HTTP API and the operator dashboard (uvicorn)."""

from __future__ import annotations

from typing import Any

import click

from fencepost.api import ApiConfig, create_app
from fencepost.api.stream import close_streams
from fencepost.cli.common import async_command, require_store
from fencepost.core.config import Settings

__all__ = ["GRACE_S", "api"]

GRACE_S = 10
"""On SIGTERM, requests in flight get this long to finish; then they are cancelled (open event
streams are ended at once, with `event: end`: one lasts up to an hour and would hold the process)."""


@click.command("api")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="FENCEPOST_API_HOST")
@click.option("--port", type=int, default=8080, show_default=True, envvar="FENCEPOST_API_PORT")
@click.option("--forwarded-allow-ips", default=None, envvar="FENCEPOST_API_FORWARDED_ALLOW_IPS",
              help="Trust X-Forwarded-For from these proxies (the source address recorded in history).")
@async_command
async def api(settings: Settings, host: str, port: int, forwarded_allow_ips: str | None) -> None:
    """Serve the HTTP API (/v1, /openapi.json, /metrics) and the dashboard (/ui/). Stateless:
    run as many replicas as you like behind a load balancer."""
    import uvicorn  # only this command serves HTTP: the rest of the CLI does not load the server

    require_store("api")
    app = create_app(settings, ApiConfig.from_env())
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            proxy_headers=forwarded_allow_ips is not None,
                            forwarded_allow_ips=forwarded_allow_ips, server_header=False,
                            timeout_graceful_shutdown=GRACE_S)
    click.echo(f"fencepost api listening on http://{host}:{port} (dashboard: /ui/)", err=True)
    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            close_streams(app.state)  # open event streams end now, not after their duration
            await super().shutdown(sockets)

    await Server(config).serve()
