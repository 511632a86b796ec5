"""What draining jobs costs on AWS Lambda: pgdrain against SQS + Lambda. Pure arithmetic over
the figures `make bench` measures (bench/report.py passes them in) and AWS's published prices.

pgdrain: the jobs are drained by runs of the function's timeout, each running `concurrency`
jobs at once in threads, so a job of d seconds occupies the run for d / concurrency, and never
less than what the drain itself spends per job. What it spends is measured on the benchmark's
machine; a function below 1,769 MB has only that share of a vCPU, so the drain's CPU part of
it is stretched by that share (its Python and its statements alternate, they do not overlap:
bench/profile.py). Each run adds a fixed overhead (connect, the end-of-run statements).

SQS + Lambda: messages are sent 10 to a SendMessageBatch; the event source mapping receives 10
per ReceiveMessage, hands them to one invocation, and deletes them with one DeleteMessageBatch.
The invocation handles its 10 messages one after the other, plus a fixed overhead, and is
billed rounded up to the millisecond.

Neither side counts the free tier, the database (pgdrain uses the PostgreSQL the jobs' data
already lives in), data transfer, nor the runs that find nothing to do."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

# AWS's published prices (us-east-1, the first tier of each).
GB_SECOND = 0.0000133334  # Lambda duration, arm64, $ per GB-second
LAMBDA_REQUEST = 0.20 / 1_000_000  # $ per invocation
SQS_REQUEST = 0.40 / 1_000_000  # standard queue, $ per request of up to 10 messages, 64 KB
# Lambda's documentation: "at 1,769 MB, a function has the equivalent of one vCPU".
ONE_VCPU_MB = 1769
SQS_BATCH = 10  # the most one SQS batch request (and the event source mapping's default) carries
BILLING_S = 0.001  # Lambda bills each invocation's duration rounded up to the millisecond
# An SQS-fed invocation's own work besides its messages: no connect, nothing to claim, so the
# least Lambda bills (one billing unit) is the honest floor, and it favours SQS.
SQS_INVOCATION_OVERHEAD_S = BILLING_S


@dataclass(frozen=True)
class Function:
    """The Lambda function both systems run as."""

    memory_mb: int
    timeout_s: float

    @property
    def gb(self) -> float:
        return self.memory_mb / 1024.0  # AWS bills 512 MB as 0.5 GB

    @property
    def vcpu(self) -> float:
        # A drain runs Python under one GIL: a second vCPU above 1,769 MB would not speed it.
        return min(1.0, self.memory_mb / ONE_VCPU_MB)


@dataclass(frozen=True)
class Drain:
    """pgdrain as measured: no-op jobs at one setting, one process."""

    wall_s_per_job: float
    cpu_s_per_job: float
    concurrency: int
    run_overhead_s: float  # one run's fixed cost: its connect and its last statements


@dataclass(frozen=True)
class Cost:
    """Dollars for one workload."""

    invocations: int
    billed_s: float  # Lambda duration billed, seconds
    lambda_requests: float
    duration: float
    sqs_requests: float = 0.0

    @property
    def total(self) -> float:
        return self.lambda_requests + self.duration + self.sqs_requests


def _billed(seconds: float) -> float:
    """One invocation's duration as Lambda bills it. The small epsilon keeps an exact number
    of milliseconds computed in floating point (10 x 0.001 + 0.001) from rounding up once more."""
    return math.ceil(seconds / BILLING_S - 1e-9) * BILLING_S


def pgdrain_seconds_per_job(drain: Drain, fn: Function, job_s: float) -> float:
    """How long one job keeps a pgdrain run busy."""
    on_lambda = drain.wall_s_per_job + drain.cpu_s_per_job * (1.0 / fn.vcpu - 1.0)
    return max(on_lambda, job_s / drain.concurrency)


def pgdrain_cost(jobs: int, job_s: float, drain: Drain, fn: Function) -> Cost:
    """`jobs` jobs of `job_s` seconds each (I/O: waiting, not CPU), drained by pgdrain."""
    work_s = jobs * pgdrain_seconds_per_job(drain, fn, job_s)
    runs = max(1, math.ceil(work_s / fn.timeout_s))
    billed = work_s + runs * drain.run_overhead_s  # rounding to the ms is nothing over minutes
    return Cost(
        invocations=runs,
        billed_s=billed,
        lambda_requests=runs * LAMBDA_REQUEST,
        duration=billed * fn.gb * GB_SECOND,
    )


def sqs_cost(
    jobs: int, job_s: float, fn: Function, overhead_s: float = SQS_INVOCATION_OVERHEAD_S
) -> Cost:
    """The same jobs through an SQS standard queue and a Lambda event source mapping."""
    full, rest = divmod(jobs, SQS_BATCH)
    batches = full + (1 if rest else 0)
    billed = full * _billed(SQS_BATCH * job_s + overhead_s)
    if rest:
        billed += _billed(rest * job_s + overhead_s)
    return Cost(
        invocations=batches,
        billed_s=billed,
        lambda_requests=batches * LAMBDA_REQUEST,
        duration=billed * fn.gb * GB_SECOND,
        sqs_requests=3 * batches * SQS_REQUEST,  # send, receive, delete: one each per batch
    )


# -- which memory size: jobs per GB-second --------------------------------------------------

# Lambda's documentation: up to 10,240 MB, which has 6 vCPUs; vCPUs grow with memory.
MAX_MEMORY_MB = 10_240
MAX_VCPUS = 6.0
MEMORY_SIZES_MB = (256, 512, 1024, 1769, 3538, 5307, 10_240)


@dataclass(frozen=True)
class JobShape:
    """What one job does besides the drain's own work: computes (holding the GIL) and waits."""

    name: str
    cpu_s: float
    wait_s: float


