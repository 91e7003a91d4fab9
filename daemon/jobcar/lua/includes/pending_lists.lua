-- Every pending list of a queue, in lease order: `pending` (priority 0), then `pending:1` to `pending:9`.
local function pending_lists(pending)
  local lists = {pending}
  for p = 1, 9 do lists[#lists + 1] = pending .. ':' .. p end
  return lists
end
