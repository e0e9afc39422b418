"""The Lua scripts that keep a key space's blocks and its bookkeeping in step.

Redis runs a script atomically, so two processes (or threads) sharing a key
space never see the byte counts, the recency indexes and the blocks
disagree, and a writer killed mid-call leaves either all of a script's
effects or none.  A **key space** is one namespace (``<prefix>:<namespace>:``,
one tenant's blocks), or, where the tier has ``tenants`` rules, the **pool**
of every namespace under the prefix (``<prefix>:pool:``), whose capacity the
tenants share (a shard of either on a cluster).  Every script takes the space's
six bookkeeping keys:

``KEYS[1]``  a hash of member -> its size in bytes as accounted, and in a pool
             ``<size>:<tenant>``
``KEYS[2]``  a hash of counters: ``used`` (bytes), ``evictions``, ``clock``, the
             pool's ``rules``, ``kept`` (bytes of the kept blocks), ``dated`` (1 once
             a block was given a deadline: only then does a removal drop one), and per tenant
             ``b:<t>`` (bytes held), ``r:<t>`` (blocks refused), ``e:<t>``
             (evicted), ``x:<t>`` (expired), ``k:<t>`` (bytes kept), ``kr:<t>``
             (marks refused)
``KEYS[3]``  a sorted set of member -> the time (ms) its block expires, for the
             blocks written with an ``expire``
``KEYS[4]``  a hash of member -> the time (ms) its block expires at the latest
             (``after``), where ``unused`` may push its expiry back
``KEYS[5]``  a hash of member -> its recency tick, for the blocks kept
             (``kvtier_keep``), which are out of the recency index meanwhile
``KEYS[6]``  a hash of member -> its deadline (ms), for the blocks given one
             (``kvtier_expire``): a TTL alone cannot tell a deadline from ``after``

and a common head of arguments (:data:`HEAD`), then its own.  A **member**
names a block in its space: the user key in a namespace's space,
``<namespace>:b:<key>`` in a pool; its data key is ``<data head><member>``.
Recency is one sorted set per tenant, ``<lru head><tenant>`` (a namespace's
space has one, ``<lru head>``), of member -> tick (oldest lowest).

Sizes are kept apart from the data so that the byte counts stay right when a
block's bytes change or vanish behind the backend's back (the kit's
``kit_tamper``, an operator's ``DEL``, Redis expiring it).  Counters are
bumped per block, not once at the end: a script stopped by an error (out of
memory) keeps what it did before, and the count must cover exactly that.

**Expired blocks.**  Redis deletes a block when its TTL runs out and tells no
one (keyspace events are not delivered reliably).  Every script first
sweeps: it takes the members whose expiry time has passed from ``KEYS[3]``
(1000 at most per call) and counts off those whose data key is gone, as
``x:<tenant>``.  So the counts hold an expired block's bytes until the next
script on its space (a put, get, evict or ``stats()`` of any process).

**Kept blocks** (:data:`KEEP`) are taken out of their tenant's recency index
while marked, so the eviction of a put, which takes the oldest member of an
index, never meets them and pays nothing for them: no put looks at the marks.
Their bytes still count in ``used`` and ``b:<tenant>`` (a kept block holds
its room), so a tenant that only kept blocks could give room for has none to
give: a put that needs it is refused.  Where the victim tenant has nothing
but kept blocks left, the next tenant most beyond its share gives the room,
as :mod:`kvtier.backends.fs.pool_tenants` does.  Every removal of a block's
bookkeeping (:func:`forget`: an explicit evict, an expiry, a block found
gone) drops its mark with it, so expiry wins over keep and a block stored
again is unmarked.  A block's deadline (:data:`DEADLINE`) is dropped there too,
so a block stored again has none.

**The victim of a full pool** is chosen by :func:`victim` below, which applies
the rule of :meth:`kvtier.policies.tenancy.TenantRules.victim` (and its
``shares``) step for step: the tenant most beyond its share, counting the put
as its writer's; on a tie the writer, then the first by name (byte order).
``tests/contrib/test_redis_tenants.py`` checks that the two agree on a set of
cases.  Lua counts in doubles: the shares are exact while capacity x quota
stays below 2**53 (the split of oversubscribed quotas) and the weights are
whole numbers; beyond that a share may differ by a few bytes.
"""

