"""`python -m fencepost` runs the CLI."""

from fencepost.cli.main import main

main()
