"""The control-plane simulator (`make simulate`): when do runs start, how many run, and how long
does the database stay awake, measured rather than argued (docs/simulate.md).

It runs the real `handler/app.py` `lambda_handler` in real processes against real PostgreSQL
(DATABASE_URL, else the embedded server), with a small stand-in for the AWS control plane: an
HTTP server on 127.0.0.1 that boto3 in the function processes reaches through
`AWS_ENDPOINT_URL_LAMBDA` and `AWS_ENDPOINT_URL_SCHEDULER`. It implements Lambda `Invoke`
(asynchronous: 202 and a run in a process; synchronous too) and EventBridge Scheduler
`CreateSchedule` / `GetSchedule` / `DeleteSchedule` for one-shot `at(...)` schedules, fires the
rate schedule and the one-shot schedules on time, and plays Lambda's async machinery: a
concurrency cap that throttles (and retries throttled events), the retry policy of
template.yaml, a hard kill (SIGKILL) at the timeout, duplicate deliveries and failed calls on
request.

Time is scaled by one factor (default 12: a simulated minute is five real seconds) applied to
every duration: job lengths and delays, schedule rates, the one-shot schedule precision, the
suspend rule, the function timeout, retry delays, and the function's own PGDRAIN_*_SECONDS
settings (read from template.yaml, so a new setting is scaled without changing the simulator).
No clock is faked: everything runs in real time, shorter.

Each (trace, system) pair gets its own database. What is reported comes from what the database
saw: pg_stat_activity sampled every 100 ms (connections named `pgdrain`), the jobs table, and a
ledger table (`pgdrain_sim.ledger`) into which the sim's job kinds write when each attempt
started and finished.

Pieces: timescale (the factor), template (reads template.yaml), standin (the AWS stand-in),
launcher (execution environments: processes), function (the process that runs the handler),
jobs (the sim job kinds), poller (the always-on baseline worker), traces, driver (the
application that enqueues and kicks), measure (sampling and figures), report (table, markdown,
JSON, plot), run (orchestration; `python -m sim --help`).
"""
