-- Count an outcome in a batch (Spark producers wait on these counters).
local BATCH_TTL_MS = 7 * 86400 * 1000
local function add_to_batch(prefix, batch, field, by)
  local key = prefix .. 'batch:' .. batch
  redis.call('HINCRBY', key, field, by)
  redis.call('PEXPIRE', key, BATCH_TTL_MS)
end
