"""The shared store's layout, with no I/O: key names and the Lua scripts that keep them.

Every key is under one prefix (default ``trio-duplex:``), and everything a node writes
has a TTL, so nothing a dead node wrote outlives it for longer than that TTL. Values
marked *sealed* are ``signed.Sealer`` values bound to their key name and an expiry: a
node acts on none that does not open (the store is not trusted, see docs/cluster.md).

* ``{p}nodes`` -- a set of node ids: an index, pruned of an id once neither the node
  nor its leases are left (``PRUNE``, ``ACQUIRE``);
* ``{p}node:{id}`` -- sealed: the node's advertise URL, PX node TTL: the node is a
  *member* (relays go to it) while this key exists;
* ``{p}node:{id}:leases`` -- sealed: the node's admission lease count and its version
  (``leases.py``), PX lease TTL (> node TTL), its seal as long by Redis's clock: the node
  is *presumed alive* while this key exists, and its leases count;
* ``{p}node:{id}:sessions`` -- a hash session id -> directory TTL (ms) of the sessions the
  node is home of, PX lease TTL: what its heartbeat refreshes;
* ``{p}node:{id}:left`` -- sealed: the node left cleanly (``FORGET``; ``left.VERSION``,
  newer than every count it wrote), PX a directory TTL: its sessions are lost at once;
* ``{p}session:{sid}`` -- sealed: the session's home node id, PX directory TTL, which is
  refreshed by the home's heartbeat and so outlives a dead home by at most that TTL: long
  enough to answer a resume with "node lost" rather than "unknown";
* ``{p}migration:{sid}`` -- sealed: a session a draining node handed over (its record,
  base64), PX the session's resume window, until a node has taken it over (``ADOPTED``);
* ``{p}migration:{sid}:claim`` -- the node taking it over, PX a few seconds: one at a
  time, and a node that took the record but never said so frees it by expiring. Not
  sealed: it is a lock, and a forged one only makes a resume wait (``busy``);
* ``{p}migrations`` -- a set of the session ids handed over: an index of the records,
  each of which holds one lease *in transit* (``ACQUIRE`` counts it) until it is adopted
  (the adopting node's count takes it over in the same step) or expires; pruned of an id
  once its record is gone.

The scripts find other nodes' keys from the ``nodes`` set at run time, which a standalone
Redis (or Valkey) allows and a Redis *Cluster* does not: ``serve`` refuses one at start.
A script reads a sealed value's payload unchecked (``PAYLOAD``): it only keeps the books;
the node checks every value it is handed before it acts on it.
"""

from __future__ import annotations

import re

import attrs

from .leases import LUA_COUNT
from .signed import LUA_PAYLOAD

DEFAULT_PREFIX = "trio-duplex:"

# A node id goes inside key names: no ':' (``node:a:leases`` must not be node "a:leases"'s).
_NODE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_node_id(node_id: str) -> str:
    if not _NODE_ID.fullmatch(node_id):
        raise ValueError(f"node id must match {_NODE_ID.pattern}: {node_id!r}")
    return node_id


def ttl_ms(seconds: float) -> int:
    """A TTL in whole milliseconds, at least 1 (Redis refuses PX 0)."""
    if not seconds > 0:
        raise ValueError(f"a TTL must be positive: {seconds!r}")
    return max(1, round(seconds * 1000))


