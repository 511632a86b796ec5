"""Where a drain's time goes: `python -m bench.profile [--batch N] [--jobs N]`.

Drains pre-enqueued no-op jobs in one worker process under py-spy and prints the functions
with the most samples, by self time (the frame on top of the stack) and inclusive (anywhere
on the stack), each as a share of the samples taken after the imports. By default only the
thread holding the GIL is sampled: that is the CPU a Python drain process has to spend, and
waiting on the socket or on a queue does not count. Not part of `make bench`; run it with
.venv-bench's Python (py-spy is installed there)."""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench import run
from bench.common import Server, log, resolve_server, run_workers


def summarise(raw: Path, top: int) -> str:
    """Top functions of a py-spy raw (collapsed stacks) file."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    per_thread: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = ""
        if frames and frames[0].startswith("thread ("):
            thread, frames = frames[0].split(")")[0] + ")", frames[1:]
        if not frames or any("importlib._bootstrap" in f for f in frames):
            continue  # imports happen before the clock starts
        if thread:
            per_thread[thread] += count
        total += count
        names = [_short(f) for f in frames]
        own[names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    out = [f"{total} non-idle samples"]
    if per_thread:
        out.append("by thread: " + ", ".join(f"{t} {n / total:.0%}" for t, n in per_thread.items()))
    out.append("")
    out.append("self time:")
    out += [f"  {n / total:6.1%}  {name}" for name, n in own.most_common(top)]
    out.append("")
    out.append("inclusive:")
    out += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(out)


def _short(frame: str) -> str:
    """`fn (path/to/module.py:123)` -> `fn (module.py)`: one entry per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--prototype", action="store_true", help="profile bench/prototype.py")
    parser.add_argument(
        "--all-threads",
        action="store_true",
        help="sample every non-idle thread, not only the one holding the GIL",
    )
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's raw output here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    admin, _ = resolve_server()
    server = Server(admin)
    raw = args.raw or Path(tempfile.mkstemp(prefix="pgdrain-profile-", suffix=".txt")[1])
    try:
        template = run.pgdrain_template(server, args.jobs)
        kind = "prototype" if args.prototype else "pgdrain"
        with server.fresh(template) as url:
            prefix = [spy, "record", "--format", "raw", "--threads", "--rate", str(args.rate)]
            prefix += [] if args.all_threads else ["--gil"]
            prefix += ["--output", str(raw), "--"]
            conc = run.concurrency_for(run.Config(), args.batch)
            argv = [kind, "--url", url, "--batch", str(args.batch), "--concurrency", str(conc)]
            wall, _results = run_workers(1, argv, prefix=prefix)
            ok, detail = run.verify_pgdrain(url, args.jobs)
        log(
            f"{kind} batch {args.batch}, concurrency {conc}: {args.jobs / wall:,.0f} jobs/s "
            f"under py-spy ({detail})"
        )
        if not ok:
            raise SystemExit("the profiled drain did not process every job once")
        print(summarise(raw, args.top))
    finally:
        server.drop_all()
        if args.raw is None:
            raw.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
