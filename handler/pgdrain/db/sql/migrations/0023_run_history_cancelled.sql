-- pgdrain 0023: a run's history line counts its cancelled jobs apart (the drain's `cancelled`:
-- a job's own Cancel, an operator's cancel of a running attempt), which 0019 counted as failed
-- and as lost leases, alarms included. A column with a constant default: a catalog change, no
-- rewrite; the lines written before it read 0.
ALTER TABLE pgdrain.run_history ADD COLUMN cancelled integer NOT NULL DEFAULT 0;
