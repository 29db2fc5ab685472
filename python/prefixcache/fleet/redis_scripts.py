"""The Lua scripts of the Redis/Valkey fleet index (layout: docs/FLEET.md, "Redis layout").

Every write goes through one script call, so each batch is applied atomically with its
sequence check: concurrent writers (several router processes subscribed to the same
publishers) apply each batch exactly once, and a retried call after a lost reply is a
duplicate. A script validates everything before its first write (Redis does not roll back
a script that fails half-way).

Common ARGV head: prefix, epoch, worker, now. A script returns ``{"epoch"}`` when the
server's epoch differs from the client's (the server lost its data: restart, flush).
"""

from __future__ import annotations

# Shared helpers: worker registration (slot allocation), health line, clearing a worker.
_COMMON = r"""
local P = ARGV[1]
if redis.call('GET', P .. ':epoch') ~= ARGV[2] then return {'epoch'} end
local worker = ARGV[3]
local now = ARGV[4]
local wkey = P .. ':w:' .. worker
local ckey = P .. ':c:' .. worker

local function register()
  local slot = redis.call('HGET', wkey, 'slot')
  if slot then return tonumber(slot) end
  slot = redis.call('LPOP', P .. ':freeslots')
  if not slot then slot = redis.call('INCR', P .. ':nslots') - 1 end
  redis.call('HSET', wkey, 'slot', slot, 'next_seq', 0, 'last_seen', now,
    'batches', 0, 'block_events', 0, 'duplicates', 0, 'gaps', 0, 'restarts', 0,
    'unknown_removals', 0, 'errors', 0)
  return tonumber(slot)
end

local function health(slot)
  local v = redis.call('HMGET', wkey, 'next_seq', 'max_seen', 'last_seen')
  redis.call('HSET', P .. ':health', worker,
    slot .. ' ' .. v[1] .. ' ' .. (v[2] or '-') .. ' ' .. v[3])
end

local function clear(slot)
  local fields = redis.call('HKEYS', ckey)
  for _, f in ipairs(fields) do
    local bkey = P .. ':b:' .. f
    redis.call('SETBIT', bkey, slot, 0)
    if redis.call('BITCOUNT', bkey) == 0 then redis.call('DEL', bkey) end
  end
  redis.call('DEL', ckey)
end
"""

