"""The Lua scripts of the Redis/Valkey fleet index (layout: docs/FLEET.md, "Redis layout").

Every write goes through one script call, so each batch is applied atomically with its
sequence check: concurrent writers (several router processes subscribed to the same
publishers) apply each batch exactly once, and a retried call after a lost reply finds
its batch applied (by its own call id). A script validates everything before its first
write (Redis does not roll back a script that fails half-way).

Common ARGV head: prefix, epoch, worker, now. A script returns ``{"epoch"}`` when the
server's epoch differs from the client's (the server lost its data: restart, flush).

Sequence numbers (``next_seq``, ``max_seen``, a batch's ``seq``) are 20-digit zero-padded
decimal strings (``seq_text``), compared as strings: exact over the whole range a
sequence number takes (Lua numbers are doubles, exact only below 2**53). The client
computes a batch's successor.
"""

from __future__ import annotations

SEQ_WIDTH = 20


def seq_text(seq: int) -> str:
    """A sequence number as the scripts store and compare it."""
    return format(seq, f"0{SEQ_WIDTH}d")


_ZERO = seq_text(0)


# Shared helpers: worker registration (slot allocation), health line, clearing a worker.
_COMMON = (
    r"""
local ZERO = '"""
    + _ZERO
    + r"""'
local P = ARGV[1]
if redis.call('GET', P .. ':epoch') ~= ARGV[2] then return {'epoch'} end
local worker = ARGV[3]
local now = ARGV[4]
local wkey = P .. ':w:' .. worker
local ckey = P .. ':c:' .. worker

local function register()
  local slot = redis.call('HGET', wkey, 'slot')
  if slot then return tonumber(slot) end
  -- the most recently freed slot first (as the embedded index)
  slot = redis.call('RPOP', P .. ':freeslots')
  if not slot then slot = redis.call('INCR', P .. ':nslots') - 1 end
  redis.call('HSET', wkey, 'slot', slot, 'next_seq', ZERO, 'last_seen', now,
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
)

# ARGV: head, seq ('' = none), seq + 1, dp_rank ('' = leave as is: event objects; '-' = a
# batch without one), max_media, ts ('' = none), call id ('' = none), then ops: kind
# ('s' stored, 'r' removed, 'c' cleared), medium, n, n hex hashes.
# Returns {outcome} with outcome 'applied' / 'duplicate' / 'gap', or {'error', msg} (a
# batch naming too many media: counted on the worker, nothing else written). A call with a
# sequence number has a random id; the worker keeps the id and outcome of the last call
# that counted or applied one of its batches (last_call): a retry of that call after a
# lost reply gets the same outcome and is not counted twice (a batch it applied is
# 'applied').
APPLY = (
    _COMMON
    + r"""
local max_media = tonumber(ARGV[8])
-- validate: new media within the limit (before any write)
local mkey = P .. ':media'
local known = redis.call('HLEN', mkey)
local new = {}
local names = {}
local nnew = 0
local ts = ARGV[9]
local call = ARGV[10]
local i = 11
while i <= #ARGV do
  local kind, medium, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if kind ~= 'c' and not new[medium] and redis.call('HEXISTS', mkey, medium) == 0 then
    new[medium] = true
    nnew = nnew + 1
    -- quoted as the embedded index's message quotes them
    local q = medium:gsub('[\\"]', '\\%0'):gsub('\n', '\\n'):gsub('\r', '\\r')
    names[nnew] = '"' .. q:gsub('\t', '\\t') .. '"'
    -- checked as each one comes (as the embedded index), so the message lists few
    if known + nnew > max_media then break end
  end
  i = i + 3 + n
end
if known + nnew > max_media then
  local msg = 'more than ' .. max_media .. ' distinct media (new: [' ..
    table.concat(names, ', ') .. '])'
  local slot = register()
  redis.call('HINCRBY', wkey, 'errors', 1)
  redis.call('HSET', wkey, 'last_error', msg)
  health(slot)
  return {'error', msg}
end

local slot = register()
local last = tonumber(redis.call('HGET', wkey, 'last_seen'))
if tonumber(now) > last then redis.call('HSET', wkey, 'last_seen', now) end
if ARGV[5] ~= '' then
  local seq = ARGV[5]
  local nxt = redis.call('HGET', wkey, 'next_seq')
  -- the outcome of the last call that counted or applied a batch of this worker
  local last = redis.call('HGET', wkey, 'last_call') or ''
  if seq == ZERO and nxt ~= ZERO and ts ~= '' and ts ~= redis.call('HGET', wkey, 'first_ts') then
    redis.call('HINCRBY', wkey, 'restarts', 1)
    redis.call('HDEL', wkey, 'max_seen')
    clear(slot)
  elseif seq < nxt then
    -- a retry of the call that applied it (its reply was lost): applied, counted once
    if last == call .. ':applied' then
      health(slot)
      return {'applied'}
    end
    if last ~= call .. ':duplicate' then
      redis.call('HINCRBY', wkey, 'duplicates', 1)
      redis.call('HSET', wkey, 'last_call', call .. ':duplicate')
    end
    health(slot)
    return {'duplicate'}
  elseif seq > nxt then
    if last ~= call .. ':gap' then
      redis.call('HINCRBY', wkey, 'gaps', 1)
      redis.call('HSET', wkey, 'last_call', call .. ':gap')
    end
    local ms = redis.call('HGET', wkey, 'max_seen')
    if not ms or ms < seq then redis.call('HSET', wkey, 'max_seen', seq) end
    health(slot)
    return {'gap'}
  end
end

local events = 0
local unknown = 0
i = 11
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
if ARGV[7] == '-' then
  redis.call('HDEL', wkey, 'dp_rank')
elseif ARGV[7] ~= '' then
  redis.call('HSET', wkey, 'dp_rank', ARGV[7])
end
if ARGV[5] ~= '' then
  local nxt = ARGV[6]
  redis.call('HSET', wkey, 'next_seq', nxt, 'last_call', call .. ':applied')
  if ARGV[5] == ZERO then
    if ts ~= '' then
      redis.call('HSET', wkey, 'first_ts', ts)
    else
      redis.call('HDEL', wkey, 'first_ts')
    end
  end
  local ms = redis.call('HGET', wkey, 'max_seen')
  if ms and ms < nxt then redis.call('HDEL', wkey, 'max_seen') end
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

# ARGV: head. A worker this client knew before the server lost its data: registered
# again unless someone did already, stale (expecting batch 0, a gap seen: what it holds
# is unknown until a replay from 0 or a reset). Returns {'ok'} / {'kept'}.
MARK_LOST = (
    _COMMON
    + r"""
if redis.call('EXISTS', wkey) == 1 then return {'kept'} end
local slot = register()
redis.call('HSET', wkey, 'max_seen', ZERO)
health(slot)
return {'ok'}
"""
)

# ARGV: head, mode ('remove' | 'reset'), next_seq (reset, as seq_text) or the TTL (remove;
# '' = unconditional: a worker not expired at the head's time, `now - last_seen > ttl` in
# doubles as the core computes it, is kept).
# Returns {'ok'} / {'unknown'} / {'kept'}.
DROP_WORKER = (
    _COMMON
    + r"""
local slot = redis.call('HGET', wkey, 'slot')
if not slot then return {'unknown'} end
slot = tonumber(slot)
if ARGV[5] == 'remove' then
  local seen = tonumber(redis.call('HGET', wkey, 'last_seen'))
  if ARGV[6] ~= '' and not (tonumber(now) - seen > tonumber(ARGV[6])) then
    return {'kept'}
  end
  clear(slot)
  redis.call('DEL', wkey)
  redis.call('HDEL', P .. ':health', worker)
  redis.call('RPUSH', P .. ':freeslots', slot)
else
  clear(slot)
  redis.call('HSET', wkey, 'next_seq', ARGV[6])
  redis.call('HDEL', wkey, 'max_seen', 'first_ts', 'last_call')
  health(slot)
end
return {'ok'}
"""
)