@attrs.frozen
class Keys:
    """The key names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def nodes(self) -> str:
        return f"{self.prefix}nodes"

    @property
    def node_prefix(self) -> str:
        return f"{self.prefix}node:"

    @property
    def session_prefix(self) -> str:
        return f"{self.prefix}session:"

    def node(self, node_id: str) -> str:
        return f"{self.node_prefix}{check_node_id(node_id)}"

    def leases(self, node_id: str) -> str:
        return f"{self.node(node_id)}{LEASES_SUFFIX}"

    def sessions(self, node_id: str) -> str:
        return f"{self.node(node_id)}{SESSIONS_SUFFIX}"

    def left(self, node_id: str) -> str:
        return f"{self.node(node_id)}{LEFT_SUFFIX}"

    def session(self, session_id: str) -> str:
        if not session_id:
            raise ValueError("empty session id")
        return f"{self.session_prefix}{session_id}"

    def migration(self, session_id: str) -> str:
        if not session_id:
            raise ValueError("empty session id")
        return f"{self.prefix}migration:{session_id}"

    def migration_claim(self, session_id: str) -> str:
        return f"{self.migration(session_id)}:claim"

    @property
    def migration_prefix(self) -> str:
        return f"{self.prefix}migration:"

    @property
    def migrations(self) -> str:
        return f"{self.prefix}migrations"

    def node_keys(self, node_id: str) -> list[str]:
        """KEYS for the per-node scripts: node, leases, sessions, nodes, left."""
        return [
            self.node(node_id),
            self.leases(node_id),
            self.sessions(node_id),
            self.nodes,
            self.left(node_id),
        ]


LEASES_SUFFIX = ":leases"
SESSIONS_SUFFIX = ":sessions"
LEFT_SUFFIX = ":left"

# A script's local function: the (unchecked) payload of a sealed value, or nil.
_PAYLOAD = f"""
local function payload(value)
    if not value then
        return nil
    end
    return string.match(value, '{LUA_PAYLOAD}')
end
"""

# KEYS node, leases, sessions, nodes, left; ARGV node id, sealed url, ttl ms, lease ttl
# ms, sealed lease count (0, or what a lapsed node holds).
# A fresh start of the node: whatever leases and sessions an earlier process of the same
# id left are dropped (that process's sessions died with it), and so is its tombstone.
REGISTER = """
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[4])
redis.call('DEL', KEYS[3], KEYS[5])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""

# KEYS node, leases, sessions, nodes; ARGV node id, sealed url, ttl ms, session key
# prefix, lease ttl ms, node key prefix, leases suffix, and optionally the node's sealed
# lease count.
# Returns {1, 1, ...}, or {0, 1, ...} if the node had lapsed (others saw it gone; it is a
# member again now) but its leases lived, or {0, 0, ...} if its leases had lapsed too;
# then Redis's TIME (seconds, microseconds), then pairs id, sealed count of the other
# nodes in the index: so that a node remembers its peers' counts (``leases.py``) before
# it first admits anyone, and keeps them fresh.
# Refreshes the node's leases (or sets their count: the node knows how many sessions it
# holds, so a lost release or an emptied Redis heals here), its session index, and each
# directory entry it is still home of (an entry another node claimed since is dropped
# from the index).
HEARTBEAT = (
    _PAYLOAD
    + """
local alive = redis.call('EXISTS', KEYS[1])
local kept = redis.call('EXISTS', KEYS[2])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[4], ARGV[1])
if ARGV[8] then
    redis.call('SET', KEYS[2], ARGV[8], 'PX', ARGV[5])
else
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
local index = redis.call('HGETALL', KEYS[3])
for i = 1, #index, 2 do
    local key = ARGV[4] .. index[i]
    if payload(redis.call('GET', key)) == ARGV[1] then
        redis.call('PEXPIRE', key, index[i + 1])
    else
        redis.call('HDEL', KEYS[3], index[i])
    end
end
local now = redis.call('TIME')
local out = {alive, kept, now[1], now[2]}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[4])) do
    if id ~= ARGV[1] then
        local value = redis.call('GET', ARGV[6] .. id .. ARGV[7])
        if value then
            out[#out + 1] = id
            out[#out + 1] = value
        end
    end
end
return out
"""
)

# KEYS nodes; ARGV node key prefix, leases suffix, sessions suffix.
# Returns {id1, sealed url1, ...} of member nodes; an id whose node and leases are both
# gone leaves the index (with its session index): a lapsed node's leases still count.
NODES = """
local found = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    local node = ARGV[1] .. id
    local url = redis.call('GET', node)
    if url then
        found[#found + 1] = id
        found[#found + 1] = url
    elseif redis.call('EXISTS', node .. ARGV[2]) == 0 then
        redis.call('SREM', KEYS[1], id)
        redis.call('DEL', node .. ARGV[3])
    end
end
return found
"""

