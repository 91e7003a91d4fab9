#!lua
-- schedule_fire: take a schedule one step on (its due tick's job, if it fires one), or trigger it.
-- Compare and set: the step is taken only if the schedule still waits at the tick the caller saw, so any
-- daemon may fire a schedule and each tick fires once (ADR 0012).
--
-- KEYS[1] schedule   HASH  <prefix>schedule:<name>: spec, next, last, last_job, last_fired_at, fires, skipped,
--                          paused
-- KEYS[2] schedules  ZSET  name -> next tick ms
-- KEYS[3] pending, KEYS[4] scheduled, KEYS[5] wake: the queue's, for the job (includes/store_jobs.lua)
-- ARGV[1] prefix, ARGV[2] the schedule's name
-- ARGV[3] the tick the schedule waits at, as the caller saw it ("": a trigger, which moves nothing)
-- ARGV[4] the tick to fire (ms; "0": none), ARGV[5] how many due ticks this step passes over unfired
-- ARGV[6] the next tick to wait at ("": none left), ARGV[7] overlap: allow | skip, ARGV[8] limit ("0": none)
-- ARGV[9..] the job's record, as enqueue takes one (only when a tick fires, or for a trigger)
-- Returns {outcome, job id or "", now_ms}. Outcomes that change nothing: "missing" (no such schedule),
-- "paused", "moved" (another caller took this step), "early" (the tick is not due by Redis time). Else:
-- "fired", "overlap" (skip: the last run is pending, scheduled or active), "exists" (the tick's job was
-- made already), "advanced" (nothing to fire), "triggered".
-- Touches the job's hash (schedule, scheduled_at) as well as what enqueue touches.

--- @include "keys"
--- @include "now_ms"
--- @include "store_jobs"
--- @include "wrong_type"

local name = ARGV[2]
local now = now_ms()
local refused = wrong_type({KEYS[1], 'hash', KEYS[2], 'zset'})
if refused then return refused end
local state = redis.call('HMGET', KEYS[1], 'spec', 'next', 'paused', 'last_job')
if not state[1] then return {'missing', '', now} end
local trigger = ARGV[3] == ''
if not trigger then
  if state[3] == '1' then return {'paused', '', now} end
  if state[2] ~= ARGV[3] then return {'moved', '', now} end
  if tonumber(ARGV[3]) > now then return {'early', '', now} end
end

local fire = tonumber(ARGV[4])
local records = {}
if fire > 0 or trigger then
  records = parse_records(9)
  if records.err then return records end
  refused = refuse_wrong_types(ARGV[1], records, KEYS[3], KEYS[4])
  if refused then return refused end
end

local outcome, job_id = 'advanced', ''
local skipped = tonumber(ARGV[5])
if #records > 0 then
  local last = state[4] and redis.call('HGET', job_key_of(ARGV[1], state[4]), 'state')
  if not trigger and ARGV[7] == 'skip' and (last == 'pending' or last == 'scheduled' or last == 'active') then
    outcome = 'overlap'
    skipped = skipped + 1
  else
    job_id = ARGV[records[1].at]
    local stored = store_jobs(ARGV[1], records, now, KEYS[3], KEYS[4], KEYS[5])[1]
    if type(stored) == 'table' then
      outcome = 'exists'
    else
      local tick = trigger and now or fire
      redis.call('HSET', job_key_of(ARGV[1], job_id), 'schedule', name, 'scheduled_at', tick)
      outcome = trigger and 'triggered' or 'fired'
      if not trigger then
        redis.call('HSET', KEYS[1], 'last', fire, 'last_job', job_id, 'last_fired_at', now)
        redis.call('HINCRBY', KEYS[1], 'fires', 1)
      end
    end
  end
end
if trigger then return {outcome, job_id, now} end

if skipped > 0 then redis.call('HINCRBY', KEYS[1], 'skipped', skipped) end
local limit = tonumber(ARGV[8])
local fires = tonumber(redis.call('HGET', KEYS[1], 'fires') or '0')
if ARGV[6] == '' or (limit > 0 and fires >= limit) then
  redis.call('HSET', KEYS[1], 'next', '')
  redis.call('ZREM', KEYS[2], name)
else
  redis.call('HSET', KEYS[1], 'next', ARGV[6])
  redis.call('ZADD', KEYS[2], ARGV[6], name)
end
return {outcome, job_id, now}
