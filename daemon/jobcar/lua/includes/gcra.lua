-- Rate limits by GCRA (the generic cell rate algorithm) on Redis time (ADR 0014). A rate group's state is
-- its theoretical arrival time (TAT, ms) in <prefix>tat:<group>, a STRING that expires once it is past.
-- Starts `interval` ms apart on average, at most `burst` at once: a start is allowed while
-- TAT - now <= interval * (burst - 1).

-- The ms to wait before the group's next start (0: now), and the TAT to pass to gcra_take.
local function gcra_wait(prefix, group, interval, burst, now)
  local stored = redis.pcall('GET', prefix .. 'tat:' .. group)
  local tat = type(stored) == 'string' and tonumber(stored) or now
  if tat < now then tat = now end
  return math.max(0, tat - interval * (burst - 1) - now), tat
end

-- A group without a rate (interval 0: only a handler's 429 holds it back) keeps no state to advance.
local function gcra_take(prefix, group, interval, tat, now)
  if interval == 0 then return tat end
  local next_tat = tat + interval
  redis.call('SET', prefix .. 'tat:' .. group, string.format('%.3f', next_tat), 'PX',
    math.max(1, math.ceil(next_tat - now)))
  return next_tat
end

-- The rule's interval and burst of a rate group ("@<type>" or "@<type>#<key>"): interval 0 for a group
-- only a handler's 429 holds back; nil when the rules no longer limit it.
local function rate_of(limits, group)
  local job_type, key = string.match(group, '^@(.-)#(.*)$')
  local rule = limits and limits[job_type or string.sub(group, 2)]
  local rate, burst = nil, 1
  if rule and key and rule.key_rate then
    rate, burst = rule.key_rate, rule.key_burst or 1
  elseif rule and not key and rule.rate then
    rate, burst = rule.rate, rule.burst or 1
  elseif rule and rule.hold == (key and 'key' or 'type') then
    return 0, 1
  end
  if not rate then return nil end
  return rate[2] / rate[1], burst
end
