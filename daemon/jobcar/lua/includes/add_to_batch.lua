-- Count an outcome in a batch (Spark producers wait on these counters). A batch key of another type
-- (written by something else) counts nothing, for fsck to report, and the script goes on: a script
-- that fails half-way keeps the writes it made.
local BATCH_TTL_MS = 7 * 86400 * 1000
local function add_to_batch(prefix, batch, field, by)
  local key = prefix .. 'batch:' .. batch
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'hash' and kind ~= 'none' then return end
  redis.call('HINCRBY', key, field, by)
  redis.call('PEXPIRE', key, BATCH_TTL_MS)
end
