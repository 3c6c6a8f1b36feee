-- Moves (a checkpoint and restart with another share) count apart from restarts after a
-- failure, so that moving a job never uses up its restart policy.
ALTER TABLE jobs ADD COLUMN moves INTEGER NOT NULL DEFAULT 0;