from __future__ import annotations

import hashlib

__all__ = ["DEADLINE", "EVICT", "HEAD", "KEEP", "LEFT", "PUT", "STATS", "TOUCH", "sha1"]

#: The arguments every script takes first, in order.
HEAD = ("data head", "lru head", "pooled (1 or 0)", "tenant", "own member prefix",
        "capacity (0: none)", "rules (canonical JSON, empty: none)", "after (ms, 0: none)",
        "unused (ms, 0: none)")

_PRELUDE = r"""
local sizes, meta, expiry, limits, kept = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local deadlines = KEYS[6]
local dhead, lruhead, pooled, writer, own = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4], ARGV[5]
local capacity = tonumber(ARGV[6])
local rules = nil
if ARGV[7] ~= '' then rules = cjson.decode(ARGV[7]) end
local after, unused = tonumber(ARGV[8]), tonumber(ARGV[9])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- `dated`: the space was ever given a deadline (until then no removal looks for one)
local counts = redis.call('HMGET', meta, 'used', 'dated')
local used, dated, held = tonumber(counts[1] or '0'), counts[2] ~= false, {}

local function lru(tenant)
  if pooled then return lruhead .. tenant end
  return lruhead
end

-- a member's accounted size and tenant; nil if it has none (or, lenient, a damaged one)
local function entry(member, lenient)
  local value = redis.call('HGET', sizes, member)
  if not value then return nil end
  local size, tenant = string.match(value, '^(%d+):?(.*)$')
  if not size then
    if lenient then return nil end
    return error('kvtier: damaged size of ' .. member .. ': ' .. value)
  end
  if not pooled or tenant == '' then tenant = writer end
  return tonumber(size), tenant
end

-- drop a member's bookkeeping (not its data); counter: 'e:' or 'x:' or nil;
-- `indexed`: taken from a recency index, so not kept (a mark takes it out)
local function forget(member, counter, indexed)
  redis.call('ZREM', expiry, member)
  local size, tenant = entry(member)
  if not size then return nil end
  redis.call('HDEL', sizes, member)
  redis.call('HDEL', limits, member)
  redis.call('ZREM', lru(tenant), member)
  if not indexed and redis.call('HDEL', kept, member) == 1 then  -- expiry, evict win
    redis.call('HINCRBY', meta, 'kept', -size)
    redis.call('HINCRBY', meta, 'k:' .. tenant, -size)
  end
  if dated then redis.call('HDEL', deadlines, member) end  -- a block stored again has none
  used = redis.call('HINCRBY', meta, 'used', -size)
  held[tenant] = redis.call('HINCRBY', meta, 'b:' .. tenant, -size)
  if counter then redis.call('HINCRBY', meta, counter .. tenant, 1) end
  return size
end

-- count off the blocks Redis expired (their keys are gone)
local function sweep()
  local due = redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, 1000)
  for _, member in ipairs(due) do
    local left = redis.call('PTTL', dhead .. member)
    if left == -2 then forget(member, 'x:')
    elseif left == -1 then redis.call('ZREM', expiry, member)
    else redis.call('ZADD', expiry, now + left, member) end
  end
end

-- a use of a stored member: its tick in the recency index, or in its mark if kept
local function use(member, tenant, tick)
  if redis.call('ZADD', lru(tenant), 'XX', 'CH', tick, member) == 0
      and redis.call('HEXISTS', kept, member) == 1 then
    redis.call('HSET', kept, member, tick)
  end
end

-- a use pushes back an expiry after `unused`, never past `after`
local function refresh(member)
  if unused <= 0 then return end
  local deadline = now + unused
  local latest = tonumber(redis.call('HGET', limits, member) or '0')
  if latest > 0 and latest < deadline then deadline = latest end
  if redis.call('PEXPIREAT', dhead .. member, deadline) == 1 then
    redis.call('ZADD', expiry, deadline, member)
  end
end

sweep()  -- keeps `used` in step (forget)
"""

