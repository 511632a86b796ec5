"""Every `--help` shows each option's default: the parser of every command and subcommand is
walked, so a new option without its default in the help text fails here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from pgdrain.cli import build_parser


def _parsers(
    parser: argparse.ArgumentParser, path: str = "pgdrain"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_with_a_default_shows_it_in_help() -> None:
    missing = []
    seen = 0
    for path, parser in _parsers(build_parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            default = action.default
            if not action.option_strings or default is None or default is False:
                continue
            if default == argparse.SUPPRESS:
                continue
            seen += 1
            if f"default: {action.default}" not in text and "default" not in (action.help or ""):
                missing.append(f"{path} {action.option_strings[-1]}")
    assert seen > 10
    assert missing == []


def test_control_a_plain_formatter_would_not_show_them() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--limit", type=int, default=20)
    assert "20" not in parser.format_help()
