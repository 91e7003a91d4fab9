-- Every pending list of a queue: `pending` (priority 0), `pending:1` to `pending:9`, then `pending:released`,
-- the jobs a concurrency limit held and let go, which the lease takes before all others (ADR 0014): keys.py's
-- QueueKeys.pending_lists, which tests/unit/test_lua_keys.py holds to this one.
-- Each level's digit is written out: a number made a string for a name costs a lease or a bounded enqueue what
-- the rest of its look at the lists does (Lua formats it).
local function pending_lists(pending)
  return {pending, pending .. ':1', pending .. ':2', pending .. ':3', pending .. ':4', pending .. ':5',
    pending .. ':6', pending .. ':7', pending .. ':8', pending .. ':9', pending .. ':released'}
end
