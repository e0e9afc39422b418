"""The Lua scripts that keep a namespace's blocks and its bookkeeping in step.

Redis runs a script atomically, so two processes (or threads) sharing a
namespace never see the byte count, the recency index and the blocks
disagree, and a writer killed mid-call leaves either all of a script's
effects or none.  Every script takes the namespace's three bookkeeping keys
first, then one data key per block:

``KEYS[1]``  the recency index, a sorted set of user key -> tick (oldest lowest)
``KEYS[2]``  a hash of user key -> block size in bytes, as accounted
``KEYS[3]``  a hash of counters: ``used`` (bytes), ``evictions``, ``clock``
``KEYS[4..]`` the data keys, ``<prefix>:<namespace>:b:<user key>``

Sizes are kept apart from the data so that the byte count stays right when a
block's bytes change or vanish behind the backend's back (the kit's ``kit_tamper``,
an operator's ``DEL``).  Counters are bumped per block, not once at the end:
a script stopped by an error (out of memory) keeps what it did before, and the
count must cover exactly that.
"""

from __future__ import annotations

import hashlib

__all__ = ["EVICT", "PUT", "TOUCH", "sha1"]

#: Store blocks, evicting least recently used ones while the capacity would
#: be exceeded.  ARGV: capacity (0 for none), data key prefix, then a user key
#: and a block per data key.  Answers the evicted blocks as a flat list
#: ``key, block, key, block, ...`` so the caller can hand them to a lower tier.
PUT = """
local lru, sizes, meta = KEYS[1], KEYS[2], KEYS[3]
local capacity = tonumber(ARGV[1])
local dprefix = ARGV[2]
local n = #KEYS - 3
local clock = redis.call('HINCRBY', meta, 'clock', n) - n
local used = tonumber(redis.call('HGET', meta, 'used') or '0')
local evicted = {}
for i = 1, n do
  local dkey, key, block = KEYS[i + 3], ARGV[2 * i + 1], ARGV[2 * i + 2]
  if redis.call('EXISTS', dkey) == 1 then
    -- immutable per key: keep what is there, count the put as a use
    redis.call('ZADD', lru, 'XX', clock + i, key)
  else
    local stale = redis.call('HGET', sizes, key)
    if stale then
      -- indexed but gone (an operator's DEL): forget it before accounting anew
      used = redis.call('HINCRBY', meta, 'used', -tonumber(stale))
      redis.call('ZREM', lru, key)
      redis.call('HDEL', sizes, key)
    end
    while capacity > 0 and used + #block > capacity do
      local victim = redis.call('ZRANGE', lru, 0, 0)[1]
      if not victim then break end
      local vkey = dprefix .. victim
      local data = redis.call('GET', vkey)
      local size = tonumber(redis.call('HGET', sizes, victim) or '0')
      redis.call('DEL', vkey)
      redis.call('ZREM', lru, victim)
      redis.call('HDEL', sizes, victim)
      used = redis.call('HINCRBY', meta, 'used', -size)
      redis.call('HINCRBY', meta, 'evictions', 1)
      if data then
        evicted[#evicted + 1] = victim
        evicted[#evicted + 1] = data
      end
    end
    redis.call('SET', dkey, block)
    redis.call('ZADD', lru, clock + i, key)
    redis.call('HSET', sizes, key, #block)
    used = redis.call('HINCRBY', meta, 'used', #block)
  end
end
return evicted
"""

#: Remove blocks.  ARGV: the user key per data key.  Answers 1 per block this
#: call removed, 0 per key that held none.
EVICT = """
local lru, sizes, meta = KEYS[1], KEYS[2], KEYS[3]
local removed = {}
for i = 1, #KEYS - 3 do
  local key = ARGV[i]
  local size = redis.call('HGET', sizes, key)
  removed[i] = redis.call('DEL', KEYS[i + 3])
  if size then
    redis.call('ZREM', lru, key)
    redis.call('HDEL', sizes, key)
    redis.call('HINCRBY', meta, 'used', -tonumber(size))
  end
end
return removed
"""

#: Mark blocks as just used.  KEYS: the recency index and the counters only;
#: ARGV: user keys.  ``XX`` leaves keys that are not stored alone, so a read
#: may touch its misses too and save a round trip.
TOUCH = """
local n = #ARGV
local clock = redis.call('HINCRBY', KEYS[2], 'clock', n) - n
for i = 1, n do
  redis.call('ZADD', KEYS[1], 'XX', clock + i, ARGV[i])
end
return n
"""


def sha1(script: str) -> str:
    """The digest ``EVALSHA`` names ``script`` by (what ``SCRIPT LOAD`` answers)."""
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()
