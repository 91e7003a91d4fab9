-- The fields of <prefix>settings that the scripts read and count in, named as daemon/jobcar/queue_settings.py
-- names them (tests/unit/test_lua_keys.py holds the two together): the queue's backpressure bound, the jobs the
-- bounds refused, and what the field of a type's bound starts with (the type's name follows).
local MAX_PENDING_FIELD = 'max_pending'
local REFUSED_FIELD = 'refused'
local TYPE_BOUND_PREFIX = 'max_pending:'
