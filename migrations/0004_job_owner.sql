-- Who submitted a job (SO_PEERCRED of the Unix socket connection): a managed job runs as
-- this uid and gid. NULL when the caller could not be identified (TCP).
ALTER TABLE jobs ADD COLUMN owner_uid INTEGER;
ALTER TABLE jobs ADD COLUMN owner_gid INTEGER;
