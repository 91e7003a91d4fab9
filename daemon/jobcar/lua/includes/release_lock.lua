-- Drop a job's unique lock, but only while it still points at this job (it may have expired and
-- been taken by a newer job with the same key).
local function release_lock(prefix, unique, id)
  local lock = prefix .. 'unique:' .. unique
  if redis.call('GET', lock) == id then redis.call('DEL', lock) end
end
