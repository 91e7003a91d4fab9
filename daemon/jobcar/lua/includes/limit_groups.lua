-- The limit groups a job counts in, by its type's rule from the daemon's config (ADR 0014): {total = n},
-- {per_key = m}, {rate = {count, period_ms}, burst = b}, {key_rate = {count, period_ms}, key_burst = b},
-- {hold = "type" | "key"} (a handler's 429 holds the type or the key back: a rate group without a rate),
-- {fair = true} (keys take turns for the total: includes/turns.lua),
-- with key = "key" | "meta.<name>" | "payload.<name>" for the per-key parts. `job` is an HGETALL reply and
-- `at` maps its field names to their values' indexes. A job without a usable key counts in its type's
-- groups only.
--- @include "gcra"

local function limit_key(source, job, at)
  local value
  if source == 'key' then
    value = at.key and job[at.key]
  else
    local field, name = string.match(source, '^(%a+)%.(.+)$')
    local raw = field and at[field] and job[at[field]]
    if raw then
      local ok, doc = pcall(cjson.decode, raw)
      if ok and type(doc) == 'table' then value = doc[name] end
    end
  end
  if type(value) == 'number' then value = string.format('%.17g', value) end
  if type(value) ~= 'string' or value == '' then return nil end
  -- A long key (a payload field is the producer's) is named by its digest: key names stay short.
  if #value > 100 then return 'sha1:' .. redis.sha1hex(value) end
  return value
end

-- {{group, limit}, ...} for the concurrency limits, and {{group, interval_ms, burst}, ...} for the rate
-- limits, whose groups are named "@<type>" and "@<type>#<key>"; and the job's key (nil: none, or not needed).
local function limit_groups(rule, job_type, job, at)
  local key = nil
  if rule.per_key or rule.key_rate or rule.hold == 'key' or rule.fair then
    key = limit_key(rule.key or 'key', job, at)
  end
  local groups, rates = {}, {}
  if rule.total then groups[1] = {job_type, rule.total} end
  if rule.per_key and key then groups[#groups + 1] = {job_type .. '#' .. key, rule.per_key} end
  local interval, burst = rate_rule(rule, false)
  if interval then rates[1] = {'@' .. job_type, interval, burst} end
  if key then
    interval, burst = rate_rule(rule, true)
    if interval then rates[#rates + 1] = {'@' .. job_type .. '#' .. key, interval, burst} end
  end
  return groups, rates, key
end
