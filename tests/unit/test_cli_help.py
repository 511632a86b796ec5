"""Every `--help` shows each option's default: the parser of every command and subcommand is
walked, so a new option without its default in the help text fails here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from pgdrain.cli.commands import build_parser
from pgdrain.settings import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY

# Options whose default is None and that have no default to show: filters, an optional name.
# Any other None-default option (one that falls back to a setting or the kind's decorator
# options) must say its default in the help text.
NO_DEFAULT = {
    "pgdrain enqueue --key",
    "pgdrain stats --watch",
    "pgdrain jobs --queue",
    "pgdrain jobs --kind",
    "pgdrain jobs --since",
    "pgdrain jobs --status",
    "pgdrain retry --queue",
    "pgdrain retry --kind",
    "pgdrain retry --since",
    "pgdrain cancel --queue",
    "pgdrain cancel --kind",
    "pgdrain cancel --since",
    "pgdrain invoke --env-vars",
}


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
    assert seen > 5  # the walk reaches the subcommands
    assert missing == []


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    [action] = [a for a in parser._actions if flag in a.option_strings]
    return action


def test_every_option_without_a_value_default_says_where_its_default_comes_from() -> None:
    """An option whose argparse default is None (so the check above skips it) either has no
    default at all (NO_DEFAULT) or says in its help where its value comes from."""
    silent = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.default is not None:
                continue
            name = f"{path} {action.option_strings[-1]}"
            if name not in NO_DEFAULT and "default" not in (action.help or ""):
                silent.append(name)
    assert silent == []


def test_drain_help_names_the_setting_and_its_default_for_concurrency_and_batch_size() -> None:
    parsers = dict(_parsers(build_parser()))
    text = " ".join(parsers["pgdrain drain"].format_help().split())
    assert f"1 to 256 (default: PGDRAIN_CONCURRENCY, else {DEFAULT_CONCURRENCY})" in text
    assert f"1 to 1000 (default: PGDRAIN_BATCH_SIZE, else {DEFAULT_BATCH_SIZE})" in text
    assert "(default: PGDRAIN_QUEUES, else every queue)" in text


def test_enqueue_help_says_the_kinds_options_come_first() -> None:
    enqueue = dict(_parsers(build_parser()))["pgdrain enqueue"]
    for flag, fallback in [
        ("--queue", "default"),
        ("--priority", "0"),
        ("--max-attempts", "5"),
        ("--recovery-policy", "auto"),
    ]:
        assert _option(enqueue, flag).default is None  # so the kind's option can apply
        assert f"PGDRAIN_JOBS, else {fallback})" in (_option(enqueue, flag).help or "")


def test_control_a_plain_formatter_would_not_show_them() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--limit", type=int, default=20)
    assert "20" not in parser.format_help()


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [
        (["worker"], False),
        (["-v", "worker"], True),
        (["worker", "-v"], True),  # as docs/worker.md writes it (a red team's report: exit 2)
        (["jobs", "show", "1", "-v"], True),
        (["-v", "drain", "--budget", "30"], True),
    ],
)
def test_verbose_is_taken_before_or_after_the_command(argv: list[str], verbose: bool) -> None:
    assert build_parser().parse_args(argv).verbose is verbose
