"""The `fencepost` command line: one module per command group, all added to `main.cli`."""

from fencepost.cli.main import cli, main

__all__ = ["cli", "main"]
