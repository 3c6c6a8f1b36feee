-- Each MIG layout step, recorded before it is applied and again when it ends, so that a
-- crash in the middle of a reconfiguration is found at the next start.
CREATE TABLE layout_steps (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    gpu_uuid    TEXT    NOT NULL,
    gpu_index   INTEGER NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('create', 'destroy')),
    profile_id  INTEGER NOT NULL,
    start_slice INTEGER NOT NULL,
    -- The driver's instance ID: known up front for a destroy, after it for a create.
    instance_id INTEGER,
    state       TEXT    NOT NULL CHECK (state IN ('pending', 'done', 'failed', 'interrupted')),
    error       TEXT    NOT NULL DEFAULT '',
    started_at  INTEGER NOT NULL,
    finished_at INTEGER
);