_VICTIM = r"""
-- byte order: Lua's < on strings follows the server's locale
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- TenantRules.rule: quota (nil: none) and weight
local function rule(tenant)
  local found = rules and (rules[tenant] or rules['*'])
  if not found then return nil, 1 end
  local quota = found[1]
  if quota == cjson.null then quota = nil end
  return quota, found[2]
end

-- TenantRules.shares, for tenants in byte order
local function shares(tenants)
  local out, quotas, total, given, weight = {}, {}, 0, 0, 0
  for _, t in ipairs(tenants) do
    local quota, w = rule(t)
    if quota then
      quotas[t] = math.min(quota, capacity)
      total = total + quotas[t]
    else
      weight = weight + w
    end
  end
  for _, t in ipairs(tenants) do
    if quotas[t] then
      out[t] = quotas[t]
      if total > capacity then out[t] = math.floor(capacity * quotas[t] / total) end
      given = given + out[t]
    end
  end
  local rest = math.max(0, capacity - given)
  for _, t in ipairs(tenants) do
    if not quotas[t] then
      local _, w = rule(t)
      out[t] = 0
      if weight > 0 then out[t] = math.floor(rest * w / weight) end
    end
  end
  return out
end

-- TenantRules.victim: the tenant most beyond its share, the put counted as the
-- writer's; on a tie the writer, then the first in byte order.  Tenants in
-- `empty` (found with nothing evictable: all kept) count as holding nothing
local function victim(size, empty)
  empty = empty or {}
  local tenants, present = {}, false
  for t, n in pairs(held) do
    if n > 0 and not empty[t] then
      tenants[#tenants + 1] = t
      if t == writer then present = true end
    end
  end
  if not present then tenants[#tenants + 1] = writer end
  table.sort(tenants, before)
  local share = shares(tenants)
  local best, best_over, best_writes = nil, 0, false
  for _, t in ipairs(tenants) do
    local over = (held[t] or 0) - share[t]
    if empty[t] then over = -share[t] end
    if t == writer then over = over + size end
    local writes = t == writer
    if not best or over > best_over or (over == best_over and writes and not best_writes) then
      best, best_over, best_writes = t, over, writes
    end
  end
  return best
end
"""

#: Store blocks.  ARGV after :data:`HEAD`: a member and a block per block.
#: A block is stored once there is room: beyond its tenant's quota the tenant's
#: own least recently used blocks go first; beyond the capacity the victim
#: tenant's (:func:`victim`).  A block that cannot fit is refused, counted in
#: ``r:<tenant>``.  Answers ``{stored, evicted}``: 1 or 0 per block, and the
#: evicted blocks of this namespace as a flat list ``key, block, ...`` (the
#: member less the own prefix) for the caller to hand to a lower tier; victims
#: of other namespaces are deleted and counted, not answered.
PUT = _PRELUDE + _VICTIM + r"""
local n = (#ARGV - 9) / 2
local clock = redis.call('HINCRBY', meta, 'clock', n) - n
if pooled then
  local all = redis.call('HGETALL', meta)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'b:' then held[string.sub(all[i], 3)] = tonumber(all[i + 1]) end
  end
else
  held[writer] = used
end
local evicted, stored = {}, {}

local function evict_oldest(tenant)
  local member = redis.call('ZRANGE', lru(tenant), 0, 0)[1]
  if not member then return false end
  local dkey = dhead .. member
  local mine = string.sub(member, 1, #own) == own
  local data = nil
  if mine then data = redis.call('GET', dkey) end
  if data or (not mine and redis.call('EXISTS', dkey) == 1) then
    redis.call('DEL', dkey)
    if not forget(member, 'e:', true) then redis.call('ZREM', lru(tenant), member) end
    redis.call('HINCRBY', meta, 'evictions', 1)
    if data then
      evicted[#evicted + 1] = string.sub(member, #own + 1)
      evicted[#evicted + 1] = data
    end
  elseif not forget(member, 'x:', true) then  -- gone already: expired (or a DEL)
    redis.call('ZREM', lru(tenant), member)
  end
  return true
end

for i = 1, n do
  local member, block = ARGV[8 + 2 * i], ARGV[9 + 2 * i]
  local dkey, size = dhead .. member, #block
  if redis.call('EXISTS', dkey) == 1 then
    -- immutable per key: keep what is there, count the put as a use
    local _, tenant = entry(member)
    use(member, tenant or writer, clock + i)
    refresh(member)
    stored[i] = 1
  else
    forget(member)  -- indexed but gone: forget it before accounting anew
    local quota = nil
    if pooled then quota = rule(writer) end
    local fits = (not quota or size <= quota) and (capacity <= 0 or size <= capacity)
    if fits and quota then
      while (held[writer] or 0) + size > quota and evict_oldest(writer) do end
      fits = (held[writer] or 0) + size <= quota
    end
    if fits and capacity > 0 then
      local empty = {}  -- tenants with nothing but kept blocks left
      while used + size > capacity do
        local tenant = writer
        if pooled then tenant = victim(size, empty) end
        if evict_oldest(tenant) then
        elseif pooled and not empty[tenant] then empty[tenant] = true
        else break end
      end
      fits = used + size <= capacity
    end
    if fits then
      local deadline = 0
      if after > 0 then deadline = now + after end
      if unused > 0 and (deadline == 0 or now + unused < deadline) then deadline = now + unused end
      if deadline > 0 then
        redis.call('SET', dkey, block, 'PXAT', deadline)
        redis.call('ZADD', expiry, deadline, member)
        if after > 0 and unused > 0 then redis.call('HSET', limits, member, now + after) end
      else
        redis.call('SET', dkey, block)
      end
      redis.call('ZADD', lru(writer), clock + i, member)
      if pooled then
        redis.call('HSET', sizes, member, size .. ':' .. writer)
      else
        redis.call('HSET', sizes, member, size)
      end
      used = redis.call('HINCRBY', meta, 'used', size)
      held[writer] = redis.call('HINCRBY', meta, 'b:' .. writer, size)
      stored[i] = 1
    else
      redis.call('HINCRBY', meta, 'r:' .. writer, 1)
      stored[i] = 0
    end
  end
end
return {stored, evicted}
"""

