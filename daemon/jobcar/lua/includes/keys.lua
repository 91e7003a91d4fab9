-- The keys of a queue that the scripts name from its prefix (ARGV[1], "<namespace>:{<queue>}:"), each named
-- as daemon/jobcar/keys.py's QueueKeys names it: a script builds a key's name here and nowhere else
-- (tests/unit/test_lua_keys.py holds the two together). Each is one line, which jobcar's loader inlines
-- (scripts.py): a name built here costs what it cost written out, on the hot path too.
local function job_key_of(prefix, id) return prefix .. 'job:' .. id end
local function waiter_key_of(prefix, id) return prefix .. 'waiter:' .. id end
local function log_key_of(prefix, id) return prefix .. 'log:' .. id end
local function steps_key_of(prefix, id) return prefix .. 'steps:' .. id end
local function children_key_of(prefix, id) return prefix .. 'children:' .. id end
local function unique_key_of(prefix, unique) return prefix .. 'unique:' .. unique end
local function window_key_of(prefix, unique) return prefix .. 'window:' .. unique end
local function debounce_key_of(prefix, debounce) return prefix .. 'debounce:' .. debounce end
local function schedule_key_of(prefix, name) return prefix .. 'schedule:' .. name end
local function batch_key_of(prefix, batch) return prefix .. 'batch:' .. batch end
local function deps_key_of(prefix, id) return prefix .. 'deps:' .. id end
local function dependents_key_of(prefix, id) return prefix .. 'dependents:' .. id end
local function history_key_of(prefix, hour) return prefix .. 'history:' .. hour end
local function slots_key_of(prefix, job_type) return prefix .. 'slots:' .. job_type end
local function held_key_of(prefix, group) return prefix .. 'held:' .. group end
local function tat_key_of(prefix, group) return prefix .. 'tat:' .. group end
local function turns_key_of(prefix, job_type) return prefix .. 'turns:' .. job_type end
local function pending_key_of(prefix) return prefix .. 'pending' end
local function dead_key_of(prefix) return prefix .. 'dead' end
local function released_key_of(prefix) return prefix .. 'pending:released' end
local function wake_key_of(prefix) return prefix .. 'wake' end
local function waiting_key_of(prefix) return prefix .. 'waiting' end
local function settled_key_of(prefix) return prefix .. 'settled' end
local function limit_groups_key_of(prefix) return prefix .. 'limit_groups' end
local function throttled_key_of(prefix) return prefix .. 'throttled' end
local function settings_key_of(prefix) return prefix .. 'settings' end
local function pending_counts_key_of(prefix) return prefix .. 'pending_counts' end
