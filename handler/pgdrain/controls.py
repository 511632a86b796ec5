"""Every safety mechanism and optimisation of a run, as one switch each: not part of the API.

Every real run uses ALL_ON and passes nothing. A test turns one switch off to show the failure
its mechanism prevents, beside the test that shows it working; a benchmark turns an
optimisation off to measure what it buys. Both inject a `Controls` where a run is built
(`pgdrain.runner.drain.drain_with`, `Session(controls=...)`, `retention.run_once`,
`Worker(controls=...)`), as River
keeps its test hooks in `*TestSignals` structs the product path never sets."""

from __future__ import annotations

from typing import NamedTuple


class Controls(NamedTuple):
    """Each mechanism, on unless a test or a benchmark switches it off."""

    # Safety: each has a failing-control test (docs/reliability.md).
    heartbeat: bool = True
    # Fan-out invokes the Lambda API from a thread of its own (aws/fanout.py), not from the
    # run's, which keeps the leases alive: a slow invoke takes seconds.
    invoke_off_the_run_thread: bool = True
    cap_lease_at_deadline: bool = True
    limit_statements_to_budget: bool = True  # statement_timeout/lock_timeout per transaction
    # A transaction cancelled at its BEGIN or limits (the role's own statement_timeout, before
    # the run's limits take effect) is sent again (db/session.py).
    resend_a_transaction_cut_at_its_limits: bool = True
    # A statement PostgreSQL ended to break a deadlock (an application's transaction locking
    # the same sequence keys in the other order) is sent again: it rolled back whole
    # (db/session.py). Without it the run ends and the jobs it finished run again.
    resend_a_deadlocked_statement: bool = True
    pin_read_committed: bool = True
    mark_abandoned_lost: bool = True  # a job the run gives up on sees lease_lost() at once
    # A job sees lease_lost() while the run's lease may have run out unrenewed (a heartbeat's
    # reply later than a lease: a pooler's queue, a stalled server), not only once found gone.
    tell_jobs_of_a_lapsed_lease: bool = True
    recover_lost_replies: bool = True  # a claim retried after a reconnect asks what it took
    reconnect_within_leases: bool = True  # a reconnect gives up before the leases it holds end
    # A stop (SIGTERM, SIGINT) gives back the attempts it cuts short, of jobs whose policy is
    # auto (runner/heartbeat.py): without it each stop spends one, and a job failed for good.
    give_back_attempts_a_stop_cuts_short: bool = True
    # Jobs prefetched and still waiting for a thread are taken back when the run releases what
    # has not started (a stop, the reserve) or ends: never started after that.
    take_back_waiting_jobs: bool = True
    # A pipelined claim holds the slots of all it may bring until it is read.
    count_claims_on_the_wire: bool = True
    # While claims are pipelined, the limits a connection keeps are half what is left: a claim
    # starts as the one before it ends, and both must end by the final margin.
    halve_limits_when_pipelining: bool = True
    # At concurrency 1 the job runs on the loop's thread: when the run ended while that job
    # ran, the thread ends as the job returns, touching nothing of the run.
    end_the_loop_thread_with_the_run: bool = True
    # `pgdrain worker` LISTENs for kicks (runner/worker.py): without it, a kick wakes nothing
    # and the job waits for the worker's next wake-up (a due time, the safety net).
    listen_for_kicks: bool = True
    # A signal the system hands to another thread than the main one (allowed off Linux: any
    # thread that does not block it) ends the worker's idle wait, through the wake pipe
    # (signal.set_wakeup_fd). Without it the stop waits for the wait's end: up to the safety net.
    wake_the_wait_on_a_signal_to_any_thread: bool = True

    # Each invocation registers in pgdrain.runs under an id of its own, and a fan-out run takes
    # up its reservation once: a copy of its event (async delivery is at least once) neither
    # ends the first copy's registration nor drains beyond PGDRAIN_MAX_RUNS (aws/control.py).
    register_each_invocation: bool = True
    # A run enqueues, and wakes up for, only the periodic kinds of the queues it drains.
    periodics_of_drained_queues: bool = True
    # A periodic slot that fell due while a run drained is enqueued before its exit check, and
    # its wake-up counts the next slot from its start (api/periodic.py EnqueuedSince).
    enqueue_slots_fallen_due: bool = True
    # A per-queue limit whose count says full while its jobs are ready is recounted, exactly,
    # with a run's first claim and its exit check (runner/limits.py).
    recount_full_limits: bool = True
    # A run that claimed nothing reports the ready jobs it leaves (held back by a full limit)
    # as QueueDepth and OldestReadyAgeSeconds, counted with its exit check (aws/control.py).
    count_ready_at_exit: bool = True
    # A wake-up request ({"reason": "later"}) creates a schedule only for a wake-up the database
    # records under the kick's id, due within the horizon (aws/wake_request.py).
    check_wake_requests: bool = True
    # A Waker (one per invocation) creates at most one schedule (aws/wake.py).
    cap_wake_schedules: bool = True

    # Optimisations: a benchmark measures each against its absence (docs/decisions/).
    prefetch: bool = True  # claim for slots about to free (runner/prefetch.py)
    pipelining: bool = True  # send the next claim before the last reply is read
    job_on_loop_thread: bool = True  # at concurrency 1 (runner/loop_thread.py)
    # A claim of a queue starts after the last job the run claimed there (runner/positions.py).
    claim_from_position: bool = True


ALL_ON = Controls()
