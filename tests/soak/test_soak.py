"""The chaos soak and its controls (`make soak`; marked slow, so not part of `make test`).

PGDRAIN_SOAK_JOBS sets the soak's size (default 20,000; CI runs a smaller one), and
PGDRAIN_SOAK_REPORT a file to write the figures to as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from helpers import restartable_pg
from soak.chaos import FAULTS, Figures, SoakConfig, run_soak

pytestmark = [
    pytest.mark.slow,
    # pyproject's per-test timeout is for `make test`: the soak's final phase alone may take
    # 600 s (SoakConfig.final_phase_seconds), after a chaos phase that grows with the jobs.
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        restartable_pg.available() is not None, reason=str(restartable_pg.available())
    ),
]

SOAK_JOBS = int(os.environ.get("PGDRAIN_SOAK_JOBS", "20000"))

# The controls: no kills, no restart; every job outlives its 1 s lease, and nothing extends it
# (Controls(heartbeat=False)). For 12 s, four drains run at a time, and one that finds nothing
# ready exits and is replaced at once: each new run reclaims the expired leases and runs those
# jobs again while their first attempts still work. Only `fenced` differs between the two.
CONTROL = SoakConfig(
    jobs=24,
    drains=4,
    min_budget=3.0,
    max_budget=6.0,
    kills=False,
    restart_database=False,
    lease_seconds=1.0,
    reserve_seconds=0.5,
    mix=(("nap", 1.0),),
    min_nap_ms=1500,
    max_nap_ms=2500,
    # Fewer slots (4 drains x 4) than jobs, so that jobs are still running when the first
    # drains end and new ones start, reclaim them, and (the queue being empty by then) claim
    # them again at once: the race a missing heartbeat, or a missing fence, loses.
    concurrency=4,
    heartbeat=False,
    chaos_min_seconds=12.0,
    final_drains=1,
    final_phase_seconds=300.0,
)


def _report(name: str, figures: Figures, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\n== {name} ==\n{figures.table()}")
    target = os.environ.get("PGDRAIN_SOAK_REPORT")
    if target:
        path = Path(target)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = dataclasses.asdict(figures)
        path.write_text(json.dumps(data, indent=2) + "\n")


def test_the_chaos_soak_loses_no_job_and_accepts_no_stale_completion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = run_soak(SoakConfig(jobs=SOAK_JOBS, **FAULTS))  # type: ignore[arg-type]
    _report("soak", figures, capsys)
    assert figures.violations == []
    assert figures.done + figures.failed_by_policy == SOAK_JOBS
    assert figures.killed > 0 and figures.database_restarts == 1
    assert figures.accepted_stale_completions == 0
    # The drain loop's faults all happened.
    assert figures.lost_replies > 0 and figures.pauses > 0
    assert figures.terminated > 0 and figures.warm_processes > 0
    assert figures.serializable_default


def test_with_done_jobs_not_kept_the_chaos_soak_loses_no_job_and_accepts_no_stale_completion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PGDRAIN_RETAIN_DONE=0: a completion deletes the job, and a lost reply's recovery tells a
    committed completion by the attempts that no longer hold their jobs (decision 0018). Half
    the soak's jobs, every fault on."""
    jobs = max(SOAK_JOBS // 2, 1000)
    config = SoakConfig(jobs=jobs, keep_done=False, **FAULTS)  # type: ignore[arg-type]
    figures = run_soak(config)
    _report("soak, done jobs not kept", figures, capsys)
    assert figures.violations == []
    assert figures.done + figures.failed_by_policy == jobs
    assert figures.killed > 0 and figures.database_restarts == 1
    assert figures.accepted_stale_completions == 0
    assert figures.lost_replies > 0 and figures.pauses > 0


def test_control_without_heartbeats_the_fence_refuses_every_stale_completion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = run_soak(CONTROL)
    _report("control: heartbeat off, fence on", figures, capsys)
    assert figures.refused_stale_completions > 0, "the control lost no lease: it shows nothing"
    assert figures.violations == []
    assert figures.accepted_stale_completions == 0


def test_control_results_dropped_without_a_word_are_caught_by_the_audit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The control of the audit's rule that every result not accepted was said lost by its run:
    the timeline of the control above, with the runs' "lease lost" lines left unread."""
    figures = run_soak(dataclasses.replace(CONTROL, read_lost_lines=False))
    _report("control: heartbeat off, fence on, lost lines unread", figures, capsys)
    assert figures.refused_stale_completions > 0, "the control lost no lease: it shows nothing"
    assert any("not said lost" in v for v in figures.violations)


def test_control_without_the_fence_the_audit_catches_an_accepted_stale_completion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = run_soak(dataclasses.replace(CONTROL, fenced=False))
    _report("control: heartbeat off, fence off", figures, capsys)
    assert figures.accepted_stale_completions > 0
    assert any("a stale completion" in v for v in figures.violations)


@pytest.mark.parametrize("fenced", [True, False], ids=["fence on", "fence off"])
def test_control_with_done_jobs_not_kept_the_fence_alone_keeps_stale_completions_out(
    fenced: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The controls' timeline with done jobs deleted: the audit reads the accepted completion
    from the soak's record of deleted rows, and catches one taken from a stale attempt."""
    figures = run_soak(dataclasses.replace(CONTROL, fenced=fenced, keep_done=False))
    _report(
        f"control, done not kept: heartbeat off, fence {'on' if fenced else 'off'}", figures, capsys
    )
    if fenced:
        assert figures.refused_stale_completions > 0, "the control lost no lease: it shows nothing"
        assert figures.violations == []
        assert figures.accepted_stale_completions == 0
    else:
        assert figures.accepted_stale_completions > 0
        assert any("a stale completion" in v for v in figures.violations)
