-- Who cancelled a job or released its allocation (the caller's uid); NULL when the job
-- ended by itself or by mmkd.
ALTER TABLE jobs ADD COLUMN ended_by_uid INTEGER;