#: Remove blocks.  ARGV after :data:`HEAD`: members.  Answers 1 per block this
#: call removed, 0 per member that held none.
EVICT = _PRELUDE + r"""
local removed = {}
for i = 10, #ARGV do
  removed[i - 9] = redis.call('DEL', dhead .. ARGV[i])
  forget(ARGV[i])
end
return removed
"""

#: Mark blocks as just used, and push back their expiry after ``unused``.
#: ARGV after :data:`HEAD`: members.  Members not stored are left alone, so a
#: read may touch its misses too and save a round trip.
TOUCH = _PRELUDE + r"""
local n = #ARGV - 9
local clock = redis.call('HINCRBY', meta, 'clock', n) - n
for i = 1, n do
  local member = ARGV[9 + i]
  local size, tenant = entry(member, true)  -- a read never fails on bookkeeping
  if size then
    use(member, tenant, clock + i)
    refresh(member)
  end
end
return n
"""

#: Mark blocks kept, or release them.  ARGV after :data:`HEAD`: ``1`` (mark) or
#: ``0`` (release), then members.  Answers per member 1 (kept; released), 0
#: (refused: beyond its tenant's budget or, all tenants' together, the capacity,
#: counted in ``kr:<writer>``; or a block the space does not account) or -1 (not
#: stored: a member whose block is gone is forgotten first, so an expired block
#: is no longer kept).  A mark takes the member out of its recency index, with
#: its tick; a release puts it back at that tick (:func:`use` moves it on).
KEEP = _PRELUDE + r"""
local mark = ARGV[10] == '1'
local answers = {}
local total = tonumber(redis.call('HGET', meta, 'kept') or '0')

-- TenantRules: the tenant's retention budget, `keep`, at most its quota
local function budget(tenant)
  local found = rules and (rules[tenant] or rules['*'])
  if not found then return 0 end
  local keep, quota = found[3] or 0, found[1]
  if quota ~= cjson.null and quota < keep then keep = quota end
  return keep
end

for i = 11, #ARGV do
  local member = ARGV[i]
  local size, tenant = entry(member, true)
  local answer = 1
  if redis.call('EXISTS', dhead .. member) == 0 then
    forget(member, 'x:')  -- gone already: expired (or an operator's DEL)
    answer = -1
  elseif not size then
    answer = 0  -- stored behind the space's back: not counted, so not kept
  elseif mark then
    if redis.call('HEXISTS', kept, member) == 0 then
      local mine = tonumber(redis.call('HGET', meta, 'k:' .. tenant) or '0')
      if mine + size > budget(tenant) or (capacity > 0 and total + size > capacity) then
        redis.call('HINCRBY', meta, 'kr:' .. writer, 1)
        answer = 0
      else
        local tick = redis.call('ZSCORE', lru(tenant), member) or '0'
        redis.call('ZREM', lru(tenant), member)
        redis.call('HSET', kept, member, tick)
        total = redis.call('HINCRBY', meta, 'kept', size)
        redis.call('HINCRBY', meta, 'k:' .. tenant, size)
      end
    end
  else
    local tick = redis.call('HGET', kept, member)
    if tick then
      redis.call('HDEL', kept, member)
      redis.call('ZADD', lru(tenant), tick, member)
      total = redis.call('HINCRBY', meta, 'kept', -size)
      redis.call('HINCRBY', meta, 'k:' .. tenant, -size)
    end
  end
  answers[i - 10] = answer
end
return answers
"""

