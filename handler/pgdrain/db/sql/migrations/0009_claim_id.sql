-- pgdrain 0009: each claim carries a client-chosen claim id, stored on the rows it claimed, so
-- a run whose connection broke after the server committed a claim (the reply was lost) can
-- ask what that claim already took instead of claiming a second batch and orphaning the
-- first. Only running rows are ever looked up by it, hence the partial index.

ALTER TABLE pgdrain.jobs ADD COLUMN claim_id uuid;

CREATE INDEX jobs_claim_idx ON pgdrain.jobs (claim_id) WHERE status = 'running';
