-- Every pending list of a queue: `pending` (priority 0), `pending:1` to `pending:9`, then `pending:released`,
-- the jobs a concurrency limit held and let go, which the lease takes before all others (ADR 0014).
local function pending_lists(pending)
  local lists = {pending}
  for p = 1, 9 do lists[#lists + 1] = pending .. ':' .. p end
  lists[#lists + 1] = pending .. ':released'
  return lists
end
