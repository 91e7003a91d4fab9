-- True when the caller still holds the lease: the job is active and carries the caller's token.
-- The hash is the truth; the active set only indexes deadlines for the reaper. Every script that
-- takes a lease away (reap, another lease after it) changes state or token in the same step, so a
-- matching token proves nobody else acted, even if the job's entry in the active set vanished
-- (an operator's ZREM, a bug): extend then restores the entry instead of losing the job.
-- Callers that need more of the hash name those fields: their values come back second (after state
-- and token), read by the same HMGET.
-- A key that is not a hash (written by something else than jobcar) holds no lease: the caller changes
-- nothing for that job, and the reaper or fsck deals with the id.
local function holds_lease(job_key, token, ...)
  local fields = redis.pcall('HMGET', job_key, 'state', 'token', ...)
  if fields.err then return false, {} end
  return fields[1] == 'active' and fields[2] == token, fields
end
