-- pgdrain 0015: the limits build_job() enforces, enforced by the table as well, so that rows
-- written by enqueue_many(), another driver or a hand-written INSERT keep them too: a queue
-- name as settings.QUEUE_NAME says, a kind of at most 200 characters, an idempotency key of 1
-- to 500, and at most 1 MiB of payload as stored (its text: what a claim sends to the run).
-- build_job() allows a quarter of that, measured as json.dumps writes it (a jsonb number is
-- written out in full: 1e300 becomes 301 digits).
--
-- Each constraint is added NOT VALID, then validated: a row already in the table that breaks
-- one fails this migration, naming the constraint, rather than failing every claim or
-- completion that would update it later. Validating reads every row, while the table is
-- locked: on a long history, delete old finished jobs first (`pgdrain purge`).
-- The queue's pattern: no bounded repetition, which PostgreSQL's regular expressions make
-- several times slower; CHECKs run at every UPDATE of a row.
ALTER TABLE pgdrain.jobs
    ADD CONSTRAINT jobs_queue_name_chk
        CHECK (queue ~ '^[A-Za-z_][A-Za-z0-9_.-]*$' AND length(queue) <= 63) NOT VALID,
    ADD CONSTRAINT jobs_kind_length_chk CHECK (length(kind) <= 200) NOT VALID,
    ADD CONSTRAINT jobs_key_length_chk
        CHECK (idempotency_key IS NULL OR length(idempotency_key) BETWEEN 1 AND 500) NOT VALID,
    ADD CONSTRAINT jobs_payload_size_chk
        CHECK (octet_length(payload::text) <= 1048576) NOT VALID;

ALTER TABLE pgdrain.jobs VALIDATE CONSTRAINT jobs_queue_name_chk;
ALTER TABLE pgdrain.jobs VALIDATE CONSTRAINT jobs_kind_length_chk;
ALTER TABLE pgdrain.jobs VALIDATE CONSTRAINT jobs_key_length_chk;
ALTER TABLE pgdrain.jobs VALIDATE CONSTRAINT jobs_payload_size_chk;
