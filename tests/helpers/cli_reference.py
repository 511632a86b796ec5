"""The `pgdrain` command's parser as docs/cli.md shows it: every command and subcommand, each
argument with its help text as `--help` expands it (defaults included). Written from argparse's
actions, not from its help layout, so the page is the same on every Python version."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

HEADER = """# The `pgdrain` command

Every command and option, written from the command's own parser by
`tests/unit/test_cli_reference.py`: do not edit this page by hand (after a change to the
commands, `PGDRAIN_WRITE_DOCS=1` with that test rewrites it). Every command also takes `-h`,
`--help`. What the commands are for, with examples: [operations.md](operations.md) and
[worker.md](worker.md); `pgdrain invoke`: [lambda.md](lambda.md#trying-it); `pgdrain ui`:
[ui.md](ui.md).
"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help, as the parent's --help lists it."""
    found: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found[choice.dest] = choice.help or ""
    return found


def walk(
    parser: argparse.ArgumentParser, path: str = "pgdrain", summary: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(command path, its parser, its one-line help), parents first, in definition order."""
    yield path, parser, summary
    helps = summaries(parser)
    for name, sub in subcommands(parser).items():
        yield from walk(sub, f"{path} {name}", helps.get(name, ""))


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a reader passes: not -h, not the subcommand's slot."""
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def invocation(action: argparse.Action) -> str:
    value = _metavar(action)
    if not action.option_strings:
        shown = {"?": f"[{value}]", "*": f"[{value} ...]", "+": f"{value} [{value} ...]"}
        return f"`{shown.get(str(action.nargs), value)}`"
    flags = [f"`{flag}`" for flag in action.option_strings]
    if action.nargs != 0:
        flags[-1] = f"`{action.option_strings[-1]} {value}`"
    return ", ".join(flags)


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as `--help` prints it (with its default), on one line, safe in a table."""
    if action.help is None:
        return ""
    formatter = parser._get_formatter()
    text: str = formatter._expand_help(action)
    return " ".join(text.split()).replace("|", "\\|")


def render(root: argparse.ArgumentParser) -> str:
    parts = [HEADER]
    for path, parser, summary in walk(root):
        lines = [f"## `{path}`", ""]
        for text in (summary, parser.description):
            if text:
                lines += [" ".join(text.split()), ""]
        rows = arguments(parser)
        if rows:
            lines += ["| argument | meaning |", "|---|---|"]
            lines += [f"| {invocation(a)} | {help_text(parser, a)} |" for a in rows]
            lines.append("")
        commands = list(subcommands(parser))
        if commands:
            lines += ["Commands: " + ", ".join(f"`{c}`" for c in commands) + ".", ""]
        parts.append("\n".join(lines))
    return "\n".join(parts).rstrip("\n") + "\n"
