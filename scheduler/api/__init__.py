"""The HTTP API and operator dashboard (`fencepost api`)."""

from fencepost.api.app import Api, ApiConfig, create_app

__all__ = ["Api", "ApiConfig", "create_app"]
