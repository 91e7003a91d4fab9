--- @include "keys"
--- @include "now_ms"
--- @include "wake"
--- @include "wrong_type"
--- @include "count_pending"
--- @include "settings_fields"

-- The usual enqueue, stored without the general path's work (includes/store_jobs.lua): a call of one plain
-- record, with no optional field, no unique key, no run time and no delay, so runnable now. It writes what
-- store_jobs writes for such a record and answers what it answers; it only skips the tables and helpers that
-- the general path needs for the other records (in an enqueue, a Lua table costs about as much as a command,
-- and every helper a script carries costs a closure per call). docs/conformance/producer.json holds cases of
-- both paths.

-- Whether the call's record at ARGV[first] is plain and the call's only one.
local function is_plain(first) return #ARGV == first + 7 and ARGV[first + 7] == '0' and ARGV[first + 5] == '' and ARGV[first + 3] == '0' and ARGV[first + 4] == '0' end

-- Store the plain record at ARGV[first] into `pending` and return the call's reply, unless the queue or the
-- record's type has a backpressure bound (includes/max_pending.lua): then write nothing and return nil and the
-- bounds read (HMGET of the queue's field and the type's), for the general path to take.
local function store_plain(prefix, first, pending, wake_key)
  local id, job_type = ARGV[first], ARGV[first + 1]
  local bounds = redis.call('HMGET', settings_key_of(prefix), MAX_PENDING_FIELD, TYPE_BOUND_PREFIX .. job_type)
  if bounds[1] or bounds[2] then return nil, bounds end
  local job_key = job_key_of(prefix, id)
  local existing = redis.call('HGET', job_key, 'state')
  if existing then return {{'exists', id, existing}} end
  -- The push comes first, so that a pending list of another type refuses the call before anything is written.
  if type(redis.pcall('LPUSH', pending, id)) ~= 'number' then return wrong_type({pending, 'list'}) end
  redis.call('HSET', job_key, 'type', job_type, 'payload', ARGV[first + 2], 'state', 'pending', 'created', now_ms())
  count_pending(prefix, job_type, 1)
  wake(wake_key)
  return {'pending'}
end
