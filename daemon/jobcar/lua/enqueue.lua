#!lua
-- enqueue: store one or more new jobs of one queue, each runnable now or scheduled for later.
--
-- KEYS[1] pending    LIST  ids ready to run (LPUSH in, RPOP out)
-- KEYS[2] scheduled  ZSET  id -> run-at ms
-- KEYS[3] wake       LIST  non-empty while there may be work; blocked daemons wake when it appears
-- ARGV[1] the queue's key prefix "<ns>:{<queue>}:"
-- ARGV[2..] one record per job, back to back (includes/store_jobs.lua):
--   id, type, payload, run_at_ms ("0": none), delay_ms ("0": none), unique_key ("": none),
--   unique_ttl_ms, n, then n field/value pairs of optional fields: content_type, max_attempts, timeout (ms),
--   backoff (ms), keep_for (ms), traceparent, meta (JSON), batch, key, priority (0-9), expires_at (ms),
--   expires_in (ms), unique_mode (until_done | window), debounce_key, debounce_ms, debounce_max_ms, parent,
--   after and dependents (JSON arrays of "<queue>/<id>"), on_dependency_failure (fail | run | cancel).
--   run_at_ms is the producer's clock, delay_ms relative to Redis time; when both are non-zero, run_at_ms is
--   taken. Ids are not checked here (producers keep to 1-200 printable characters, docs/protocol.md).
-- A malformed record, an unknown field or a bad value fails the whole call before anything is written, with
-- an error reply "ERR jobcar enqueue: ..." (docs/protocol.md lists each).
-- Touches per job: <prefix>job:<id> HASH (created), <prefix>unique:<key> or <prefix>window:<key> STRING
--   (SET NX PX), <prefix>debounce:<key> STRING, <prefix>batch:<batch> HASH (HINCRBY total) when the job names
--   a batch, <prefix>pending:<p> LIST (priority p > 0), and for dependencies <prefix>waiting ZSET,
--   <prefix>deps:<id> SET, <prefix>dependents:<id> SET; <prefix>pending_counts HASH (HINCRBY of each type by
--   the jobs it made pending: includes/count_pending.lua).
-- Returns an array with one entry per job, in order:
--   "pending" | "scheduled" | "waiting"      created, in that state (waiting: the record has `after`)
--   {"exists", id, state}                    a job with this id exists (nothing written but the record's
--                                            `dependents`, registered with it unless it ended)
--   {"duplicate", holder's id, holder's state}  the unique key is held (nothing written)
--   {"debounced", waiting id, "scheduled"}   the debounce key's scheduled job took the payload
-- A run-at in the past makes the job runnable now. Time is Redis time.
-- Refused whole with an error reply "FULL jobcar enqueue: <pending> pending, max_pending <max>, <new> new refused"
-- (or "<pending> pending of type <type>, ...") when <prefix>settings holds a `max_pending` (or a
-- `max_pending:<type>`) that the call's new jobs would take the queue's pending and held jobs (of that type) past
-- (includes/max_pending.lua, ADR 0024); nothing is written but the count of refused jobs (`refused`).
-- A key of another Redis type is refused with "WRONGTYPE jobcar: ..." before the first write.
-- docs/conformance/producer.json holds cases of every reply, with the keys they leave.

--- @include "store_plain"

-- The usual call, one plain job into a queue without a bound, ends here: the helpers of the general path below
-- are not even made (a script's whole body runs on every call, and each helper costs a closure).
local bounds = nil
if is_plain(2) then
  local reply
  reply, bounds = store_plain(ARGV[1], 2, KEYS[1], KEYS[3])
  if reply then return reply end
end

--- @include "store_jobs"
--- @include "max_pending"

local records = parse_records(2)
if records.err then return records end
local refused, states = refuse_wrong_types(ARGV[1], records, KEYS[1], KEYS[2])
if refused then return refused end
local full = refuse_over_max_pending(ARGV[1], records, bounds)
if full then return full end
return store_jobs(ARGV[1], records, now_ms(), KEYS[1], KEYS[2], KEYS[3], states)
