"""The outputs: the table printed, docs/simulate.json, docs/simulate.md and docs/simulate.png."""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sim.measure import Figures

FIELDS = (
    "trace",
    "system",
    "awake_minutes",
    "ideal_awake_minutes",
    "invocations",
    "peak_runs",
    "peak_connections",
    "p50_delay_s",
    "p99_delay_s",
    "max_delay_s",
    "makespan_s",
    "lost",
    "double_completions",
)
HEADERS = (
    "trace",
    "system",
    "awake min",
    "ideal min",
    "invocations",
    "peak runs",
    "peak conns",
    "p50 delay s",
    "p99 delay s",
    "max delay s",
    "makespan s",
    "lost",
    "double",
)

COLUMNS_DOC = """\
All figures are in simulated units (minutes, seconds), measured from what the database saw.

- **trace**: sparse, burst, backlog, backlog-trickle (the backlog run's trickle queue only),
  faults.
- **system**: `pgdrain` is the handler at the measured commit, configured by template.yaml (its
  schedule rate, retry policy, timeout, settings) and kicked by the application.
  `schedule-5min` is the same function with the 5-minute schedule alone (no kick, no one-shot
  schedules, no retries): today's default without kicks. `poller` is an always-on worker that
  keeps a connection and calls pgdrain's drain every simulated second, as PgQueuer and
  Procrastinate workers do.
- **awake min**: minutes the database is awake under a 5-minute suspend rule: from each moment
  of drain activity until 5 minutes after it. Activity is a pg_stat_activity sample (every
  100 ms real) showing a drain connection (application_name `pgdrain`), or a statement of one
  on pgdrain.jobs, which a statement trigger in the sim's database logs (an empty run lasts a
  few ms, too short for the samples).
- **ideal min**: the same rule applied to the moments work became due, the least any control
  plane can do.
- **invocations**: function invocations the stand-in started (kicks, schedules, wake-ups,
  continuations, retries, duplicates); 0 for the poller (one process).
- **peak runs**: most invocations running at once (the poller: 1). **peak conns**: most
  `pgdrain` connections at once in pg_stat_activity.
- **p50/p99/max delay s**: from the moment an attempt became due (its run_at; after a killed
  attempt, the kill) to its start, over every attempt in the ledger.
- **makespan s**: from the first job's creation to the last job done (backlog: of the backlog
  queue; backlog-trickle: of the trickle queue).
- **lost**: jobs not done when the trace ended. **double**: jobs whose work completed twice
  (two `done` rows in the ledger).
"""


def records(figures: Sequence[Figures], commit: str) -> list[dict[str, Any]]:
    out = []
    for figure in figures:
        values = asdict(figure)
        record = {name: values[name] for name in FIELDS}
        record["commit"] = commit
        out.append(record)
    return out


