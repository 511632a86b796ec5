-- pgdrain 0001: the jobs table, its invariants and the migrations ledger.

CREATE SCHEMA IF NOT EXISTS pgdrain;

CREATE TABLE IF NOT EXISTS pgdrain.migrations (
    version     text        PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pgdrain.jobs (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    kind             text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status           text        NOT NULL DEFAULT 'queued',
    priority         integer     NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 5,
    recovery_policy  text        NOT NULL DEFAULT 'auto',
    reclaim_count    integer     NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    leased_by        text,
    attempt_token    uuid,
    heartbeat_at     timestamptz,
    idempotency_key  text,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,

    CONSTRAINT jobs_status_chk
        CHECK (status IN ('queued', 'running', 'done', 'failed')),
    CONSTRAINT jobs_kind_chk CHECK (kind <> ''),
    CONSTRAINT jobs_queue_chk CHECK (queue <> ''),
    CONSTRAINT jobs_recovery_policy_chk CHECK (recovery_policy IN ('auto', 'manual')),
    CONSTRAINT jobs_counts_chk
        CHECK (attempts >= 0 AND reclaim_count >= 0 AND max_attempts >= 1),
    -- The lease exists exactly while the job runs: a queued row with a lease, or a running
    -- row without one, would be skipped or wrongly returned by reclaim.
    CONSTRAINT jobs_lease_chk CHECK (
        (status = 'running'
            AND lease_expires_at IS NOT NULL AND leased_by IS NOT NULL
            AND attempt_token IS NOT NULL AND heartbeat_at IS NOT NULL)
        OR (status <> 'running'
            AND lease_expires_at IS NULL AND leased_by IS NULL
            AND attempt_token IS NULL AND heartbeat_at IS NULL)
    )
);

-- What a claim scans: only ready-to-be rows, so the index stays small however long the history.
CREATE INDEX jobs_ready_idx ON pgdrain.jobs (queue, priority, run_at, id)
    WHERE status = 'queued';

-- What reclaim scans: only running rows, by expiry.
CREATE INDEX jobs_lease_idx ON pgdrain.jobs (lease_expires_at)
    WHERE status = 'running';

CREATE UNIQUE INDEX jobs_idempotency_key_idx ON pgdrain.jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- What purge scans.
CREATE INDEX jobs_finished_idx ON pgdrain.jobs (finished_at)
    WHERE status IN ('done', 'failed');
