-- Dependencies (ADR 0016). A job others wait for carries the field `dependents` ("1"), and
-- <prefix>dependents:<id>, a SET of "<queue>/<id>" references, names them. When it ends (done, dead or
-- canceled) the script that ends it records the outcome in <prefix>settled, a LIST of JSON entries
-- [[id, ...], outcome, [reference, ...]] (and, for a batch's callbacks, the batch's counts), for the daemons
-- to carry to each dependent (the settle script, on the dependent's own slot: on a Cluster the two may live
-- on different nodes). The entry stays until it was carried, so a crash between the two steps loses
-- nothing, and carrying it twice changes nothing. A batch tells its callbacks the same way, as
-- "batch:<id>", with its hash in place of a job's (includes/add_to_batch.lua).
-- A script ending many jobs (ack) gathers those that end the same way for the same dependents into one
-- entry: the dependencies of a fan-in, acked fifty at a time, make one entry and one settle call.
local function dependents_told(prefix)
  local entries, order = {}, {}
  local told = {}
  -- `marked`: the job's `dependents` field as the caller read it (nil: read it here). `counts`: a batch's.
  function told.add(job_key, id, outcome, marked, counts)
    if marked == nil then marked = redis.call('HGET', job_key, 'dependents') end
    if not marked then return end
    local set = prefix .. 'dependents:' .. id
    local refs = redis.pcall('SMEMBERS', set)
    if not refs.err and #refs > 0 then
      table.sort(refs)
      local same = outcome .. ' ' .. table.concat(refs, ' ')  -- references hold no space
      if counts then same = same .. ' ' .. id end  -- a batch's entry is its own
      local entry = entries[same]
      if not entry then
        entry = {{}, outcome, refs, counts}
        entries[same] = entry
        order[#order + 1] = same
      end
      entry[1][#entry[1] + 1] = id
    end
    redis.call('DEL', set)
    redis.call('HDEL', job_key, 'dependents')
  end
  function told.push()
    -- A settled list of another type (fsck reports it, and its waiting jobs) takes nothing, rather than
    -- stopping the script that ends the jobs half-way.
    for _, same in ipairs(order) do redis.pcall('RPUSH', prefix .. 'settled', cjson.encode(entries[same])) end
  end
  return told
end

local function tell_dependents(prefix, job_key, id, outcome, marked, counts)
  local told = dependents_told(prefix)
  told.add(job_key, id, outcome, marked, counts)
  told.push()
end
