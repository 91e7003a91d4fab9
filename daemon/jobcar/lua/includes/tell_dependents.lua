-- Dependencies (ADR 0016). A job others wait for carries the field `dependents` ("1"), and
-- <prefix>dependents:<id>, a SET of "<queue>/<id>" references, names them. When it ends (done, dead or
-- canceled) the script that ends it records the outcome in <prefix>settled, a LIST of JSON entries
-- [id, outcome, [reference, ...]] (and, for a batch's callbacks, the batch's counts), for the daemons to
-- carry to each dependent (the settle script, on the dependent's own slot: on a Cluster the two may live on
-- different nodes). The entry stays until it was carried, so a crash between the two steps loses nothing,
-- and carrying it twice changes nothing. A batch tells its callbacks the same way, as "batch:<id>", with its
-- hash in place of a job's (includes/add_to_batch.lua).
local function tell_dependents(prefix, job_key, id, outcome, marked, counts)
  if marked == nil then marked = redis.call('HGET', job_key, 'dependents') end
  if not marked then return end
  local set = prefix .. 'dependents:' .. id
  local refs = redis.pcall('SMEMBERS', set)
  if not refs.err and #refs > 0 then
    redis.call('RPUSH', prefix .. 'settled', cjson.encode(counts and {id, outcome, refs, counts} or {id, outcome, refs}))
  end
  redis.call('DEL', set)
  redis.call('HDEL', job_key, 'dependents')
end
