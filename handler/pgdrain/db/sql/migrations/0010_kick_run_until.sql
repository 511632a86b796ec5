-- pgdrain 0010: a kick does not invoke while a run drains its queue. run_until is how long
-- the runs draining the queue hold its kicks: a live run renews it (a third of a lease ahead)
-- while it claims, and clears it when it exits. A run that is live sees a suppressed kick
-- before it exits (its exit check), so invoking another would only add an invocation that
-- finds nothing; a run that died, or that is busy with long jobs and claims nothing, stops
-- holding the kicks within a third of a lease, and the next kick invokes.
ALTER TABLE pgdrain.kicks ADD COLUMN run_until timestamptz;
