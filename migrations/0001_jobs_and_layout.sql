-- The node store: jobs, their state transitions, and the GPU instance layout.
-- Append-only: never edit a released migration; add a new one.

CREATE TABLE jobs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    name           TEXT    NOT NULL,
    class          TEXT    NOT NULL CHECK (class IN ('online', 'offline')),
    -- The validated JobSpec as JSON (mmk_core::JobSpec).
    spec           TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('QUEUED', 'STARTING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    reason         TEXT    NOT NULL DEFAULT '',
    priority       INTEGER NOT NULL,
    gpu_memory_mib INTEGER NOT NULL,
    -- Unix milliseconds.
    submitted_at   INTEGER NOT NULL,
    started_at     INTEGER,
    finished_at    INTEGER,
    updated_at     INTEGER NOT NULL,
    -- Assignment while STARTING or RUNNING (kept after the job ends, for the record).
    gpu_index      INTEGER,
    gpu_uuid       TEXT,
    slot_start     INTEGER,
    -- MIG profile ID of the partition; NULL for a whole GPU with MIG off.
    slot_profile   INTEGER,
    profile        TEXT,
    instance_id    INTEGER,
    device_uuid    TEXT,
    mps_share      INTEGER,
    exit_code      INTEGER,
    restarts       INTEGER NOT NULL DEFAULT 0,
    pid            INTEGER
);

CREATE INDEX jobs_by_state ON jobs (state);

CREATE TABLE job_events (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    state  TEXT    NOT NULL,
    reason TEXT    NOT NULL,
    at     INTEGER NOT NULL
);

CREATE INDEX job_events_by_job ON job_events (job_id, seq);

-- GPU instances mmkd created. On the simulated node this is the node's layout; on real
-- hardware NVML is the truth and this is mmkd's record of it.
CREATE TABLE gpu_instances (
    gpu_uuid     TEXT    NOT NULL,
    gpu_index    INTEGER NOT NULL,
    start_slice  INTEGER NOT NULL,
    profile_id   INTEGER NOT NULL,
    size_slices  INTEGER NOT NULL,
    instance_id  INTEGER NOT NULL,
    device_uuid  TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (gpu_uuid, start_slice)
);
