-- pgdrain 0011: the claim id (0009) is looked up without an index of its own.
--
-- jobs_claim_idx took one entry per claimed job: every claim paid it, and only the recovery
-- after a lost reply (job_claim_recover, rare) read it. That lookup asks for running rows,
-- which jobs_lease_idx holds (the running jobs of every run, a few thousand at most), so it
-- reads them there and checks claim_id on each. Each index that a job's two updates write into
-- costs throughput (docs/decisions/0007).
-- IF EXISTS: safe on a database where it is already gone.
DROP INDEX IF EXISTS pgdrain.jobs_claim_idx;
