"""docs/cli.md is the `pgdrain` command's parser written out: every command, subcommand and
option with its help and default. An option added, renamed or removed without the page fails
here (PGDRAIN_WRITE_DOCS=1 rewrites the page from the parser)."""

from __future__ import annotations

from helpers.cli_reference import render, subcommands
from helpers.docs import DOCS, rewrite_hint, writing
from pgdrain.cli.commands import build_parser

PAGE = DOCS / "cli.md"


def test_the_cli_page_is_the_parser_written_out() -> None:
    written = render(build_parser())
    if writing():
        PAGE.write_text(written)
    assert PAGE.read_text() == written, rewrite_hint("tests/unit/test_cli_reference.py")


def test_control_an_option_the_page_lacks_fails() -> None:
    parser = build_parser()
    subcommands(parser)["drain"].add_argument("--frobnicate", action="store_true", help="new")
    written = render(parser)
    assert "| `--frobnicate` | new |" in written
    assert PAGE.read_text() != written


def test_control_an_option_removed_from_the_parser_fails() -> None:
    parser = build_parser()
    worker = subcommands(parser)["worker"]
    [grace] = [a for a in worker._actions if "--grace" in a.option_strings]
    worker._remove_action(grace)
    written = render(parser)
    assert "`--grace GRACE`" in PAGE.read_text()
    assert "`--grace GRACE`" not in written