def table(figures: Sequence[Figures]) -> str:
    rows = [HEADERS] + [tuple(_cell(asdict(f)[name]) for name in FIELDS) for f in figures]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(figures: Sequence[Figures]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for figure in figures:
        values = asdict(figure)
        lines.append("| " + " | ".join(_cell(values[name]) for name in FIELDS) + " |")
    return "\n".join(lines)


# The single chain the backlog target compares with: the 5-minute schedule's run, which starts
# at the first tick (300 s) while the backlog is enqueued at 30 s (sim.traces).
BASELINE_FIRST_TICK_S = 300.0
BACKLOG_ENQUEUED_S = 30.0


def targets(figures: Sequence[Figures]) -> list[tuple[str, str, bool | None]]:
    """The control plane's targets, each with what was measured and whether it holds (None: not
    measured in this run)."""
    by = {(f.trace, f.system): f for f in figures}
    out: list[tuple[str, str, bool | None]] = []

    def check(text: str, measured: str, ok: bool | None) -> None:
        out.append((text, measured, ok))

    sparse, poller = by.get(("sparse", "pgdrain")), by.get(("sparse", "poller"))
    if sparse:
        ratio = sparse.awake_minutes / max(sparse.ideal_awake_minutes, 1e-9)
        check("sparse: awake <= 1.2x ideal", f"{ratio:.2f}x", ratio <= 1.2)
        if poller:
            share = sparse.awake_minutes / max(poller.awake_minutes, 1e-9)
            check("sparse: awake < 25% of the polling worker's", f"{share:.0%}", share < 0.25)
        p99 = sparse.p99_delay_s
        check(
            "sparse: p99 delay (delayed jobs, retries) <= 90 s",
            _cell(p99),
            None if p99 is None else p99 <= 90,
        )
    burst = by.get(("burst", "pgdrain"))
    if burst:
        check("burst: <= 3 invocations", str(burst.invocations), burst.invocations <= 3)
    backlog, chain = by.get(("backlog", "pgdrain")), by.get(("backlog", "schedule-5min"))
    if backlog and backlog.makespan_s is not None:
        if chain and chain.makespan_s is not None:
            single = chain.makespan_s - (BASELINE_FIRST_TICK_S - BACKLOG_ENQUEUED_S)
            check(
                "backlog: makespan <= 1/6 of a single chain",
                f"{backlog.makespan_s:g} s vs {single:g} s / 6",
                backlog.makespan_s <= single / 6,
            )
        check(
            "backlog: peak runs and connections <= 10",
            f"{backlog.peak_runs}, {backlog.peak_connections}",
            backlog.peak_runs <= 10 and backlog.peak_connections <= 10,
        )
    trickle = by.get(("backlog-trickle", "pgdrain"))
    if trickle:
        p99 = trickle.p99_delay_s
        check(
            "backlog: trickle queue p99 delay <= 60 s",
            _cell(p99),
            None if p99 is None else p99 <= 60,
        )
    faults = by.get(("faults", "pgdrain"))
    if faults:
        check(
            "faults: 0 lost, 0 double completions",
            f"{faults.lost}, {faults.double_completions}",
            faults.lost == 0 and faults.double_completions == 0,
        )
        worst = faults.max_delay_s
        check(
            "faults: every job started <= 5 min after due or a kill",
            _cell(worst),
            None if worst is None else worst <= 300,
        )
    return out


def targets_markdown(figures: Sequence[Figures]) -> str:
    lines = ["| target (pgdrain) | measured | holds |", "|---|---|---|"]
    for text, measured, ok in targets(figures):
        mark = "-" if ok is None else ("yes" if ok else "**no**")
        lines.append(f"| {text} | {measured} | {mark} |")
    return "\n".join(lines)


def read_json(path: Path) -> tuple[list[Figures], dict[str, Any]]:
    """The figures and meta of a simulate.json, to write the report again without a run."""
    document = json.loads(path.read_text(encoding="utf-8"))
    records = document.pop("records")
    figures = [Figures(**{k: r[k] for k in FIELDS}) for r in records]
    return figures, document


def write_json(path: Path, figures: Sequence[Figures], meta: dict[str, Any]) -> None:
    document = {**meta, "records": records(figures, str(meta["commit"]))}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def write_markdown(path: Path, figures: Sequence[Figures], meta: dict[str, Any]) -> None:
    label = (
        "" if meta["size"] == "full" else " (SMOKE FORM: small traces, not the figures of record)"
    )
    text = f"""# Control-plane simulator{label}

`make simulate` runs the real `lambda_handler` (handler/app.py) in real processes against real
PostgreSQL, with a stand-in for the AWS control plane (Lambda async invoke with its retry
policy, concurrency cap, hard kill at the timeout; EventBridge Scheduler's rate schedule and
one-shot `at()` schedules), and measures when runs start, how many run and how long the
database stays awake. The design and its pieces: `sim/__init__.py`.

Measured: commit `{meta["commit"]}`, {meta["size"]} form, time scale {meta["scale"]:g}
(a simulated minute is {60 / meta["scale"]:g} real seconds), {meta["real_minutes"]:.1f} real
minutes on this machine ({meta["machine"]}).

{markdown_table(figures)}
{_notes_markdown(meta)}
The control plane's targets, checked against the pgdrain rows (the single chain the backlog
compares with is the 5-minute schedule's run, less its wait for the first tick):

{targets_markdown(figures)}

![awake minutes and p99 delay per trace and system](simulate.png)

## How to run

```
make simulate          # the full form: writes docs/simulate.md, .json, .png (~40 min)
make simulate-smoke    # the small form, < 2 min, written to $TMPDIR/pgdrain-sim-smoke/
.venv-sim/bin/python -m sim --help
```

DATABASE_URL names the server (each trace and system gets its own database, created and
dropped; `--db-prefix` names them); without it the embedded PostgreSQL is used. The pytest
test `tests/sim` (marker `sim`) runs the smoke form so that CI keeps the simulator alive.

## The traces

{meta["traces_doc"]}

Every duration is divided by the scale factor: job lengths and delays, the rate schedule, the
one-shot schedules' one-minute precision (PGDRAIN_WAKE_PRECISION_SECONDS is passed scaled), the
5-minute suspend rule, the function's Timeout, Lambda's retry delays (1 and 2 minutes) and the
function's own PGDRAIN_*_SECONDS settings from template.yaml. What is not scaled: the
database's and the processes' own speed (a claim, a connection, an import take the same real
time, so they look 12 times slower in simulated time: the figures are conservative for pgdrain
and for its baselines alike). Cold starts: Lambda initialises each new execution environment
on a host of its own, so the simulator prepares pgdrain's environments (as many as may run at
once) one at a time before a trace, measuring how long each took to initialise alone, and an
environment's first invocation waits that long, scaled; on two cores, seven imports at once took
3.4 to 4.4 s where one takes under a second, which made fan-out's runs late for the machine's
reason, not Lambda's. The backlog's jobs write their ledger rows through a buffer (sim.jobs):
two statements waited for per job were the largest share of the CPU its ten runs competed
for. The trace lengths were chosen for the full form to finish in about forty minutes on a
2-core machine: the sparse trace covers {meta["sparse_minutes"]:g} simulated minutes; idle
nearly all the time, it runs beside the others at a scale of its own where the traces say so
(its processes' real time then looks that many times longer: conservative for the delays it
measures). The backlog
runs in real time (scale 1), so that its jobs' 20 ms are 20 real ms: at a larger scale a run
drains jobs of a fraction of a millisecond, and ten runs measure this machine's two cores, not
fan-out. For the same reason it runs last, alone: beside the sparse trace (whose poller polls
twenty times a real second) its ten runs took 20.9 s where alone they took 17.5 to 18.7.

## Columns

{COLUMNS_DOC}"""
    path.write_text(text, encoding="utf-8")


def _notes_markdown(meta: dict[str, Any]) -> str:
    notes = meta.get("notes") or []
    return "".join(f"\n- {note}" for note in notes) + ("\n" if notes else "")


def write_plot(path: Path, figures: Sequence[Figures]) -> bool:
    """docs/simulate.png; False when matplotlib is not installed (the smoke test's venv)."""
    try:  # imported by name: matplotlib is in the sim's venv only, and has no stubs to check
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return False
    traces = list(dict.fromkeys(f.trace for f in figures))
    systems = list(dict.fromkeys(f.system for f in figures))
    by_key = {(f.trace, f.system): f for f in figures}
    fig, (awake_ax, delay_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs = [t + (i - (len(systems) - 1) / 2) * width for t in range(len(traces))]
        awake = [_value(by_key.get((t, system)), "awake_minutes") for t in traces]
        delay = [_value(by_key.get((t, system)), "p99_delay_s") for t in traces]
        awake_ax.bar(xs, awake, width, label=system)
        delay_ax.bar(xs, delay, width, label=system)
    ideal = [_value(by_key.get((t, systems[0])), "ideal_awake_minutes") for t in traces]
    awake_ax.scatter(range(len(traces)), ideal, marker="_", s=600, color="black", label="ideal")
    for ax, title in (
        (awake_ax, "database awake (simulated minutes)"),
        (delay_ax, "p99 delay due -> started (simulated s, log)"),
    ):
        ax.set_xticks(range(len(traces)), traces)
        ax.set_title(title)
        ax.legend(fontsize=8)
    delay_ax.set_yscale("symlog", linthresh=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _value(figure: Figures | None, name: str) -> float:
    if figure is None:
        return 0.0
    value = getattr(figure, name)
    return float(value) if value is not None else 0.0


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
