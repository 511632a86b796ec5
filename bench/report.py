"""docs/benchmarks.md and its plots (throughput; cost per million jobs), from one run's figures."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import cost
from bench.common import REPO, STRICT, STRICT_CEILING, paired_ratio

if TYPE_CHECKING:
    from bench.common import Figure
    from bench.run import Results

# The targets (goals for the figures, not test assertions).
CEILING_RATIO = 0.8
PEER_RATIO = 2.0
GRAPHILE_RATIO = 1.5  # issue 43: pgdrain / graphile-worker, per process and best against best
ROUND_TRIPS = 2
IMPORT_MS = 150.0
ENQUEUE_PER_S = 50_000.0
RSS_MB = 64.0


def _n(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _share(value: float | None) -> str:
    """A share as a whole percentage; "-" where it was not measured (earlier runs)."""
    return "-" if value is None else f"{value:.0%}"


def _stolen(env: dict[str, Any]) -> str:
    """How much of the CPU the virtual machine's host gave to other guests over a run (steal
    time), where the run measured it."""
    stolen = env.get("stolen")
    return "" if stolen is None else f", {stolen:.0%} of the CPU stolen by the host meanwhile"


def _get(res: Results, key: str) -> Figure | None:
    fig = res.figures.get(key)
    return fig if fig is not None and fig.values else None


def _value(res: Results, key: str) -> float:
    fig = _get(res, key)
    return fig.value if fig is not None else float("nan")


def _cell(res: Results, key: str) -> str:
    fig = res.figures.get(key)
    if fig is None:
        return ""
    if not fig.values:
        return f"no verified run ({fig.rejected} failed the check)"
    text = _n(fig.value)
    if fig.rejected:
        text += f" ({fig.rejected} run(s) failed the check)"
    return text


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


def _pair(
    res: Results, batch: int, procs: int, kind: str = "pgdrain", ceiling: str = "ceiling"
) -> float:
    """pgdrain / ceiling at one batch size and process count: the median of the ratios of
    each repetition, whose two runs were back to back."""
    return paired_ratio(
        res.figures.get(f"{kind}/{batch}/{procs}"), res.figures.get(f"{ceiling}/{batch}/{procs}")
    )


def _best_against_best_bound(res: Results) -> str:
    """What the SQL leaves for best against best: pgdrain's best cell beside its ceiling with as
    many pgbench clients, and the share of that ceiling twice PgQueuer's best would need."""
    h = headline(res)
    cell = _best_pgdrain_cell(res)
    if cell is None or math.isnan(h["pgqueuer_best"]):
        return ""
    batch, procs = cell
    ceiling = _value(res, f"ceiling/{batch}/{procs}")
    if math.isnan(ceiling):
        return ""
    return (
        f"Best against best is bounded by the SQL: pgdrain's best, {_n(h['pgdrain_best'])} "
        f"jobs/s at batch {batch} with {procs} process{'es' if procs > 1 else ''}, is "
        f"{_n(_pair(res, batch, procs), 2)}x its ceiling with as many pgbench clients "
        f"({_n(ceiling)} jobs/s); twice PgQueuer's best ({_n(2 * h['pgqueuer_best'])} jobs/s) "
        f"is {_n(2 * h['pgqueuer_best'] / ceiling, 2)}x that ceiling. The processes share the "
        "machine's cores (Setup) with their backends, so this ratio moves with the machine "
        "from run to run more than any other."
    )


def _strict_ratio(res: Results) -> float:
    return _pair(res, res.config.strict_batch, 1, STRICT, STRICT_CEILING)


def _has_strict(res: Results) -> bool:
    """Whether the run measured the strict-ordering cell (runs before it did not)."""
    return f"{STRICT}/{res.config.strict_batch}/1" in res.figures


def _strict_headline(res: Results, ratio: float) -> str:
    if not _has_strict(res):
        return ""
    cfg = res.config
    return (
        f" and **{_n(ratio, 2)}x** at batch {cfg.strict_batch}, concurrency "
        f"{cfg.strict_concurrency} (strict ordering)"
    )


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "**missed**")


def rows(res: Results) -> list[dict[str, Any]]:
    """The throughput table: one row per system and setting, one column per process count."""
    cfg = res.config
    best = res.info.get("best_batch", cfg.default_batch)
    out: list[dict[str, Any]] = []

    def conc(batch: int) -> Any:
        fig = res.figures.get(f"pgdrain/{batch}/1")
        return fig.params.get("concurrency", "?") if fig else "?"

    default = cfg.default_batch
    for batch, label in (
        (default, f"default: batch {default}, concurrency {conc(default)}"),
        (best, f"best: batch {best}, concurrency {conc(best)}"),
    ):
        if batch == best and label.startswith("best") and best == cfg.default_batch:
            continue
        out.append({"system": "pgdrain", "setting": label, "key": f"pgdrain/{batch}/{{p}}"})
        out.append(
            {
                "system": "SQL ceiling (pgbench)",
                "setting": f"batch {batch}, clients = processes",
                "key": f"ceiling/{batch}/{{p}}",
            }
        )
    if "pgqueuer_best_batch" in res.info:
        b = res.info["pgqueuer_best_batch"]
        for driver in ("asyncpg", "psycopg"):
            out.append(
                {
                    "system": f"PgQueuer {res.info['peer_versions']['pgqueuer']} ({driver})",
                    "setting": f"drain mode, batch_size {b}",
                    "key": f"pgqueuer-{driver}/{b}/{{p}}",
                }
            )
        c = res.info["procrastinate_best_concurrency"]
        out.append(
            {
                "system": f"Procrastinate {res.info['peer_versions']['procrastinate']}",
                "setting": f"wait=False, concurrency {c}",
                "key": f"procrastinate/{c}/{{p}}",
            }
        )
    return out


def _process_counts(res: Results) -> list[int]:
    counts = {int(f.params["processes"]) for f in res.figures.values() if "processes" in f.params}
    return sorted(counts)


def _best_pgdrain_cell(res: Results) -> tuple[int, int] | None:
    """(batch, processes) of pgdrain's most jobs/s among the cells run at more than one process
    count (the default batch and the best), or None if none was measured."""
    cfg = res.config
    best = res.info.get("best_batch", cfg.default_batch)
    cells = [(b, p) for b in (cfg.default_batch, best) for p in _process_counts(res)]
    measured = [cell for cell in cells if _get(res, "pgdrain/{}/{}".format(*cell)) is not None]
    return max(measured, key=lambda cell: _value(res, "pgdrain/{}/{}".format(*cell)), default=None)


def headline(res: Results) -> dict[str, float]:
    cfg = res.config
    best = res.info.get("best_batch", cfg.default_batch)
    best_cell = _best_pgdrain_cell(res)
    pg_best = float("nan") if best_cell is None else _value(res, "pgdrain/{}/{}".format(*best_cell))
    pq_keys = [k for k in res.figures if k.startswith("pgqueuer-")]
    pq_best = max((_value(res, k) for k in pq_keys), default=float("nan"))
    pq_one = max((_value(res, k) for k in pq_keys if k.endswith("/1")), default=float("nan"))
    return {
        "ratio_default": _pair(res, cfg.default_batch, 1),
        "ratio_best": _pair(res, best, 1),
        "ratio_strict": _strict_ratio(res),
        "pgdrain_best": pg_best,
        "pgdrain_one": _value(res, f"pgdrain/{best}/1"),
        "pgqueuer_best": pq_best,
        "pgqueuer_one": pq_one,
    }


