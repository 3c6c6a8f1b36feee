-- Learned profiles (mmkd/src/learn): what each job signature's kernels asked of the GPU,
-- measured by the sampler over its runs. `observed` is the JSON of learn::Observed.
CREATE TABLE learned_profiles (
    signature  TEXT PRIMARY KEY NOT NULL,
    owner_uid  INTEGER,
    name       TEXT NOT NULL,
    class      TEXT NOT NULL,
    observed   TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
