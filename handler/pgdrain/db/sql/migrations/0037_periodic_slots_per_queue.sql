-- pgdrain 0037: a periodic kind's last slot is kept per queue.
--
-- periodic_slots kept one row per kind (migration 0008), so two deployments sharing a database
-- that each declare the same kind on a queue of their own (a queue per tenant) took each
-- other's slots: whichever ran first enqueued the slot, for its queue alone (found by a red
-- team). The row is now per kind and queue. A row from before keeps no queue ('') and still
-- counts for every queue: a slot no later than it is not enqueued again (periodic_enqueue).
-- pgdrain code from before this migration cannot enqueue periodic slots once it is applied
-- (its ON CONFLICT names the kind alone): its runs fail at their start, enqueue nothing twice,
-- and deploying the new version ends it. Catalog change and a rewrite of a few rows.

ALTER TABLE pgdrain.periodic_slots ADD COLUMN queue text NOT NULL DEFAULT '';
ALTER TABLE pgdrain.periodic_slots DROP CONSTRAINT periodic_slots_pkey;
ALTER TABLE pgdrain.periodic_slots ADD PRIMARY KEY (kind, queue);