#: Give blocks a deadline (``kvtier_expire``).  ARGV after :data:`HEAD`: the time
#: (ms) from now, then members.  A block's TTL is brought forward to the deadline,
#: never put off (a later deadline, or the tier's own ``after``, leaves the earlier),
#: and entered in ``KEYS[3]`` so the sweep counts it off once Redis expires it; with
#: ``unused``, ``KEYS[4]`` holds the deadline as the latest a use may push its expiry
#: to.  The earlier of the block's deadlines is recorded in ``KEYS[6]`` (for :data:`LEFT`),
#: where the space accounts the block (:func:`forget` drops it).  Answers per member
#: 1 (set) or -1 (not stored: a member whose block is gone is forgotten first).
DEADLINE = _PRELUDE + r"""
local deadline = now + tonumber(ARGV[10])
local answers = {}
for i = 11, #ARGV do
  local member = ARGV[i]
  local left = redis.call('PTTL', dhead .. member)
  local answer = 1
  if left == -2 then
    forget(member, 'x:')  -- gone already: expired (or an operator's DEL)
    answer = -1
  else
    if left == -1 or now + left > deadline then
      redis.call('PEXPIREAT', dhead .. member, deadline)
      redis.call('ZADD', expiry, deadline, member)
    end
    local latest = tonumber(redis.call('HGET', limits, member) or '0')
    if unused > 0 and (latest == 0 or latest > deadline) then
      redis.call('HSET', limits, member, deadline)
    end
    local known = tonumber(redis.call('HGET', deadlines, member) or '0')
    if (known == 0 or known > deadline) and entry(member, true) then
      redis.call('HSET', deadlines, member, deadline)
      if not dated then
        redis.call('HSET', meta, 'dated', 1)
        dated = true
      end
    end
  end
  answers[i - 10] = answer
end
return answers
"""

#: The deadlines left (``kvtier_deadlines``), in the server's time, so no client's
#: clock need agree with it.  ARGV after :data:`HEAD`: members.  Answers per member
#: the milliseconds left before its deadline, above 0, or -1 (not stored, no deadline,
#: or past it).  Only deadlines count: a TTL from the tier's own ``expire`` is not one.
LEFT = _PRELUDE + r"""
local answers = {}
for i = 10, #ARGV do
  local member = ARGV[i]
  local at = tonumber(redis.call('HGET', deadlines, member) or '0')
  local answer = -1
  if at > now then
    -- a deadline holds the TTL to it: a block without a TTL (an operator's PERSIST),
    -- or with a later one, no longer expires by it (a second's slack: PTTL counts
    -- from the script's start, `now` from its TIME call)
    local ttl = redis.call('PTTL', dhead .. member)
    if ttl >= 0 and now + ttl <= at + 1000 then answer = at - now end
  end
  answers[i - 9] = answer
end
return answers
"""

#: The counters after a sweep: ``{HGETALL meta, blocks, kept blocks}``.
STATS = _PRELUDE + r"""
return {redis.call('HGETALL', meta), redis.call('HLEN', sizes), redis.call('HLEN', kept)}
"""

ALL = (PUT, EVICT, TOUCH, STATS, KEEP, DEADLINE, LEFT)


def sha1(script: str) -> str:
    """The digest ``EVALSHA`` names ``script`` by (what ``SCRIPT LOAD`` answers)."""
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()