def plot(res: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    procs = _process_counts(res)
    fig, ax = plt.subplots(figsize=(9, 6.5), dpi=110)
    colours: dict[str, Any] = {}  # matplotlib colours: a name or an RGB(A) tuple
    for row in rows(res):
        xs, ys = [], []
        for p in procs:
            key = row["key"].format(p=p)
            if _get(res, key) is not None:
                xs.append(p)
                ys.append(_value(res, key))
        if not xs:
            continue
        ceiling = row["system"].startswith("SQL ceiling")
        # A pgdrain line and its ceiling share a colour: solid for pgdrain, dashed for SQL.
        pair = row["setting"].split(",")[0].split(": ")[-1] if ceiling else None
        colour = colours.get(pair or "") if ceiling else None
        (line,) = ax.plot(
            xs,
            ys,
            "--" if ceiling else "-",
            marker="s" if ceiling else "o",
            color=colour,
            label=f"{row['system']}: {row['setting']}",
        )
        if row["system"] == "pgdrain":
            colours[row["setting"].split(": ")[1].split(",")[0]] = line.get_color()
    ax.set_xlabel("drain processes (pgbench clients for the ceiling)")
    ax.set_ylabel("jobs/s, median of repetitions (log scale)")
    ax.set_yscale("log")
    ax.set_xticks(procs)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("No-op jobs drained per second: one PostgreSQL, one run")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def cost_png(png: Path) -> Path:
    return png.with_name(f"{png.stem}-cost.png")


def write(res: Results, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(res, png)
    model = cost_model(res)
    if model is not None:
        setting = f"batch {res.config.default_batch}, concurrency {model[0].concurrency}"
        plot_cost(*model, cost_png(png), f"pgdrain ({setting})")
    out.write_text(markdown(res, png.name))


# -- cost -------------------------------------------------------------------------------------

MILLION = 1_000_000
# Job durations of the cost table, seconds; the plot spans the same range.
COST_DURATIONS = (0.001, 0.01, 0.1, 1.0)


def cost_model(res: Results) -> tuple[cost.Drain, cost.Function] | None:
    """pgdrain's measured figures at the default settings, one process, and the function
    both systems run as; None when the run did not measure the drain's CPU."""
    cfg = res.config
    fig = _get(res, f"pgdrain/{cfg.default_batch}/1")
    if fig is None or not fig.extra.get("cpu_s_per_1000_jobs"):
        return None
    empty = res.figures.get("empty")
    run_ms = empty.extra_median("total_ms") if empty is not None else float("nan")
    drain = cost.Drain(
        wall_s_per_job=1.0 / fig.value,
        cpu_s_per_job=fig.extra_median("cpu_s_per_1000_jobs") / 1000.0,
        concurrency=int(fig.params["concurrency"]),
        run_overhead_s=0.0 if math.isnan(run_ms) else run_ms / 1000.0,
    )
    # The template as it was when the run measured (a later edit must not change old figures).
    saved = res.info.get("lambda")
    fn = cost.Function(**saved) if saved else cost.template_function(REPO / "template.yaml")
    return drain, fn


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _dollars(value: float, digits: int | None = None) -> str:
    """Escaped: two bare dollar signs on a line open a formula in GitHub's Markdown."""
    if digits is not None:
        return f"\\${value:.{digits}f}"
    return f"\\${value:,.2f}" if value >= 1 else f"\\${value:.4f}"


def _cost_headline(res: Results) -> str:
    model = cost_model(res)
    if model is None:
        return ""
    d = 0.1
    ours, sqs = cost.pgdrain_cost(MILLION, d, *model), cost.sqs_cost(MILLION, d, model[1])
    return (
        f" A million {_duration(d)} jobs cost **{_dollars(ours.total)}** of Lambda with "
        f"pgdrain, **{_dollars(sqs.total)}** through SQS + Lambda (Cost, below)."
    )


def cost_section(res: Results, png_name: str) -> list[str]:
    """`## Cost`: the drain's CPU per 1,000 jobs and $ per million jobs against SQS + Lambda."""
    model = cost_model(res)
    if model is None:
        return []
    drain, fn = model
    cfg = res.config
    fig = res.figures[f"pgdrain/{cfg.default_batch}/1"]
    cpu_1000 = fig.extra_median("cpu_s_per_1000_jobs")
    out = ["## Cost", ""]
    out.append(
        f"The drain process's CPU at the default settings (batch {cfg.default_batch}, "
        f"concurrency {drain.concurrency}, one process, the {cfg.jobs:,}-job drains above): "
        f"**{cpu_1000:.3f} CPU s per 1,000 no-op jobs** (user + system, every thread, "
        "getrusage around the drain, as `bench/profile.py` reads it; median of "
        f"{len(fig.values)} repetitions; the database's own CPU not included), at "
        f"{_n(fig.value)} jobs/s: {drain.wall_s_per_job * 1e6:.0f} µs of wall time per job."
    )
    out.append("")
    out.append(
        "| job duration | pgdrain: \\$ per million jobs | pgdrain: runs | SQS + Lambda: \\$ "
        "per million jobs | of which SQS requests | SQS + Lambda / pgdrain |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|")
    for d in COST_DURATIONS:
        ours, sqs = cost.pgdrain_cost(MILLION, d, drain, fn), cost.sqs_cost(MILLION, d, fn)
        out.append(
            f"| {_duration(d)} | {_dollars(ours.total)} | {ours.invocations:,} | "
            f"{_dollars(sqs.total)} | {_dollars(sqs.sqs_requests)} | "
            f"{_n(_ratio(sqs.total, ours.total), 1)} |"
        )
    out.append("")
    out.append(f"![cost per million jobs against job duration]({png_name})")
    out.append("")
    on_lambda = cost.pgdrain_seconds_per_job(drain, fn, 0.0)
    overhead = f"{cost.SQS_INVOCATION_OVERHEAD_S * 1000:g} ms"
    out.append(
        "How, for N = 1,000,000 jobs of d seconds, at AWS's published prices (us-east-1, no "
        f"free tier): p_GB = {_dollars(cost.GB_SECOND, 10)} per GB-second and p_req = "
        f"{_dollars(cost.LAMBDA_REQUEST * MILLION, 2)} per million requests of arm64 Lambda, "
        f"p_SQS = {_dollars(cost.SQS_REQUEST * MILLION, 2)} per million SQS standard requests; "
        f"memory M = {fn.memory_mb} MB and runs of T = {fn.timeout_s:g} s, template.yaml's "
        "MemorySize and Timeout defaults. **pgdrain:** a job keeps a run busy "
        f"`t = max(w + c·(1/v - 1), d/{drain.concurrency})`, with w = "
        f"{drain.wall_s_per_job * 1e6:.0f} µs and c = {drain.cpu_s_per_job * 1e6:.0f} µs the "
        f"measured wall and CPU time per no-op job and v = min(1, M/{cost.ONE_VCPU_MB:,}) = "
        f"{fn.vcpu:.2f} the share of a vCPU Lambda gives M MB (t = {on_lambda * 1e6:.0f} µs "
        "for a no-op job); `cost = (N·t + runs·e)·M/1024·p_GB + runs·p_req`, with "
        f"`runs = ⌈N·t/T⌉` and e = {drain.run_overhead_s * 1000:.1f} ms, the empty scheduled "
        "run's wall time with its connect. **SQS + Lambda:** "
        f"`cost = 3·(N/10)·p_SQS + (N/10)·(p_req + ⌈10·d + {overhead}⌉·M/1024·p_GB)`: "
        "a send, a receive and a delete request per 10 messages, and one invocation that "
        "handles them one after the other, billed to the next millisecond."
    )
    out.append("")
    out.append(
        "Assumptions: a job's d seconds are spent waiting (on I/O), not computing, so "
        f"pgdrain's {drain.concurrency} threads overlap them, while the SQS handler runs its "
        "batch one message after the other (one that threads its batch would come nearer "
        f"d per invocation). {cost.SQS_INVOCATION_OVERHEAD_S * 1000:g} ms per SQS-fed "
        "invocation is the least Lambda bills: a real handler spends more, so this favours "
        "SQS. pgdrain's w was measured against a PostgreSQL on the same machine: across a "
        "network each claim adds a round trip (one per "
        f"{cfg.default_batch} jobs). Not counted, on either side: free tiers; the database "
        "(pgdrain's queue is a table of the PostgreSQL the application runs already; its "
        "load is the statements measured above); the event source mapping's polls of an "
        "empty queue; pgdrain's scheduled safety-net runs and kicks; logs and data transfer."
    )
    out.append("")
    return out + memory_section(res, drain)


def memory_section(res: Results, drain: cost.Drain) -> list[str]:
    """`### Which memory size`: jobs per GB-second by MemorySize for three kinds of job, from
    the measured drain (bench/cost.py's model), and what a second process measured here."""
    shapes = cost.JOB_SHAPES
    out = ["### Which memory size", ""]
    out.append(
        "Jobs drained per GB-second billed, by `MemorySize`, for no-op jobs, jobs that compute "
        "10 ms (holding the GIL) and jobs that wait 100 ms, with one drain process per "
        "invocation and with one per whole vCPU (Lambda gives 1 vCPU per 1,769 MB, up to 6 "
        "at 10,240 MB). From the drain measured above (w, c) by `bench/cost.py`: a process "
        "uses at most one vCPU (one GIL), the processes share the function's vCPUs, the "
        "drain's CPU and a job's CPU stretch by that share, its round trips do not, and a "
        f"job's waiting overlaps across the {drain.concurrency} threads. The database is "
        "assumed not to be the limit."
    )
    out.append("")
    head = "| MemorySize | vCPUs |"
    rule = "|---:|---:|"
    for shape in shapes:
        head += f" {shape.name}: 1 process | per vCPU |"
        rule += "---:|---:|"
    out += [head, rule]
    for mb in cost.MEMORY_SIZES_MB:
        row = f"| {mb:,} MB | {cost.vcpus(mb):.2f} |"
        for shape in shapes:
            one = cost.jobs_per_gb_second(drain, mb, shape)
            each = cost.jobs_per_gb_second(drain, mb, shape, cost.processes_for(mb))
            row += f" {_n(one)} | {_n(each) if cost.processes_for(mb) > 1 else '-'} |"
        out.append(row)
    out.append("")
    best = []
    for shape in shapes:
        rates = {m: cost.jobs_per_gb_second(drain, m, shape) for m in cost.MEMORY_SIZES_MB}
        near = [m for m, r in rates.items() if r >= 0.95 * max(rates.values())]
        sizes = f"{near[0]:,} MB" if len(near) == 1 else f"{near[0]:,} to {near[-1]:,} MB"
        best.append(f"{shape.name}: {sizes}")
    out.append(
        "Most jobs per GB-second (within 5% of the best): "
        + "; ".join(best)
        + ". No-op and waiting jobs spend their "
        "time on round trips and sleeps, which more memory does not shorten: the smallest "
        "function that holds the process (its peak RSS is above) is the cheapest, and for "
        "waiting jobs a higher `PGDRAIN_CONCURRENCY` does what more processes would. "
        "CPU-bound jobs cost the same per job at any size up to 1,769 MB (each size pays for "
        "the share of a vCPU it gets); above it, one process leaves the extra vCPUs idle and "
        "only one process per vCPU keeps the cost per job where it was, for a shorter run."
    )
    two_processes = _get(res, f"pgdrain/{res.config.default_batch}/2")
    one_process = _get(res, f"pgdrain/{res.config.default_batch}/1")
    if one_process is not None and two_processes is not None:
        out.append("")
        out.append(
            "A second process, measured: on this machine's 2 cores (the vCPUs of a 3,538 MB "
            "function), two drain processes at the default batch drained "
            f"{_n(two_processes.value)} no-op jobs/s against one's {_n(one_process.value)} "
            f"({_n(_ratio(two_processes.value, one_process.value), 2)}x): it pays for no-op "
            "and CPU-bound jobs from 3,538 MB; below that it splits one vCPU, which pays only "
            "while a process's time is mostly waiting."
        )
    out.append("")
    out.append(
        "pgdrain runs one drain process per invocation, so it gets what one process per vCPU "
        "would give from more runs instead, each at up to 1,769 MB: the same cost per job, "
        "and each run holds one connection, as a second process would. A run whose backlog "
        "outlasts `PGDRAIN_FANOUT_SECONDS` starts them itself, up to `PGDRAIN_MAX_RUNS` "
        "([lambda.md](lambda.md)); a larger `MemorySize` only shortens the CPU-bound part of "
        "one run."
    )
    out.append("")
    return out


def plot_cost(drain: cost.Drain, fn: cost.Function, path: Path, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    low, high = math.log10(COST_DURATIONS[0]), math.log10(COST_DURATIONS[-1])
    steps = 60
    durations = [10 ** (low + (high - low) * i / steps) for i in range(steps + 1)]
    ours = [cost.pgdrain_cost(MILLION, d, drain, fn).total for d in durations]
    sqs = [cost.sqs_cost(MILLION, d, fn).total for d in durations]
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    ax.plot(durations, ours, "-", label=label)
    ax.plot(durations, sqs, "--", label="SQS standard + Lambda (10 messages per invocation)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("job duration, seconds (log scale)")
    ax.set_ylabel("$ per million jobs (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Cost of one million jobs: arm64 Lambda at {fn.memory_mb} MB")
    ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# Rows without a "before" run: what the before column says instead.
BEFORE_NOTE = {"exit": "not run", "exit_empty": "not run"}

BIGTABLE_ORDER = [
    "has_ready",
    "has_ready_empty",
    "claim",
    "claim_empty",
    "depth",
    "stats",
    "reclaim",
    "exit",
    "exit_empty",
]


def _plan(case: dict[str, Any]) -> str:
    scan = "**Seq Scan**" if case["seq_scan"] else ""
    used = ", ".join(f"`{i}`" for i in case["indexes"])
    return "; ".join(x for x in (scan, used) if x) or "-"


def flow_section(flow: dict[str, Any] | None) -> list[str]:
    """`## Sequences and dependencies`: the plain drain before and after migration 0021, in
    interleaved pairs, jobs/s draining 1,000 sequences, and the migration's lock on 2M rows
    (`python -m bench.flow`, docs/decisions/0014)."""
    if not flow:
        return []
    env = flow["env"]
    out = ["## Sequences and dependencies", ""]
    out.append(
        f"Measured on {env['date']} ({env['server']}; {env['machine']}) by `python -m bench.flow`"
        f", one drain process, jobs that take no time, each repetition on a fresh database: "
        f"the plain drain (no sequence, no dependency) at {env['before']} (before migration "
        f"0021) and at {env['after']}, in {flow['pairs_count']} interleaved pairs (the order "
        "swapped every other pair), medians; then 1,000 sequences of 10 jobs each at "
        f"{env['after']}, medians of {flow['sequence_reps']}."
    )
    out.append("")
    out.append("| drain | before (jobs/s) | after (jobs/s) | after / before (median of pairs) |")
    out.append("|---|---|---|---|")
    for case in flow["pairs"]:
        before, after = case["before"], case["after"]
        ratio = statistics.median(a / b for a, b in zip(after, before, strict=True))
        out.append(
            f"| {case['case']} | {_n(statistics.median(before))} | "
            f"{_n(statistics.median(after))} | {_n(ratio, 2)}x |"
        )
    out.append("")
    out.append("| drain (at the after commit) | jobs/s |")
    out.append("|---|---|")
    for case in flow["sequences"]:
        out.append(f"| {case['case']} | {_n(statistics.median(case['values']))} |")
    out.append("")
    out.append(flow["note"])
    out.append("")
    if flow.get("split_note"):  # migration 0021 on the split jobs table (0018)
        out.append(flow["split_note"])
        out.append("")
    return out


def bigtable_section(big: dict[str, Any] | None) -> list[str]:
    """`## Big table`: each end-of-run statement on 2M finished + 200k queued rows."""
    if not big:
        return []
    env, rows = big["env"], big["rows"]
    now = {c["key"]: c for c in big["cases"] if c["version"] == "now"}
    before = {c["key"]: c for c in big["cases"] if c["version"] == "before"}
    out = ["## Big table: the statements that end a run, on a long history", ""]
    out.append(
        f"Measured at pgdrain {env['pgdrain']} on {env['date']} ({env['server']}; load "
        f"{env['load_start']}), by `python -m bench.run --only bigtable` (or `make bench`). "
        f"One table of {rows['finished']:,} finished rows (5% failed) and {rows['queued']:,} "
        f"queued ({rows['ready']:,} ready, the rest due tomorrow; three priorities; four "
        "queues, and a fifth whose jobs are all delayed: a run's last claim and ready check "
        f"find nothing there), {rows['running']} running; {_n(rows['table_mb'])} MB with its "
        "indexes, vacuumed and analysed. Each statement is timed from the client (execute "
        f"and fetch) {big['runs']} times after {big['warmup']} untimed runs; ms are the median "
        "(and the 90th percentile). Statements that write run in a transaction rolled back "
        "each time. *Before* is the statement's text before migration 0005 (kept in "
        "`bench/bigtable.py`) on the same table with migration 0005's indexes dropped: the "
        "statements and schema as they were."
    )
    out.append("")
    out.append("| statement | before: ms | before: plan | now: ms (p90) | now: plan |")
    out.append("|---|---:|---|---:|---|")
    for key in BIGTABLE_ORDER:
        case = now.get(key)
        if case is None:
            continue
        old = before.get(key)
        out.append(
            f"| {case['label']} | "
            f"{_n(old['median_ms'], 2) if old else BEFORE_NOTE.get(key, 'same text')} | "
            f"{_plan(old) if old else ''} | {_n(case['median_ms'], 2)} "
            f"({_n(case['p90_ms'], 2)}) | {_plan(case)} |"
        )
    out.append("")
    out.append(
        "What changed (migration 0005 and `hot_path.sql`): `jobs_queued_run_at_idx` (queue, "
        "run_at) over queued rows lets the ready check probe the range `run_at <= now()` once "
        "per queue; as `queue = ANY(...)` over the table, the planner expected a ready row "
        "early in a sequential scan and read the whole history first. The claim probes the "
        "same index per queue before its priority-ordered scan, so a queue with nothing ready "
        "is passed over at once; before, the scan walked every delayed row of the queue "
        "(jobs_ready_idx orders by priority first, so `run_at <= now()` bounds nothing). "
        "The guard does not help a queue whose ready jobs all sit behind many delayed jobs "
        "of a more urgent priority: the claim still walks those. queue_depth counts the "
        "ready rows of the same index (exact, so it grows with the ready backlog, never with "
        "the history). run_exit, the statement a run now ends on (it came after migration "
        "0005), made the same mistake in its own ready probe until 4e3bdf4: a sequential scan "
        "through the history in its plan, generic and custom; it probes each queue as "
        "queue_has_ready does now."
    )
    out.append("")
    out.append(
        "`pgdrain stats`: queued, ready, running, expired leases and the oldest ready age "
        "are exact, read from the partial indexes of queued and running rows (their cost "
        "grows with the backlog). **done and failed are exact up to 10,000 per queue and "
        "read 10000 above that**: counting every finished row each time is what made stats "
        "slow, so each count stops at the bound: index scans of each finished_jobs "
        "partition's (queue, status, id) index, and of `jobs_finished_queue_idx` for parked "
        "jobs, which stay in active_jobs; the queues that only have history are found by "
        "skipping through the same indexes, one probe per queue."
    )
    out.append("")
    return out


def queue_flow_section(qf: dict[str, Any] | None) -> list[str]:
    """`## Queue pause and rate limits`: recorded by `python -m bench.queue_flow
    --write-section FILE` (its runs are paired by hand, before and after a commit)."""
    if not qf:
        return []
    return [*qf["markdown"], ""]


# -- graphile-worker -----------------------------------------------------------------------------

GRAPHILE = "graphile"


# The suffix of pgdrain's cells run with done jobs not kept (PGDRAIN_RETAIN_DONE=0).
NOT_KEPT = "/not-kept"


def _graphile_keys(res: Results, name: str, *, kept: bool = True) -> list[str]:
    return [
        k
        for k in res.figures
        if k.startswith(f"{GRAPHILE}/{name}/") and k.endswith(NOT_KEPT) is not kept
    ]


def graphile_ratios(res: Results, *, kept: bool = True) -> dict[str, Any]:
    """pgdrain / graphile-worker: one process each, at each batch size (the median of each
    repetition's ratio: the two ran back to back), and best against best (each side's best
    median over its settings and process counts), with the cells that were best. kept False:
    pgdrain's cells with done jobs not kept."""
    info = res.info.get("graphile") or {}
    one = res.figures.get(f"{GRAPHILE}/graphile-worker/1")
    suffix = "" if kept else NOT_KEPT
    batches = info.get("batches", []) if kept else info.get("not_kept_batches", [])
    per_process = {
        int(b): paired_ratio(res.figures.get(f"{GRAPHILE}/pgdrain/{b}/1{suffix}"), one)
        for b in batches
    }
    pg_keys = _graphile_keys(res, "pgdrain", kept=kept)
    pg = max(pg_keys, key=lambda k: _value(res, k), default=None)
    gw = max(_graphile_keys(res, "graphile-worker"), key=lambda k: _value(res, k), default=None)
    pg_best = _value(res, pg) if pg else float("nan")
    gw_best = _value(res, gw) if gw else float("nan")
    return {
        "per_process": per_process,
        "best": _ratio(pg_best, gw_best),
        "pgdrain_best": pg_best,
        "graphile_best": gw_best,
        "pgdrain_best_cell": res.figures[pg].params if pg else {},
        "graphile_best_cell": res.figures[gw].params if gw else {},
    }


def graphile_targets(res: Results) -> list[tuple[str, str, str, bool | None]]:
    if not _graphile_keys(res, "graphile-worker"):
        return []
    out: list[tuple[str, str, str, bool | None]] = []
    for kept in (True, False):
        if not _graphile_keys(res, "pgdrain", kept=kept):
            continue
        r = graphile_ratios(res, kept=kept)
        mode = "" if kept else ", done jobs not kept"
        for batch, ratio in r["per_process"].items():
            out.append(
                (
                    f"per process: pgdrain (batch {batch}{mode}) / graphile-worker, one "
                    "process each",
                    _n(ratio, 2),
                    f"≥ {GRAPHILE_RATIO}",
                    None if math.isnan(ratio) else ratio >= GRAPHILE_RATIO,
                )
            )
        best = r["best"]
        out.append(
            (
                f"pgdrain best{mode} / graphile-worker best (jobs/s)",
                f"{_n(best, 2)} ({_n(r['pgdrain_best'])} / {_n(r['graphile_best'])})",
                f"≥ {GRAPHILE_RATIO}",
                None if math.isnan(best) else best >= GRAPHILE_RATIO,
            )
        )
    return out


def _processes(count: int) -> str:
    return f"{count} process{'es' if count > 1 else ''}"


def graphile_section(res: Results) -> list[str]:
    """`## graphile-worker, side by side`: its own run (`--only graphile`) or the whole run's."""
    info = res.info.get("graphile")
    if not info or ("env" not in info and "missing" not in info):  # not measured: notes alone
        return []
    lines = ["## graphile-worker, side by side", ""]
    if "missing" in info:
        return [*lines, f"Not measured in this run: {info['missing']}.", ""]
    env = info["env"]
    procs = info["processes"]
    lines += [
        f"Measured at pgdrain {env['pgdrain']} on {env['date']} ({env['server']}; load "
        f"{env['load_start']} at the start, {env.get('load_end', '?')} at the end"
        f"{_stolen(env)}; the machine was shared with other work): graphile-worker "
        f"{info['version']} on Node {info['node']}, {info['jobs']:,} no-op jobs, medians of "
        f"{info['reps']} repetitions, every cell once per repetition in turn, each on a fresh "
        "copy of a template holding the pre-enqueued jobs (graphile-worker's added with its "
        "`addJobs`; enqueueing is not timed).",
        "",
        "graphile-worker runs as its performance page tunes it "
        f"({info['tuning']}), in one Node process per worker (`bench/graphile/drain.mjs`), "
        "draining with `runOnce()`, which returns once the queue is empty; its pool "
        "(maxPoolSize connections in each process, where a pgdrain drain holds one) is "
        "connected before the clock starts. A repetition counts only if graphile-worker's "
        "jobs table is empty afterwards (it deletes a job it completed and keeps one that "
        "failed) and the task counted exactly as many executions, of as many distinct job "
        "ids, as jobs were enqueued. pgdrain's are checked as in the rest of this page.",
        "",
        "| system | setting | " + " | ".join(f"{p} proc." for p in procs) + " |",
        "|---|---|" + "---:|" * len(procs),
    ]
    gw = res.figures.get(f"{GRAPHILE}/graphile-worker/{procs[0]}")
    cells = [_cell(res, f"{GRAPHILE}/graphile-worker/{p}") for p in procs]
    lines.append(f"| graphile-worker {info['version']} | documented tuning | {' | '.join(cells)} |")
    modes = (("", "pgdrain", "batches"), (NOT_KEPT, "pgdrain, done not kept", "not_kept_batches"))
    for suffix, system, batches in modes:
        for b in info.get(batches, []):
            fig = res.figures.get(f"{GRAPHILE}/pgdrain/{b}/{procs[0]}{suffix}")
            conc = fig.params.get("concurrency", "?") if fig else "?"
            cells = [_cell(res, f"{GRAPHILE}/pgdrain/{b}/{p}{suffix}") for p in procs]
            lines.append(f"| {system} | batch {b}, concurrency {conc} | {' | '.join(cells)} |")
    for suffix, system, batches in modes:
        for b in info.get(batches, []):
            ratios = [
                _n(
                    paired_ratio(
                        res.figures.get(f"{GRAPHILE}/pgdrain/{b}/{p}{suffix}"),
                        res.figures.get(f"{GRAPHILE}/graphile-worker/{p}"),
                    ),
                    2,
                )
                for p in procs
            ]
            lines.append(f"| **{system} / graphile-worker** | batch {b} | {' | '.join(ratios)} |")
    lines.append("")
    for kept in (True, False):
        r = graphile_ratios(res, kept=kept)
        pg_cell, gw_cell = r["pgdrain_best_cell"], r["graphile_best_cell"]
        if not (pg_cell and gw_cell):
            continue
        mode = (
            ""
            if kept
            else " with done jobs not kept (`PGDRAIN_RETAIN_DONE=0`: a completion deletes the "
            "job, as graphile-worker's does)"
        )
        lines += [
            f"Best against best{mode}: pgdrain's best, {_n(r['pgdrain_best'])} jobs/s (batch "
            f"{pg_cell['batch']}, {_processes(pg_cell['processes'])}), is "
            f"**{_n(r['best'], 2)}x** graphile-worker's best, {_n(r['graphile_best'])} jobs/s "
            f"({_processes(gw_cell['processes'])}).",
            "",
        ]
    lines += [
        "The ratios per process count are the medians of each repetition's ratio. The target "
        f"(issue 43) is ≥ {GRAPHILE_RATIO}x, process for process and best against best.",
        "",
    ]
    if gw is not None and gw.values:
        pg = res.figures.get(f"{GRAPHILE}/pgdrain/{info['batches'][0]}/1")
        pg_rss = _n(pg.extra_median("rss_mb"), 1) if pg is not None and pg.values else "-"
        lines += [
            "One process each, drain process's CPU per 1,000 jobs and peak RSS: "
            f"graphile-worker {_n(gw.extra_median('cpu_s_per_1000_jobs'), 3)} s, "
            f"{_n(gw.extra_median('rss_mb'), 1)} MB (Node's maxRSS); pgdrain at batch "
            f"{info['batches'][0]} "
            f"{_n(pg.extra_median('cpu_s_per_1000_jobs'), 3) if pg is not None else '-'} s, "
            f"{pg_rss} MB.",
            "",
        ]
    for note in info.get("notes", []):
        lines += [str(note), ""]
    return lines


def profile_section(prof: dict[str, Any] | None) -> list[str]:
    """`## Where a drain's time goes`: written by `python -m bench.profile --write`."""
    if not prof:
        return []
    return [str(line) for line in prof["markdown"]] + [""]


def history_section(history: dict[str, Any] | None) -> list[str]:
    """`## Hot table and history`: bench/lifecycle.py and bench/ui_pages.py before and after
    migration 0018, stored as written (docs/decisions/0012)."""
    if not history:
        return []
    return [str(line) for line in history["markdown"]] + [""]


def lifecycle_section(life: dict[str, Any] | None) -> list[str]:
    """`## A snapshot held open`: recorded by `python -m bench.lifecycle --record`."""
    if not life:
        return []
    held, free = life["held"], life["free"]
    # Fresh runs after each round (--short-runs; runs recorded before it have none).
    fresh = bool(held.get("short_runs")) and bool(free.get("short_runs"))
    rows = [
        "| round | vacuum keeps up | snapshot held | held / keeps up "
        "| WAL B/job: keeps up, held | schema MiB: keeps up, held |"
        + (" fresh run, ms: keeps up, held | fresh run: held / keeps up |" if fresh else ""),
        "|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if fresh else ""),
    ]
    for n, (h, f) in enumerate(zip(held["rounds"], free["rounds"], strict=True), start=1):
        ratio = h["jobs_per_s"] / f["jobs_per_s"]
        rows.append(
            f"| {n} | {f['jobs_per_s']:,.0f} | {h['jobs_per_s']:,.0f} | {ratio:.2f} "
            f"| {f['wal_bytes_per_job']:,.0f}, {h['wal_bytes_per_job']:,.0f} "
            f"| {f['schema_mib']:,.1f}, {h['schema_mib']:,.1f} |"
            + (
                f" {f['short_run_ms']:,.1f}, {h['short_run_ms']:,.1f}"
                f" | {f['short_run_ms'] / h['short_run_ms']:.2f} |"
                if fresh
                else ""
            )
        )
    jobs = held["jobs"]
    short_flag = f" --short-runs {held['short_runs']}" if fresh else ""
    fresh_text = (
        f" *Fresh run*: after each round's vacuum, {held['short_runs']} runs one after another, "
        f"each of {held['short_jobs']} jobs enqueued then drained by a run of its own, as "
        "kicks start Lambda runs (the median run's milliseconds; held / keeps up is the rate, "
        "the keeps-up run's time over the held one's): a fresh run holds no position, so its "
        "claims start each queue from its floor (migration 0026; before it, from the queue's "
        "start)."
        if fresh
        else ""
    )
    return [
        "## A snapshot held open: rounds of enqueue, then drain",
        "",
        f"Measured at {life['commit']} on {life['date']} ({life['server']}; load "
        f"{life['load']}) by `python -m bench.lifecycle --held --rounds {len(held['rounds'])} "
        f"--jobs {jobs}{short_flag}` and the same without `--held`, one run each, recorded by "
        "`python -m bench.lifecycle --record` (the command and what it measures: the top of "
        f"`bench/lifecycle.py`). Each round enqueues {jobs:,} no-op jobs, drains them at the "
        "defaults (batch 10, concurrency 10, one process), then VACUUMs (autovacuum is off on "
        "this server). *Snapshot held*: a REPEATABLE READ transaction on another connection "
        "takes its snapshot before the first round and keeps it to the end (a report, a "
        "`pg_dump`, a forgotten session), so nothing drained after it can be vacuumed away; "
        "each claim starts each queue after the last job the run claimed there "
        "(docs/decisions/0011-claim-from-a-keyset-position.md). jobs/s per round; WAL per job "
        "drained (claim and complete); the pgdrain schema's tables and indexes after the "
        f"round's vacuum.{fresh_text} {life['note']}",
        "",
        *rows,
        "",
    ]


SCALE_TITLES = {"before": "Before the table split", "now": "Now"}


def scale_section(scale: dict[str, Any] | None) -> list[str]:
    """`## Flat at scale`: written by `python -m bench.scale --write --label LABEL`, one
    subsection per label (the schema before the table split, and now)."""
    if not scale:
        return []
    from bench.scale import GOAL, window_summary

    out = ["## Flat at scale: a long run and a long history, autovacuum on", ""]
    out.append(
        "By `python -m bench.scale` (`make bench-scale`; what it does and why each setting: "
        "the top of `bench/scale.py`), on a PostgreSQL server of its own started from the "
        "machine's binaries with a production queue's settings: autovacuum on (naptime 10 s, "
        "vacuum at 1% of a table changed, cost limit 2,000), shared_buffers 4 GiB, fsync and "
        "synchronous_commit on, pg_stat_statements loaded. *Throughput*: per window, that many "
        "no-op jobs enqueued, then drained at the defaults (batch 10, concurrency 10, one "
        "process) until none is left; jobs/s is the drain's, and finished jobs stay wherever "
        "the schema keeps them. *Blocks*: shared buffer blocks touched (hit or read) by the "
        "drain's statements, per job, and by the claim statement, per execution "
        "(pg_stat_statements): the work done, whatever else the machine runs. The "
        f"goal (issue 43): every window within {100 - GOAL * 100:.0f}% of the first. *Claim "
        "latency*: job_complete_and_claim at batch 10, one statement after another on one "
        "connection (synchronous_commit off there alone: the flush is the disk's, the same "
        "either way), timed from the client, in two databases in turns: one with no finished "
        "job, one with a history of finished jobs (one INSERT ... SELECT into the table that "
        "holds finished jobs, then VACUUM ANALYZE); then a drain of as many jobs in each at "
        "the defaults. The goal: the same latency with history as without. The machine is "
        "shared (2 cores, other sessions' tests running): the load is given per window, and "
        "(from 2026-12-06 on) the share of the CPU the virtual machine's host gave to other "
        "guests during the window's drain (steal time, /proc/stat), which the load does not "
        "show."
    )
    out.append("")
    for label in sorted(scale, key=lambda k: (k != "before", k)):
        result = scale[label]
        latency = result.get("latency")
        sizes = f"--jobs {result['jobs']} --window {result['window']}"
        if latency:
            sizes += f" --history {latency['history']['rows']} --claim-jobs {latency['claim_jobs']}"
        out.append(f"### {SCALE_TITLES.get(label, label)} (at {result['commit']})")
        out.append("")
        out.append(
            f"Measured at {result['commit']} on {result.get('date', '?')} "
            f"(PostgreSQL {result['server']}; load {result['load_before']} at the start, "
            f"{result['load_after']} at the end; {_n(result['seconds'] / 60, 1)} min in all) "
            f"by `python -m bench.scale {sizes} --write --label {label}`."
        )
        out.append("")
        if result.get("note"):
            out.append(str(result["note"]))
            out.append("")
        if "throughput" in result:
            windows = result["throughput"]["windows"]
            rates = [w["jobs_per_s"] for w in windows]
            summary = window_summary(rates)
            out.append(
                "| window | drained so far | jobs/s | blocks per job "
                "| claim: blocks | enqueued jobs/s | dead rows after | autovacuums so far "
                "| pgdrain schema MiB | load (1 min) | CPU stolen |"
            )
            out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for w in windows:
                out.append(
                    f"| {w['window']} | {w['drained_total']:,} | {_n(w['jobs_per_s'])} "
                    f"| {_n(w['blocks_per_job'], 1)} "
                    f"| {_n(w['claim_blocks'], 1)} | {_n(w['enqueue_per_s'])} "
                    f"| {w['dead_rows']:,} | {w['autovacuums']} | {_n(w['schema_mib'])} "
                    f"| {str(w.get('load', '?')).split(' / ')[0]} "
                    f"| {_share(w.get('stolen'))} |"
                )
            out.append("")
            verdict = "met" if summary["flat"] else "**not met**"
            out.append(
                f"Last window over the first: **{_n(summary['last_over_first'], 2)}**; slowest "
                f"over the first: **{_n(summary['min_over_first'], 2)}** (goal >= {GOAL}: "
                f"{verdict}); median of the last three windows over that of the first three "
                f"(less at the mercy of one noisy window): {_n(summary['tail_over_head'], 2)}."
            )
            out.append("")
        if latency:
            history = latency["history"]
            none = latency["none"]
            out.append(
                "| finished jobs in history | claim p50 ms | claim p99 ms | claim: blocks "
                "| drain jobs/s |"
            )
            out.append("|---|---:|---:|---:|---:|")
            for key, name in (
                ("none", "none"),
                (
                    "with_history",
                    f"{history['rows']:,} in pgdrain.{history['table']} "
                    f"({_n(history['table_mib'])} MiB)",
                ),
            ):
                f = latency[key]
                out.append(
                    f"| {name} | {_n(f['p50_ms'], 3)} | {_n(f['p99_ms'], 3)} "
                    f"| {_n(f['blocks_per_claim'], 1)} | {_n(f['drain_jobs_per_s'])} |"
                )
            out.append(
                f"| with history / none | **{_n(latency['p50_ratio'], 2)}** "
                f"| {_n(latency['p99_ratio'], 2)} | **{_n(latency['blocks_ratio'], 2)}** "
                f"| **{_n(latency['drain_ratio'], 2)}** |"
            )
            out.append("")
            out.append(
                f"{latency['claim_jobs']:,} jobs claimed in each database, in "
                f"{latency['rounds']} rounds taking turns ({none['claims']:,} statements "
                "timed in each); the ratios of p50 and of jobs/s are the median of the rounds' "
                "(each round's two figures measured next to each other), p99 is pooled. "
                f"The history took {_n(history['insert_s'])} s to insert and "
                f"{_n(history['vacuum_analyze_s'])} s to VACUUM ANALYZE."
            )
            out.append("")
    return out


def markdown(res: Results, png_name: str) -> str:
    cfg = res.config
    env = res.info["env"]
    best = res.info.get("best_batch", cfg.default_batch)
    procs = _process_counts(res)
    h = headline(res)
    lines: list[str] = []
    add = lines.append

    add("# Benchmarks")
    add("")
    # A run before 0037a1a did not checkpoint: its text does not say it did.
    checkpointed = (
        ", checkpointed before the run (so that writing out the copy does not share the disk "
        "with it)"
        if res.info.get("checkpoint_after_copy")
        else ""
    )
    add(
        "Written by `make bench` (`bench/run.py`); do not edit by hand. Every figure is the "
        f"median of {cfg.reps} repetitions, each on a fresh database copied from a template "
        "that already holds the schema and the pre-enqueued jobs (enqueueing is not timed)"
        f"{checkpointed}, and each checked afterwards from the database's own tables: "
        "pgdrain's rows must all be `done` with `attempts = 1`, PgQueuer's log must hold one "
        "`successful` row per job with its queue empty, Procrastinate's jobs must all be "
        "`succeeded` with one `started` event each; and the job functions' own execution "
        "counts must add up. A repetition that fails its check is not counted (the table says "
        "so where it happened)."
    )
    add("")
    add(
        f"**Headline:** with one process, pgdrain reaches **{_n(h['ratio_best'], 2)}x** of "
        f"its own SQL ceiling at its best batch size ({best}), "
        f"**{_n(h['ratio_default'], 2)}x** at its default ({cfg.default_batch})"
        + _strict_headline(res, h["ratio_strict"])
        + "; its best figure is "
        f"**{_n(_ratio(h['pgdrain_best'], h['pgqueuer_best']), 2)}x** PgQueuer's best in the "
        "same run." + _cost_headline(res)
    )
    add("")
    add("## Setup")
    add("")
    add(f"- Date: {env['date']}; the whole run took {res.info.get('elapsed_s', 0):.0f} s.")
    add(f"- Server: {env['server']}, default settings; {env['pgbench']}.")
    add(f"- Machine: {env['machine']}, Python {env['python']}, psycopg {env['psycopg']}.")
    add(f"- pgdrain {env['pgdrain']}.")
    if "peer_versions" in res.info:
        v = res.info["peer_versions"]
        add(
            f"- Peers: PgQueuer {v['pgqueuer']} (asyncpg {v['asyncpg']}, psycopg {v['psycopg']}),"
            f" Procrastinate {v['procrastinate']} (psycopg-pool {v['psycopg-pool']})."
        )
    add(
        f"- Load average (1/5/15 min) at the start {env['load_start']}, at the end "
        f"{env.get('load_end', '?')}{_stolen(env)}. The machine is shared with other work "
        "(test suites of other sessions run at the same time), so absolute figures are noisy: "
        "compare the "
        "ratios, which come from interleaved repetitions of the same run."
    )
    add("")
    add("## Drain throughput")
    add("")
    add(
        f"No-op jobs, {cfg.jobs:,} pre-enqueued for pgdrain, its ceiling and PgQueuer; "
        f"{cfg.procrastinate_jobs:,} for Procrastinate (it is two orders of magnitude slower, "
        "and 20,000 would take minutes). jobs/s = jobs / (last process's end - first "
        "process's start); processes are started, and import, before the clock starts."
    )
    add("")
    header = "| system | setting | " + " | ".join(f"{p} proc." for p in procs) + " |"
    add(header)
    add("|---|---|" + "---:|" * len(procs))
    for row in rows(res):
        cells = [_cell(res, row["key"].format(p=p)) for p in procs]
        add(f"| {row['system']} | {row['setting']} | " + " | ".join(cells) + " |")
    for batch in sorted({cfg.default_batch, best}):
        ratios = [_n(_pair(res, batch, p), 2) for p in procs]
        add(f"| **pgdrain / ceiling** | batch {batch} | " + " | ".join(ratios) + " |")
    add("")
    add(f"![jobs/s against drain processes]({png_name})")
    add("")
    bound = _best_against_best_bound(res)
    if bound:
        add(bound)
        add("")
    add("### pgdrain against its ceiling, by batch size (one process, one pgbench client)")
    add("")
    add(
        "| batch | concurrency | pgdrain jobs/s | ceiling jobs/s | pgdrain / ceiling "
        "| drain peak RSS (MB) | drain CPU s per 1,000 jobs |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|")
    by_batch = [(b, "pgdrain", "ceiling") for b in cfg.batches]
    if _has_strict(res):
        by_batch.append((cfg.strict_batch, STRICT, STRICT_CEILING))
    for b, kind, ceiling in sorted(by_batch, key=lambda cell: (cell[0], cell[1] != STRICT)):
        pg = res.figures.get(f"{kind}/{b}/1")
        rss = pg.extra_median("rss_mb") if pg else float("nan")
        cpu = pg.extra_median("cpu_s_per_1000_jobs") if pg else float("nan")
        conc = pg.params.get("concurrency", "?") if pg else "?"
        add(
            f"| {b} | {conc} | {_cell(res, f'{kind}/{b}/1')} | {_cell(res, f'{ceiling}/{b}/1')} "
            f"| {_n(_pair(res, b, 1, kind, ceiling), 2)} | {_n(rss, 1)} | {_n(cpu, 3)} |"
        )
    add("")
    add(
        "pgdrain claims for its free worker threads and, when jobs are shorter than a "
        "claim's round trip, for those about to free (prefetch: the jobs wait in the pool "
        "and start as a thread frees, while the next claim is on the wire). So each batch "
        "size other than the default runs with as many threads as jobs per claim, up to "
        f"{cfg.max_concurrency}: batches larger than that are claimed whole ahead of the "
        "threads. The drain's CPU is every thread's "
        "user + system time (getrusage around the drain, as `bench/profile.py` reads it). "
        "The ceiling's pgbench runs with the planner settings the drain's connection keeps "
        "(`bench/ceiling.py` PGOPTIONS: no JIT, no explicit sort where an index gives the "
        "order, plan_cache_mode at force_generic_plan). Both claim on a generic plan, planned "
        "once: the drain's connection keeps it (hot_path.sql, session_limits), and pgbench's "
        "cycle is prepared once per client (How the ceiling is measured, below)."
    )
    if _has_strict(res):
        add("")
        add(
            f"Batch {cfg.strict_batch}, concurrency {cfg.strict_concurrency} is the setting "
            "for strict ordering: one job claimed and run at a time, in the queue's order "
            "(priority, run_at, id), against a ceiling of one pgbench client claiming "
            f"{cfg.strict_batch} job per statement; measured in the same repetitions as the "
            "other batch sizes."
        )
    add("")
    ceilings = {b: _value(res, f"ceiling/{b}/1") for b in cfg.batches}
    known = {b: v for b, v in ceilings.items() if not math.isnan(v)}
    if known:
        top = max(known, key=lambda b: known[b])
        if top != max(known):
            add(
                f"The ceiling is highest at batch {top}, not at the largest batch: the "
                "statement's own cost per job grows past that size (its plan changes), for "
                "pgbench as for pgdrain."
            )
            add("")
    if "pgqueuer_best_batch" in res.info:
        add("### Peers' settings tried (one process)")
        add("")
        add("| peer | setting | jobs/s |")
        add("|---|---|---:|")
        for key, fig in res.figures.items():
            if key.startswith("pgqueuer-asyncpg/") and key.endswith("/1"):
                add(
                    f"| PgQueuer (asyncpg) | batch_size {fig.params['batch']} | {_cell(res, key)} |"
                )
            if key.startswith("procrastinate/") and key.endswith("/1"):
                add(
                    f"| Procrastinate | concurrency {fig.params['concurrency']} | "
                    f"{_cell(res, key)} |"
                )
        add("")

    add("## Targets and other figures")
    add("")
    empty = res.figures.get("empty")
    imp = res.figures.get("import")
    enq = res.figures.get("enqueue")
    xacts = float("nan")
    if empty is not None:
        xacts = empty.extra_median("empty_xacts") - empty.extra_median("connect_xacts")
    add("| what | figure | target | |")
    add("|---|---:|---:|---|")
    targets: list[tuple[str, str, str, bool | None]] = []
    targets.append(
        (
            "pgdrain / ceiling, one process, best batch",
            _n(h["ratio_best"], 2),
            f"≥ {CEILING_RATIO}",
            None if math.isnan(h["ratio_best"]) else h["ratio_best"] >= CEILING_RATIO,
        )
    )
    targets.append(
        (
            "pgdrain / ceiling, one process, default batch",
            _n(h["ratio_default"], 2),
            f"≥ {CEILING_RATIO}",
            None if math.isnan(h["ratio_default"]) else h["ratio_default"] >= CEILING_RATIO,
        )
    )
    # Batch 250: the second one-process target.
    target_batch = cfg.target_batch
    if target_batch != cfg.default_batch and target_batch in cfg.batches:
        ratio_target = _pair(res, target_batch, 1)
        targets.append(
            (
                f"pgdrain / ceiling, one process, batch {target_batch}",
                _n(ratio_target, 2),
                f"≥ {CEILING_RATIO}",
                None if math.isnan(ratio_target) else ratio_target >= CEILING_RATIO,
            )
        )
    strict = h["ratio_strict"]
    if _has_strict(res):
        targets.append(
            (
                f"batch {cfg.strict_batch}, concurrency {cfg.strict_concurrency}: "
                "pgdrain / ceiling",
                _n(strict, 2),
                f"≥ {CEILING_RATIO}",
                None if math.isnan(strict) else strict >= CEILING_RATIO,
            )
        )
    peer = _ratio(h["pgdrain_best"], h["pgqueuer_best"])
    targets.append(
        (
            "pgdrain best / PgQueuer best (jobs/s)",
            f"{_n(peer, 2)} ({_n(h['pgdrain_best'])} / {_n(h['pgqueuer_best'])})",
            f"≥ {PEER_RATIO}",
            None if math.isnan(peer) else peer >= PEER_RATIO,
        )
    )
    per = _ratio(h["pgdrain_one"], h["pgqueuer_one"])
    targets.append(
        (
            "per process: pgdrain / PgQueuer, one process each",
            f"{_n(per, 2)} ({_n(h['pgdrain_one'])} / {_n(h['pgqueuer_one'])})",
            f"≥ {PEER_RATIO}",  # issue 15: 2x, per process and overall
            None if math.isnan(per) else per >= PEER_RATIO,
        )
    )
    if empty is not None:
        targets.append(
            (
                "empty scheduled run: round trips after connect",
                _n(empty.value),
                f"≤ {ROUND_TRIPS}",
                empty.value <= ROUND_TRIPS,
            )
        )
        targets.append(
            (
                "empty scheduled run: server transactions after connect "
                "(Δ pg_stat_database.xact_commit, less a bare connect's)",
                _n(xacts),
                "",
                None,
            )
        )
        targets.append(
            (
                "empty scheduled run: wall ms with the connect / without",
                f"{_n(empty.extra_median('total_ms'), 1)} / {_n(empty.extra_median('run_ms'), 1)}",
                "",
                None,
            )
        )
    if imp is not None:
        label = res.info.get("import_module", "app")
        note = "" if label == "app" else " (handler/app.py did not exist yet)"
        targets.append(
            (
                f"cold start: `import {label}`{note}, wall ms (CPU ms; whole fresh process ms)",
                f"{_n(imp.value)} ({_n(imp.extra_median('cpu_ms'))}; "
                f"{_n(imp.extra_median('process_ms'))})",
                f"≤ {IMPORT_MS:.0f}",
                imp.value <= IMPORT_MS,
            )
        )
        if imp.extra.get("dependencies_ms"):
            packages = ", ".join(res.info.get("import_dependencies", []))
            targets.append(
                (
                    f"of which the installed packages alone ({packages}): the same modules "
                    "imported without pgdrain's, wall ms",
                    _n(imp.extra_median("dependencies_ms")),
                    "",
                    None,
                )
            )
    deployed = res.figures.get("import_deployed")
    if deployed is not None and deployed.values:
        targets.append(
            (
                "cold start as deployed: `import app` from the function's package, wall ms: "
                "sources only (`sam build`) / with their bytecode (`make sam`)",
                f"{_n(deployed.extra_median('sources_ms'))} / {_n(deployed.value)}",
                "",
                None,
            )
        )
    if enq is not None and enq.values:
        targets.append(
            (
                f"enqueue_many of {enq.params['jobs']:,} jobs, jobs/s "
                "(with build_job's validation)",
                f"{_n(enq.value)} ({_n(enq.extra_median('with_build_jobs_per_s'))})",
                f"≥ {ENQUEUE_PER_S:,.0f}",
                enq.value >= ENQUEUE_PER_S,
            )
        )
    # At the default batch, at batch 250 (the target's) and at the best batch, if another.
    rss_batches = sorted({cfg.default_batch, cfg.target_batch, best})
    rss_figs = [res.figures.get(f"pgdrain/{b}/1") for b in rss_batches]
    if all(f is not None and f.values for f in rss_figs):
        rss_each = [f.extra_median("rss_mb") for f in rss_figs if f is not None]
        named = " / ".join(
            ("default " if b == cfg.default_batch else "best " if b == best else "") + f"batch {b}"
            for b in rss_batches
        )
        targets.append(
            (
                f"peak RSS of the {cfg.jobs:,}-job drain process, MB: {named}",
                " / ".join(_n(r, 1) for r in rss_each),
                f"≤ {RSS_MB:.0f}",
                max(rss_each) <= RSS_MB,
            )
        )
    targets += graphile_targets(res)
    for what, figure, target, ok in targets:
        add(f"| {what} | {figure} | {target} | {_met(ok) if target else ''} |")
    add("")
    if empty is not None:
        via = res.info.get("empty_via", "drain")
        how = (
            "`lambda_handler` of handler/app.py, given an EventBridge Scheduler event"
            if via == "handler"
            else "`pgdrain.drain` with default settings (handler/app.py did not exist yet)"
        )
        add(
            f"The empty run is {how}, on a migrated, empty database. Its round trips are "
            "counted from libpq's protocol trace after the connection is made: each "
            "ReadyForQuery the server sends closes one request/response exchange (median "
            "statements executed: "
            f"{_n(empty.extra_median('statements'))}). Its server transactions are the "
            "growth of `pg_stat_database.xact_commit` for its database, read from another "
            "database once its backend has exited, less that of a bare connect and close "
            f"({_n(empty.extra_median('connect_xacts'))}). The peak RSS is the drain "
            "process's VmHWM (getrusage's ru_maxrss would report the parent's peak: it "
            "survives exec). The import is timed in a fresh interpreter after one untimed "
            "run that compiles and caches the bytecode (whatever PYTHONDONTWRITEBYTECODE "
            "says). *The installed packages alone*: in a fresh interpreter after each timed "
            "`import app`, the modules it loaded from installed packages (not the standard "
            "library's, not handler/'s), imported in the order it loaded them; `import app` "
            "less that is what pgdrain's own modules cost, with the standard-library modules "
            "only they use. *As deployed*: the packages `import app` loads from outside the "
            "standard library (pgdrain's, psycopg's, Powertools'...) copied into one "
            "directory as `sam build` ships them, sources only, and imported from it alone "
            "(`python -S`, no bytecode written: a function's /var/task is read-only, so it "
            "compiles every module at every cold start); then again once `make sam`'s step "
            "has compiled them (compileall, unchecked-hash)."
        )
        add("")
    lines += cost_section(res, cost_png(Path(png_name)).name)
    lines += graphile_section(res)
    lines += bigtable_section(res.info.get("bigtable"))
    lines += flow_section(res.info.get("flow"))
    lines += profile_section(res.info.get("profile"))
    lines += history_section(res.info.get("history"))
    lines += queue_flow_section(res.info.get("queue_flow"))
    lines += lifecycle_section(res.info.get("lifecycle"))
    lines += scale_section(res.info.get("scale"))
    add("## How the ceiling is measured")
    add("")
    shape = res.info.get("ceiling_shape", "")
    add(
        "pgbench runs the statements pgdrain's drain runs per batch, their text read from "
        "`handler/pgdrain/db/sql/hot_path.sql` at run time: numbers and arrays as pgbench "
        "variables, the queue and worker names as literals, and the statement's own result "
        "kept whole as a last CTE. The statement is prepared on the server once per client "
        "(`PREPARE`, on its generic plan, as the drain's connection keeps it) and executed "
        "with each variable once, as psycopg binds each named parameter once (pgbench's "
        "`-M prepared` binds every occurrence of a variable as a parameter of its own, in "
        "text: an array the statement names three times was parsed three times, and the "
        "ceiling at batch 250 read 5-8% low for it). The claimed ids "
        "and tokens are folded with `array_agg` and carried by `\\gset` to the statement that "
        "completes them, so every completion is fenced by exactly what a claim returned, in a "
        "later statement and round trip. jobs/s = jobs / (transactions / tps)."
    )
    add("")
    if shape:
        add(
            "The drain's hot path is one statement per batch, `job_complete_and_claim`: it "
            "completes the batch the run finished and claims the next, in one round trip and "
            "one commit. So does each pgbench transaction: pgbench variables outlive a "
            "transaction, so the ids and tokens one transaction claims are the ones the next "
            "completes. The first completes nothing (`-D ids={}`); a counter gives each "
            "client its share of the claims, and one last transaction per client claims "
            "nothing (limit 0) and completes that client's last batch."
        )
    add("")
    args = res.info.get("ceiling_arguments", {}).get(best, "")
    add(
        f"The script, and the options for batch {best} and one client (the `{shape}` "
        "shape). To see where a drain process spends its time: `.venv-bench/bin/python -m "
        f"bench.profile --batch {best} --concurrency {best}` (cProfile and py-spy)."
    )
    add("")
    add("```")
    add(f"pgbench {args} --file=ceiling.sql DBNAME")
    add("```")
    add("")
    add("```sql")
    add(str(res.info.get("ceiling_script", "")).rstrip())
    add("```")
    add("")
    add("## Every repetition")
    add("")
    add("<details><summary>raw values</summary>")
    add("")
    add("| figure | parameters | values | rejected |")
    add("|---|---|---|---:|")
    for fig in res.figures.values():
        params = ", ".join(f"{k}={v}" for k, v in fig.params.items())
        vals = ", ".join(_n(v, 1) for v in fig.values)
        add(f"| {fig.name} | {params} | {vals} | {fig.rejected} |")
    add("")
    add("</details>")
    add("")
    add("## Reproduce")
    add("")
    add(
        "`make bench` (against `DATABASE_URL` if set, else an embedded PostgreSQL; it "
        "creates `.venv-bench` with the peers first). `.venv-bench/bin/python -m bench.run "
        "--help` for the options; `.venv-bench/bin/python -m bench.run --only bigtable` "
        "runs the big-table section alone and merges it into this file (`--only graphile` "
        "likewise, graphile-worker beside pgdrain, with `--jobs` and `--reps`; its Node "
        "packages: `npm ci` in `bench/graphile`, which `make bench` runs); `--render "
        "docs/benchmarks.json` rewrites this file and its plots from the saved figures "
        "without measuring. One tool that is not part of it: `.venv-bench/bin/python -m "
        "bench.profile --write` (where a drain's time goes, at the default settings or "
        "`--batch N --concurrency N`)."
    )
    add("")
    notes = res.info.get("notes", [])
    if notes:
        add("## Notes")
        add("")
        for note in notes:
            add(f"- {note}")
        add("")
    return "\n".join(lines)
