--- @include "keys"
--- @include "group_names"

-- Rate limits by GCRA (the generic cell rate algorithm) on Redis time (ADR 0014). A rate group's state is
-- its theoretical arrival time (TAT, ms) in <prefix>tat:<group>, a STRING that expires once it is past.
-- Starts `interval` ms apart on average, at most `burst` at once: a start is allowed while
-- TAT - now <= interval * (burst - 1).

-- The ms to wait before the group's next start (0: now), and the TAT to pass to gcra_take.
local function gcra_wait(prefix, group, interval, burst, now)
  local stored = redis.pcall('GET', tat_key_of(prefix, group))
  local tat = type(stored) == 'string' and tonumber(stored) or now
  if tat < now then tat = now end
  return math.max(0, tat - interval * (burst - 1) - now), tat
end

-- A group without a rate (interval 0: only a handler's 429 holds it back) keeps no state to advance.
local function gcra_take(prefix, group, interval, tat, now)
  if interval == 0 then return tat end
  local next_tat = tat + interval
  redis.call('SET', tat_key_of(prefix, group), string.format('%.3f', next_tat), 'PX',
    math.max(1, math.ceil(next_tat - now)))
  return next_tat
end

-- The interval (ms) and burst of a rule's rate for the whole type (keyed false) or for each key: interval 0
-- for a group only a handler's 429 holds back (`hold`); nil when the rule has neither.
local function rate_rule(rule, keyed)
  if not rule then return nil end
  local rate, burst = rule.rate, rule.burst
  if keyed then rate, burst = rule.key_rate, rule.key_burst end
  if rate then return rate[2] / rate[1], burst or 1 end
  if rule.hold == (keyed and 'key' or 'type') then return 0, 1 end
  return nil
end

-- The same for a rate group by its name ("@<type>" or "@<type>#<key>"): nil when the rules no longer limit it.
local function rate_of(limits, group)
  local _, job_type, key = group_parts(group)
  return rate_rule(limits and limits[job_type], key ~= nil)
end
