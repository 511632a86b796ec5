"""docs/deploy.md against template.yaml: every parameter and output the guide names exists,
the `sam deploy --guided` table covers every parameter the deploy asks for, and every stack
output the guide reads is one the stack has. A guide that drifts from the template fails here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.metric_names import emitted_metrics
from pgdrain.aws import local_invoke

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy.md"
TEMPLATE = ROOT / "template.yaml"

# CamelCase names in backticks that are not the template's: Aurora's own settings.
OTHER_NAMES = frozenset({"MinCapacity", "MaxCapacity", "SecondsUntilAutoPause"})
CAMEL_CASE = re.compile(r"`([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)`")
TABLE_ROW = re.compile(r"^\| ((?:`[A-Za-z0-9]+`(?:, )?)+) \|", re.MULTILINE)
OUTPUT_CALL = re.compile(r"\$\(output ([A-Za-z0-9]+)\)")


@dataclass(frozen=True)
class Problems:
    unknown_names: set[str]  # named in backticks, but neither a parameter nor an output
    unknown_parameters: set[str]  # in the deploy table, not a parameter
    parameters_not_in_table: set[str]  # asked for by the guided deploy, not explained
    unknown_outputs: set[str]  # read with `output NAME`, not an output


def _template_keys(node: Any) -> set[str]:
    """Every mapping key in the template (property names such as LoggingConfig)."""
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _template_keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _template_keys(v)}
    return set()


def check_guide(guide: str, template: dict[str, Any]) -> Problems:
    parameters = set(template["Parameters"])
    outputs = set(template["Outputs"])
    metrics = emitted_metrics()
    values = {
        str(value)
        for spec in template["Parameters"].values()
        for value in spec.get("AllowedValues", [])
    }
    known = (
        parameters
        | values
        | outputs
        | set(template["Resources"])
        | _template_keys(template)
        | metrics
        | OTHER_NAMES
    )
    named = set(CAMEL_CASE.findall(guide))
    deploy_section = guide.split("## 6. `sam deploy --guided`", 1)[1].split("\n## ", 1)[0]
    in_table = {
        name
        for cell in TABLE_ROW.findall(deploy_section)
        for name in re.findall(r"`([A-Za-z0-9]+)`", cell)
    }
    return Problems(
        unknown_names=named - known,
        unknown_parameters=in_table - parameters,
        parameters_not_in_table=parameters - in_table,
        unknown_outputs=set(OUTPUT_CALL.findall(guide)) - outputs,
    )


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return local_invoke.load_template(TEMPLATE)


def test_the_guide_names_only_what_the_template_has(template: dict[str, Any]) -> None:
    guide = GUIDE.read_text()
    assert check_guide(guide, template) == Problems(set(), set(), set(), set())
    # It does read outputs and does name parameters: the checks above are not vacuous.
    assert {"FunctionName", "KickPolicyArn"} <= set(OUTPUT_CALL.findall(guide))
    assert "DatabaseSecretArn" in CAMEL_CASE.findall(guide)


def test_a_guide_naming_what_the_template_lacks_fails(template: dict[str, Any]) -> None:
    """The same guide with one name changed in each place the check looks."""
    guide = GUIDE.read_text()
    renamed = (
        guide.replace("| `Pooler` |", "| `PoolerMode` |", 1)
        .replace("output KickPolicyArn", "output KickPolicy", 1)
        .replace("`AlarmTopicArn`", "`AlarmsTopicArn`", 1)
    )
    problems = check_guide(renamed, template)
    assert problems.unknown_parameters == {"PoolerMode"}
    assert problems.parameters_not_in_table == {"Pooler"}
    assert problems.unknown_outputs == {"KickPolicy"}
    assert problems.unknown_names == {"PoolerMode", "AlarmsTopicArn"}


def test_the_guide_invokes_events_that_exist() -> None:
    guide = GUIDE.read_text()
    events = set(re.findall(r"infra/events/[a-z]+\.json", guide))
    assert events
    for event in events:
        assert (ROOT / event).is_file(), event


def test_the_guide_sets_the_one_cap_on_direct_invocations(template: dict[str, Any]) -> None:
    """Every invocation opens a connection; MaxRuns bounds fan-out only. pgdrain refuses no
    run of its own (it would have connected to be counted): the guide recommends reserved
    concurrency, at least MaxRuns, and says why."""
    guide = GUIDE.read_text()
    deploy_section = guide.split("## 6. `sam deploy --guided`", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in deploy_section.splitlines() if line.startswith("| `Reserved")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    max_runs = template["Parameters"]["MaxRuns"]["Default"]
    for recommended in cells[1:3]:  # Neon, Aurora
        assert re.fullmatch(r"`\d+`", recommended), row
        assert int(recommended.strip("`")) >= max_runs
    assert "before a run connects" in deploy_section
    assert template["Parameters"]["ReservedConcurrentExecutions"]["Default"] == ""  # new accounts
