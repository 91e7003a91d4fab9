--- @include "add_to_batch"

-- Count an outcome in the job's batch, if it belongs to one.
local function count_in_batch(prefix, job_key, field, by)
  local batch = redis.call('HGET', job_key, 'batch')
  if batch then add_to_batch(prefix, batch, field, by) end
end