# KEYS nodes; ARGV node key prefix, leases suffix, sessions suffix, at most this many ids.
# Looks at a random sample of ids (SRANDMEMBER: each call is bounded) and removes those
# whose node and leases are both gone. Returns how many it removed.
PRUNE = """
local removed = 0
for _, id in ipairs(redis.call('SRANDMEMBER', KEYS[1], ARGV[4])) do
    local node = ARGV[1] .. id
    if redis.call('EXISTS', node, node .. ARGV[2]) == 0 then
        redis.call('SREM', KEYS[1], id)
        redis.call('DEL', node .. ARGV[3])
        removed = removed + 1
    end
end
return removed
"""

# KEYS node, leases, sessions, nodes, left; ARGV node id, sealed tombstone, its ttl ms.
# The node leaves cleanly: its leases go back at once, and its tombstone says its
# sessions are lost (not a node that is only slow).
FORGET = """
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('SET', KEYS[5], ARGV[2], 'PX', ARGV[3])
return 1
"""

# Redis's own clock: {seconds, microseconds}.
TIME = """
return redis.call('TIME')
"""

# KEYS node, sessions, session; ARGV session id, sealed entry, ttl ms, lease ttl ms.
# Returns 0 if the node is not a member (a lapsed node cannot become anyone's home).
CLAIM = """
if redis.call('PTTL', KEYS[1]) <= 0 then
    return 0
end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""

# KEYS sessions, session; ARGV node id, session id.
# Returns 1 if the entry was this node's and is gone, 0 if it was not this node's.
RELEASE = (
    _PAYLOAD
    + """
redis.call('HDEL', KEYS[1], ARGV[2])
if payload(redis.call('GET', KEYS[2])) == ARGV[1] then
    redis.call('DEL', KEYS[2])
    return 1
end
return 0
"""
)

# KEYS node, leases, nodes, migrations; ARGV node key prefix, leases suffix, cap, the
# node's sealed new count, that count, lease ttl ms, sessions suffix, migration key
# prefix, the session id whose record this lease takes over (adoption) or '', left
# suffix, then pairs: id, count of the peers the node remembers.
# Sums every other node's lease count (a lapsed node's too, while its leases key lives:
# a node that is only slow keeps its place), one per handed-over record (a lease in
# transit; but the one being adopted, whose lease this is), the remembered count of each
# remembered peer no longer found (unless it left a tombstone), and this node's new
# count; sets the new count if the sum is within the cap. A count that does not parse,
# or a member's that is missing, counts as the cap.
# Returns {1 granted | 0 refused | -1 not a member, Redis seconds, microseconds, leases
# in transit, n, then n pairs id, sealed count (or '' for a member without one), then
# pairs id, sealed tombstone (or '' if none) of the remembered peers not found}: for the
# node to check (a forged, replayed or deleted count must not let anyone in).
ACQUIRE = (
    _PAYLOAD
    + f"""
local function count_of(value)
    local p = payload(value)
    if not p then
        return nil
    end
    return tonumber(string.match(p, '{LUA_COUNT}'))
end
"""
    + """
if redis.call('PTTL', KEYS[1]) <= 0 then
    return {-1}
