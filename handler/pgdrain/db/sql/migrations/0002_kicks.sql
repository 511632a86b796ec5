-- pgdrain 0002: one row per queue recording when the drain function was last kicked,
-- so that a burst of enqueues becomes one invocation per debounce window.

CREATE TABLE pgdrain.kicks (
    queue      text        PRIMARY KEY,
    kicked_at  timestamptz NOT NULL
);