JOB_SHAPES = (
    JobShape("no-op", 0.0, 0.0),
    JobShape("CPU-bound: 10 ms of CPU", 0.010, 0.0),
    JobShape("I/O-bound: 100 ms waiting", 0.0, 0.100),
)


def vcpus(memory_mb: int) -> float:
    return min(MAX_VCPUS, memory_mb / ONE_VCPU_MB)


def seconds_per_job(drain: Drain, memory_mb: int, job: JobShape, processes: int = 1) -> float:
    """How long one job keeps one of `processes` drain processes of one invocation busy. Each
    runs its jobs on threads under one GIL, so it uses at most one vCPU, and the processes
    share the function's: the drain's CPU and the job's are stretched by that share. The
    waiting part of the drain's measured time per job (its round trips) does not stretch, and
    the job's own wait overlaps across the `concurrency` threads."""
    share = min(1.0, vcpus(memory_mb) / processes)
    cpu = drain.cpu_s_per_job + job.cpu_s
    serial = drain.wall_s_per_job - drain.cpu_s_per_job + cpu / share
    overlapped = (job.wait_s + job.cpu_s / share) / drain.concurrency
    return max(serial, overlapped)


def jobs_per_gb_second(drain: Drain, memory_mb: int, job: JobShape, processes: int = 1) -> float:
    """Jobs one invocation of `memory_mb` drains per GB-second it is billed, with `processes`
    drain processes in it (the database assumed not to be the limit)."""
    per_second = processes / seconds_per_job(drain, memory_mb, job, processes)
    return per_second / (memory_mb / 1024.0)


def processes_for(memory_mb: int) -> int:
    """One drain process per whole vCPU the function has (at least one)."""
    return max(1, int(vcpus(memory_mb)))


def _parameter_default(text: str, name: str) -> str:
    """A CloudFormation parameter's Default, read as text: bench's virtualenv has no YAML
    parser, and the template's tags (!Ref, !Sub) would need a loader of their own."""
    block = re.search(rf"^  {name}:\n((?:    .*\n|\s*\n)*)", text, re.M)
    default = re.search(r"^    Default: *\"?([^\"\n]+)\"?", block.group(1), re.M) if block else None
    if default is None:
        raise ValueError(f"template.yaml has no Default for the parameter {name}")
    return default.group(1).strip()


def template_function(path: Path) -> Function:
    """The deployed function's defaults: the template's MemorySize and Timeout parameters."""
    text = path.read_text()
    return Function(
        memory_mb=int(_parameter_default(text, "MemorySize")),
        timeout_s=float(_parameter_default(text, "Timeout")),
    )
