--- @include "release_lock"

-- Drop the unique lock named in the job's hash, if it has one and it still points at this job.
local function release_unique(prefix, job_key, id)
  local unique = redis.call('HGET', job_key, 'unique')
  if unique then release_lock(prefix, unique, id) end
end