end
local cap = tonumber(ARGV[3])
local total = tonumber(ARGV[5])
local now = redis.call('TIME')
local out = {0, now[1], now[2], 0, 0}
local found = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    local node = ARGV[1] .. id
    local key = node .. ARGV[2]
    if key ~= KEYS[2] then
        local value = redis.call('GET', key)
        if value then
            local count = count_of(value)
            if count == nil or count < 0 then
                count = cap
            end
            total = total + count
            out[#out + 1] = id
            out[#out + 1] = value
            found[id] = true
        elseif redis.call('EXISTS', node) == 1 then
            -- A member always has a count (REGISTER and HEARTBEAT set both): deleted.
            total = total + cap
            out[#out + 1] = id
            out[#out + 1] = ''
            found[id] = true
        else
            redis.call('SREM', KEYS[3], id)
            redis.call('DEL', node .. ARGV[7])
        end
    end
end
out[5] = (#out - 5) / 2
local transit = 0
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[4])) do
    if sid ~= ARGV[9] then
        if redis.call('EXISTS', ARGV[8] .. sid) == 1 then
            transit = transit + 1
        else
            redis.call('SREM', KEYS[4], sid)
        end
    end
end
out[4] = transit
total = total + transit
for i = 11, #ARGV, 2 do
    local id = ARGV[i]
    if not found[id] then
        local left = redis.call('GET', ARGV[1] .. id .. ARGV[10])
        if left then
            out[#out + 1] = id
            out[#out + 1] = left
        else
            total = total + tonumber(ARGV[i + 1])
            out[#out + 1] = id
            out[#out + 1] = ''
        end
    end
end
if total <= cap then
    redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[6])
    out[1] = 1
end
return out
"""
)

# KEYS session, migration, claim; ARGV node key prefix, this node's id, claim ttl ms,
# leases suffix, left suffix.
# Where a session is, for a resume that reached a node that does not hold it:
# {"home", entry, sealed url, "", ""} (its home is a member), {"migrated", record} (handed
# over: this node may take it over; the record stays, claimed by this node for the claim
# TTL, until ADOPTED), {"busy"} (another node is taking it over), {"gone", entry, "",
# sealed tombstone or "", "1" if its leases live (presumed alive) else "0"}, or {}.
# Nothing is taken here: an answer lost to a timeout loses no session.
LOCATE = (
    _PAYLOAD
    + """
local entry = redis.call('GET', KEYS[1])
local home = payload(entry)
if home then
    local url = redis.call('GET', ARGV[1] .. home)
    if url then
        return {'home', entry, url, '', ''}
    end
end
local record = redis.call('GET', KEYS[2])
if record then
    local holder = redis.call('GET', KEYS[3])
    if holder and holder ~= ARGV[2] then
        return {'busy'}
    end
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
    return {'migrated', record}
end
if home then
    local node = ARGV[1] .. home
    local left = redis.call('GET', node .. ARGV[5]) or ''
    local presumed = tostring(redis.call('EXISTS', node .. ARGV[4]))
    return {'gone', entry, '', left, presumed}
end
if entry then  -- not even shaped like a sealed value: for the node to see (and log)
    return {'gone', entry, '', '', '0'}
end
return {}
"""
)

# KEYS session, migration, claim, node, sessions, migrations; ARGV node id, session id,
# ttl ms, sealed entry.
# This node has taken the handed-over session over: it becomes its home and the record
# goes, at once. Returns 1 (done now, or already), 0 (its claim lapsed: another node may
# have it). Idempotent, so that a call whose answer was lost can be made again.
ADOPTED = (
    _PAYLOAD
    + """
local home = payload(redis.call('GET', KEYS[1]))
if home == ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then
    return 1
end
if redis.call('GET', KEYS[3]) ~= ARGV[1] or redis.call('PTTL', KEYS[4]) <= 0 then
    return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SREM', KEYS[6], ARGV[2])
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
redis.call('HSET', KEYS[5], ARGV[2], ARGV[3])
return 1
"""
)

# KEYS claim; ARGV node id. Give a claim back (this node could not take the session).
UNCLAIM_MIGRATION = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
end
return 1
"""

# KEYS sessions, session, migration, claim, migrations; ARGV node id, session id, sealed
# record, ttl ms. A draining node hands a session over: the record is stored for the
# session's resume window (any claim on an older one dropped), indexed (it holds a lease
# in transit until then), and the directory entry, if still this node's, goes, so that
# a resume finds the record, not a home that refuses it.
HAND_OVER = (
    _PAYLOAD
    + """
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
redis.call('SADD', KEYS[5], ARGV[2])
redis.call('DEL', KEYS[4])
redis.call('HDEL', KEYS[1], ARGV[2])
if payload(redis.call('GET', KEYS[2])) == ARGV[1] then
    redis.call('DEL', KEYS[2])
end
return 1
"""
)

SCRIPTS = (
    REGISTER,
    HEARTBEAT,
    NODES,
    PRUNE,
    FORGET,
    CLAIM,
    RELEASE,
    ACQUIRE,
    LOCATE,
    ADOPTED,
    UNCLAIM_MIGRATION,
    HAND_OVER,
    TIME,
)
"""Every script, for ``Store.load_scripts``."""
