-- The caller's request id of a submit (SubmitJobRequest.request_id): a retry with the same
-- id by the same owner returns the job the first one stored instead of storing another.
ALTER TABLE jobs ADD COLUMN request_id TEXT;
CREATE UNIQUE INDEX jobs_owner_request ON jobs (owner_uid, request_id) WHERE request_id IS NOT NULL;
