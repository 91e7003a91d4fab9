-- What the lease needs to find the limit groups a job counts in (`limit_plan`, `read_key`, `rate_groups`), and
-- a job's key for the retry that holds it back (`limit_key`). By its type's rule from the daemon's config
-- (ADR 0014): {total = n}, {per_key = m}, {rate = {count, period_ms}, burst = b},
-- {key_rate = {count, period_ms}, key_burst = b},
-- {hold = "type" | "key"} (a handler's 429 holds the type or the key back: a rate group without a rate),
-- {fair = true} (keys take turns for the total: includes/turns.lua),
-- with key = "key" | "meta.<name>" | "payload.<name>" for the per-key parts. `job` is an HGETALL reply and
-- `at` maps its field names to their values' indexes. A job without a usable key counts in its type's
-- groups only.
--- @include "group_names"
--- @include "gcra"

-- Where a rule's keys come from: the job's field ("key", "meta" or "payload") and, but for "key", the
-- name of the entry in that field's JSON object.
local function key_source(source)
  if source == 'key' then return 'key', nil end
  local field, name = string.match(source, '^(%a+)%.(.+)$')
  return field, name
end

-- The job's key from `field` and `name` (key_source), or nil.
local function read_key(field, name, job, at)
  local raw = field and at[field] and job[at[field]]
  if not raw then return nil end
  local value = raw
  if name then
    local ok, doc = pcall(cjson.decode, raw)
    value = ok and type(doc) == 'table' and doc[name] or nil
  end
  if type(value) == 'number' then value = string.format('%.17g', value) end
  if type(value) ~= 'string' or value == '' then return nil end
  -- A long key (a payload field is the producer's) is named by its digest: key names stay short, and a job's
  -- `slots` field lists its groups one per line.
  if #value > 100 or string.find(value, '\n', 1, true) then return 'sha1:' .. redis.sha1hex(value) end
  return value
end

local function limit_key(source, job, at)
  local field, name = key_source(source)
  return read_key(field, name, job, at)
end

-- A rule as the lease applies it to each job of its type, worked out once per call: the rule, whether its
-- jobs need a key and where it comes from, and whether it has a rate group (`rated`). Jobs of a limited type
-- run this for every lease: the per-job work stays a few lookups.
local function limit_plan(rule)
  local plan = {rule = rule}
  if rule.per_key or rule.key_rate or rule.hold == 'key' or rule.fair then
    plan.key_field, plan.key_name = key_source(rule.key or 'key')
  end
  plan.rated = rate_rule(rule, false) ~= nil or (plan.key_field ~= nil and rate_rule(rule, true) ~= nil)
  return plan
end

-- {{group, interval_ms, burst}, ...}: a job's rate groups, named "@<type>" and "@<type>#<key>".
local function rate_groups(rule, job_type, key)
  local rates = {}
  local interval, burst = rate_rule(rule, false)
  if interval then rates[1] = {rate_group(job_type), interval, burst} end
  if key then
    interval, burst = rate_rule(rule, true)
    if interval then rates[#rates + 1] = {key_rate_group(job_type, key), interval, burst} end
  end
  return rates
end