# ARGV: head, seq ('' = none), dp_rank ('' = none), max_media, ts ('' = none), then ops:
# kind ('s' stored, 'r' removed, 'c' cleared), medium, n, n hex hashes.
# Returns {outcome} with outcome 'applied' / 'duplicate' / 'gap', or {'error', msg}.
APPLY = (
    _COMMON
    + r"""
local max_media = tonumber(ARGV[7])
-- validate: new media within the limit (before any write)
local mkey = P .. ':media'
local known = redis.call('HLEN', mkey)
local new = {}
local nnew = 0
local ts = ARGV[8]
local i = 9
while i <= #ARGV do
  local kind, medium, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if kind ~= 'c' and not new[medium] and redis.call('HEXISTS', mkey, medium) == 0 then
    new[medium] = true
    nnew = nnew + 1
  end
  i = i + 3 + n
end
if known + nnew > max_media then
  return {'error', 'more than ' .. max_media .. ' distinct media'}
end

local slot = register()
local last = tonumber(redis.call('HGET', wkey, 'last_seen'))
if tonumber(now) > last then redis.call('HSET', wkey, 'last_seen', now) end
if ARGV[5] ~= '' then
  local seq = tonumber(ARGV[5])
  local nxt = tonumber(redis.call('HGET', wkey, 'next_seq'))
  if seq == 0 and nxt > 0 and ts ~= '' and ts ~= redis.call('HGET', wkey, 'first_ts') then
    redis.call('HINCRBY', wkey, 'restarts', 1)
    redis.call('HDEL', wkey, 'max_seen')
    clear(slot)
  elseif seq < nxt then
    redis.call('HINCRBY', wkey, 'duplicates', 1)
    health(slot)
    return {'duplicate'}
  elseif seq > nxt then
    redis.call('HINCRBY', wkey, 'gaps', 1)
    local ms = redis.call('HGET', wkey, 'max_seen')
    if not ms or tonumber(ms) < seq then redis.call('HSET', wkey, 'max_seen', ARGV[5]) end
    health(slot)
    return {'gap'}
  end
end

local events = 0
local unknown = 0
i = 9
while i <= #ARGV do
  local kind, medium, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if kind == 'c' then
    clear(slot)
    events = events + 1
  else
    local mid = redis.call('HGET', mkey, medium)
    if not mid then
      mid = redis.call('HLEN', mkey)
      redis.call('HSET', mkey, medium, mid)
    end
    for j = i + 3, i + 2 + n do
      local f = mid .. ':' .. ARGV[j]
      if kind == 's' then
        if redis.call('HINCRBY', ckey, f, 1) == 1 then
          redis.call('SETBIT', P .. ':b:' .. f, slot, 1)
        end
      else
        local c = redis.call('HGET', ckey, f)
        if not c then
          unknown = unknown + 1
        elseif c == '1' then
          redis.call('HDEL', ckey, f)
          local bkey = P .. ':b:' .. f
          redis.call('SETBIT', bkey, slot, 0)
          if redis.call('BITCOUNT', bkey) == 0 then redis.call('DEL', bkey) end
        else
          redis.call('HINCRBY', ckey, f, -1)
        end
      end
    end
    events = events + n
  end
  i = i + 3 + n
end
redis.call('HINCRBY', wkey, 'batches', 1)
redis.call('HINCRBY', wkey, 'block_events', events)
if unknown > 0 then redis.call('HINCRBY', wkey, 'unknown_removals', unknown) end
if ARGV[6] ~= '' then redis.call('HSET', wkey, 'dp_rank', ARGV[6]) end
if ARGV[5] ~= '' then
  local nxt = tonumber(ARGV[5]) + 1
  redis.call('HSET', wkey, 'next_seq', nxt)
  if nxt == 1 then
    if ts ~= '' then
      redis.call('HSET', wkey, 'first_ts', ts)
    else
      redis.call('HDEL', wkey, 'first_ts')
    end
  end
  local ms = redis.call('HGET', wkey, 'max_seen')
  if ms and tonumber(ms) < nxt then redis.call('HDEL', wkey, 'max_seen') end
end
health(slot)
return {'applied'}
"""
)

# ARGV: head, message. Counts a rejected batch on the worker (registering it).
RECORD_ERROR = (
    _COMMON
    + r"""
local slot = register()
redis.call('HINCRBY', wkey, 'errors', 1)
redis.call('HSET', wkey, 'last_error', ARGV[5])
health(slot)
return {'ok'}
"""
)

# ARGV: head. Registers a worker.
ADD_WORKER = (
    _COMMON
    + r"""
local slot = register()
health(slot)
return {'ok'}
"""
)

# ARGV: head, mode ('remove' | 'reset'), next_seq (reset) or last_seen limit (remove;
# '' = unconditional: a worker seen after the limit is kept).
# Returns {'ok'} / {'unknown'} / {'kept'}.
DROP_WORKER = (
    _COMMON
    + r"""
local slot = redis.call('HGET', wkey, 'slot')
if not slot then return {'unknown'} end
slot = tonumber(slot)
if ARGV[5] == 'remove' then
  if ARGV[6] ~= '' and tonumber(redis.call('HGET', wkey, 'last_seen')) >= tonumber(ARGV[6]) then
    return {'kept'}
  end
  clear(slot)
  redis.call('DEL', wkey)
  redis.call('HDEL', P .. ':health', worker)
  redis.call('RPUSH', P .. ':freeslots', slot)
else
  clear(slot)
  redis.call('HSET', wkey, 'next_seq', ARGV[6])
  redis.call('HDEL', wkey, 'max_seen', 'first_ts')
  health(slot)
end
return {'ok'}
"""
)
