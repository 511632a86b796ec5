"""Put numbers on the profile's proposals, in one interleaved run against one server:
`python -m bench.proposals` (in .venv-bench; not part of `make bench`).

Cells, each at batch 100 and 250, with 1 and 2 processes: pgdrain as it is; its SQL ceiling;
bench/prototype.py (leaner Python loop, same statement); the ceiling and the prototype with
the claim reaching its rows by primary key; and PgQueuer (asyncpg, batch_size 250) for
scale. Prints a table of medians and same-repetition ratios."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench import run
from bench.common import Figure, Server, paired_ratio, resolve_server
from bench.run import Config, Results, Step

CELLS = (
    ("pgdrain", run.rep_pgdrain, False),
    ("ceiling", run.rep_ceiling, False),
    ("prototype", run.rep_prototype, False),
    ("ceiling", run.rep_ceiling, True),
    ("prototype", run.rep_prototype, True),
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.proposals", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[100, 250])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = Config(reps=args.reps)
    res = Results(cfg)
    admin, _ = resolve_server()
    server = Server(admin)
    try:
        tpl = run.pgdrain_template(server, cfg.jobs)
        pq_tpl = run.pgqueuer_template(server, cfg.pgqueuer_jobs)
        steps: list[Step] = []
        for batch in args.batches:
            for procs in args.processes:
                for kind, rep, by_pk in CELLS:
                    key = f"{kind}{'+pk' if by_pk else ''}/{batch}/{procs}"
                    fig = res.figure(
                        key,
                        kind,
                        batch=batch,
                        processes=procs,
                        concurrency=run.concurrency_for(cfg, batch),
                        claim_by_pk=by_pk,
                    )
                    steps.append(lambda rep=rep, fig=fig: rep(server, tpl, fig, cfg))
        for procs in args.processes:
            fig = res.figure(
                f"pgqueuer/{procs}", "PgQueuer", batch=250, processes=procs, driver="asyncpg"
            )
            steps.append(lambda fig=fig: run.rep_pgqueuer(server, pq_tpl, fig, cfg))
        run.interleaved(cfg.reps, steps)
    finally:
        server.drop_all()

    def get(key: str) -> Figure | None:
        return res.figures.get(key)

    print(
        "| batch | proc. | pgdrain | ceiling | prototype | ceiling, claim by PK "
        "| prototype, claim by PK | pgdrain/ceiling | prototype/ceiling "
        "| prototype+PK/ceiling+PK | prototype+PK/pgdrain |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        for procs in args.processes:
            k = {
                n: get(f"{n}/{batch}/{procs}")
                for n in ("pgdrain", "ceiling", "prototype", "ceiling+pk", "prototype+pk")
            }
            values = [f"{f.value:,.0f}" if f and f.values else "-" for f in k.values()]
            ratios = [
                paired_ratio(k["pgdrain"], k["ceiling"]),
                paired_ratio(k["prototype"], k["ceiling"]),
                paired_ratio(k["prototype+pk"], k["ceiling+pk"]),
                paired_ratio(k["prototype+pk"], k["pgdrain"]),
            ]
            print(
                f"| {batch} | {procs} | "
                + " | ".join(values)
                + " | "
                + " | ".join(f"{r:.2f}" for r in ratios)
                + " |"
            )
    for procs in args.processes:
        fig = get(f"pgqueuer/{procs}")
        if fig is not None and fig.values:
            print(f"PgQueuer (asyncpg, batch_size 250), {procs} proc.: {fig.value:,.0f} jobs/s")


if __name__ == "__main__":
    main()
