-- The list a pending job of `priority` waits in: `pending` for 0 (the default, leased first) or none, and
-- `pending:<p>` for 1 to 9. A level's list that holds another Redis type (fsck reports and repairs it) is
-- passed over for `pending`: the job still runs, and no script stops half-way on that key.
local function pending_key(pending, priority)
  if not priority or priority == '0' then return pending end
  local key = pending .. ':' .. priority
  local held = redis.call('TYPE', key).ok
  if held == 'none' or held == 'list' then return key end
  return pending
end
