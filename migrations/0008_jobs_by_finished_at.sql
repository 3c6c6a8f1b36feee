-- Jobs by when they ended: a metrics scrape reads the jobs that ended in the last five
-- minutes, and the disk guard the ones past their retention, without reading every job.
CREATE INDEX jobs_by_finished_at ON jobs (finished_at);
