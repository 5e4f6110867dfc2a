"""`python -m fencepost.cli` runs the CLI (tests and benchmarks spawn processes this way)."""

from fencepost.cli.main import main

main()
