-- pgdrain 0003: keep the attempt_token of the attempt whose completion was accepted, so the
-- record of a done job says which attempt's result it holds (an audit of "at most one
-- accepted completion per job": a stale attempt's result can be told from the accepted one).

ALTER TABLE pgdrain.jobs ADD COLUMN completed_token uuid;
