-- The limit groups a job counts in, as {{group, limit}, ...}, by its type's rule from the daemon's config:
-- {total = n} and/or {per_key = m, key = "key" | "meta.<name>" | "payload.<name>"} (ADR 0014). `job` is an
-- HGETALL reply and `at` maps its field names to their values' indexes. A job without a usable key counts
-- in its type's total only.
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

local function limit_groups(rule, job_type, job, at)
  local groups = {}
  if rule.total then groups[1] = {job_type, rule.total} end
  if rule.per_key then
    local key = limit_key(rule.key or 'key', job, at)
    if key then groups[#groups + 1] = {job_type .. '#' .. key, rule.per_key} end
  end
  return groups
end
