"""The `pgdrain` command: its subcommands, their output, the demo and the embedded server."""

from pgdrain.cli.commands import main

__all__ = ["main"]
