--- @include "keys"
--- @include "pending_lists"

-- Backpressure (ADR 0024): a queue's `max_pending`, which the daemons serving it write into <prefix>settings,
-- bounds the jobs its pending lists hold (every priority's and `pending:released`; not the scheduled, held,
-- waiting or active ones). `refuse_over_max_pending` refuses a call whose new jobs would take that count
-- past it, whole, before anything is written:
--   FULL jobcar enqueue: <pending> pending, max_pending <max>, <new> new refused
-- Every record counts as one new job whatever state it would be created in, except a record whose id names a
-- job already stored (it writes nothing), looked for only when the quick count says no. No bound (no field,
-- or one that is not a positive number) costs one HGET; a bound, an LLEN and an EXISTS more (and eleven LLENs
-- where other priorities or released jobs wait): O(1), however long the lists.
-- A refusal adds its new jobs to the hash's `refused` field, the only write it makes.
-- Returns that error reply, or nil.
local function refuse_over_max_pending(prefix, records, pending)
  local max = tonumber(redis.call('HGET', settings_key_of(prefix), 'max_pending'))
  if not max or max < 1 then return nil end
  -- `pending` is checked to be a list. The other levels' lists and the released one are read only when one of
  -- them exists (one EXISTS: most queues use neither priorities nor limits); one of another type (fsck's) holds
  -- no pending job.
  local n = redis.call('LLEN', pending)
  local lists = pending_lists(pending)
  if redis.call('EXISTS', unpack(lists, 2)) > 0 then
    for i = 2, #lists do
      local length = redis.pcall('LLEN', lists[i])
      if type(length) == 'number' then n = n + length end
    end
  end
  local new = #records
  if n + new <= max then return nil end
  for _, record in ipairs(records) do
    if redis.call('EXISTS', job_key_of(prefix, ARGV[record.at])) == 1 then new = new - 1 end
  end
  if new == 0 or n + new <= max then return nil end
  -- Counted where every producer's refusals meet: `jobcar stats` and the metrics show it.
  redis.call('HINCRBY', settings_key_of(prefix), 'refused', new)
  return redis.error_reply('FULL jobcar enqueue: ' .. n .. ' pending, max_pending ' .. max .. ', ' .. new
    .. ' new refused')
end
