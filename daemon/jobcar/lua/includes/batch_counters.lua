--- @include "keys"

-- A batch's counters (Spark producers wait on them): `total` counted by the enqueue of its jobs, `done`,
-- `dead` and `canceled` by the scripts that end them (includes/add_to_batch.lua, which also fires the batch). A
-- batch key of another type (written by something else) counts nothing, for fsck to report, and the script goes
-- on: a script that fails half-way keeps the writes it made.
local BATCH_TTL_MS = 7 * 86400 * 1000

-- Add `by` to the batch's `field`; false when its key holds another type (nothing counted).
local function bump_batch(key, field, by)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'hash' and kind ~= 'none' then return false end
  redis.call('HINCRBY', key, field, by)
  redis.call('PEXPIRE', key, BATCH_TTL_MS)
  return true
end
