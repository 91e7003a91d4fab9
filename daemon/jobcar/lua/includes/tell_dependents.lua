--- @include "keys"
--- @include "release_waiting"
--- @include "queue_name"
--- @include "wake"
--- @include "wrong_type"

-- Dependencies (ADR 0016). A job others wait for carries the field `dependents` ("1"), and
-- <prefix>dependents:<id>, a SET of "<queue>/<id>" references, names them. When it ends (done, dead or
-- canceled) the script that ends it tells them:
-- - a job waiting in the same queue (the same slot) for one that ended done is told in that script: the
--   last of its dependencies to end makes it pending atomically (includes/release_waiting.lua);
-- - the others are told through <prefix>settled, a LIST of JSON entries [[id, ...], outcome, [reference,
--   ...]] (and, for a batch's callbacks, the batch's counts), which the daemons carry to each of them (the
--   settle script, on the waiting job's own slot: on a Cluster the two may live on different nodes). The
--   entry stays until it was carried, so a crash between the two steps loses nothing, and carrying it
--   twice changes nothing. A failure travels down a chain this way, one step per carry, never recursing.
--   A script that leaves an entry also wakes the queue with SETTLED_WAKE (includes/wake.lua): a daemon whose
--   watcher of the queue was blocked on `wake` carries it at once, whichever process ran the script (a CLI's
--   cancel, a Spark driver's seal_batch); the daemons' periodic look is only the backstop (ADR 0022).
-- A batch tells its callbacks the same way, as "batch:<id>", with its hash in place of a job's
-- (includes/add_to_batch.lua). A script ending many jobs (ack) gathers those that end the same way for the
-- same dependents into one entry: the dependencies of a fan-in in another queue, acked fifty at a time,
-- make one entry and one settle call.
local function dependents_told(prefix)
  local entries, order = {}, {}
  -- "<queue>/" of this script's queue (for a prefix of another shape: one no reference starts with)
  local here = (queue_name(prefix) or '\0') .. '/'
  -- waiting jobs of this queue to release: id -> {references of their dependencies that ended done}, and a
  -- batch callback's counts; one release per waiting job however many of its dependencies the call ended
  local releases, released_order, counts_of = {}, {}, {}
  local told = {}
  -- `marked`: the job's `dependents` field as the caller read it (nil: read it here). `counts`: a batch's
  -- counts (a table). True when an entry was left for the daemons to carry.
  function told.add(job_key, id, outcome, marked, counts)
    if marked == nil then marked = redis.call('HGET', job_key, 'dependents') end
    if not marked then return false end
    local set = dependents_key_of(prefix, id)
    local refs = redis.pcall('SMEMBERS', set)
    redis.call('DEL', set)
    redis.call('HDEL', job_key, 'dependents')
    if refs.err or #refs == 0 then return false end
    if outcome == 'done' then
      local elsewhere = {}
      for _, ref in ipairs(refs) do
        if string.sub(ref, 1, #here) == here then
          local waiting = string.sub(ref, #here + 1)
          if not releases[waiting] then
            releases[waiting] = {}
            released_order[#released_order + 1] = waiting
          end
          table.insert(releases[waiting], here .. id)
          if counts then counts_of[waiting] = cjson.encode(counts) end
        else
          elsewhere[#elsewhere + 1] = ref
        end
      end
      refs = elsewhere
      if #refs == 0 then return false end
    end
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
    return true
  end
  function told.push()
    for _, waiting in ipairs(released_order) do
      release_waiting(prefix, waiting, releases[waiting], counts_of[waiting])
    end
    -- A settled list of another type (fsck reports it, and its waiting jobs) takes nothing, rather than
    -- stopping the script that ends the jobs half-way.
    for _, same in ipairs(order) do redis.pcall('RPUSH', settled_key_of(prefix), cjson.encode(entries[same])) end
    if #order > 0 then wake(wake_key_of(prefix), SETTLED_WAKE) end
  end
  return told
end

-- The refusal (includes/wrong_type.lua) of a script about to end a job that others wait for (`marked`: its
-- `dependents` field) while <prefix>settled holds another type: ended, the job could not tell them, and
-- they would wait for ever. Scripts ask before their first write, and only for such a job: ending one
-- without dependents pays nothing for it.
local function untold_refusal(prefix, marked)
  if not marked then return nil end
  return wrong_type({settled_key_of(prefix), 'list'})
end

-- True when an entry was left for the daemons to carry.
local function tell_dependents(prefix, job_key, id, outcome, marked, counts)
  local told = dependents_told(prefix)
  local left = told.add(job_key, id, outcome, marked, counts)
  told.push()
  return left
end
