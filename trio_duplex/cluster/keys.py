"""The shared store's layout, with no I/O: key names and the Lua scripts that keep them.

Every key is under one prefix (default ``trio-duplex:``), and everything a node writes
has a TTL, so nothing a dead node wrote outlives it for longer than that TTL:

* ``{p}nodes`` -- a set of node ids: an index, pruned of dead ids by ``NODES``;
* ``{p}node:{id}`` -- the node's advertise URL, PX node TTL: the node is alive while this
  key exists;
* ``{p}node:{id}:leases`` -- the node's admission lease count, PX node TTL;
* ``{p}node:{id}:sessions`` -- a hash session id -> directory TTL (ms) of the sessions the
  node is home of, PX node TTL: what its heartbeat refreshes;
* ``{p}session:{sid}`` -- the session's home node id, PX directory TTL, which is
  refreshed by the home's heartbeat and so outlives a dead home by at most that TTL: long
  enough to answer a resume with "node lost" rather than "unknown";
* ``{p}migration:{sid}`` -- a session a draining node handed over (its record, base64),
  PX the session's resume window: the first node its client resumes on takes it.

The scripts find other nodes' keys from the ``nodes`` set at run time, which a standalone
Redis (or Valkey) allows; a Redis *Cluster* would not (the keys are not declared).
"""

from __future__ import annotations

import re

import attrs

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

    def session(self, session_id: str) -> str:
        if not session_id:
            raise ValueError("empty session id")
        return f"{self.session_prefix}{session_id}"

    def migration(self, session_id: str) -> str:
        if not session_id:
            raise ValueError("empty session id")
        return f"{self.prefix}migration:{session_id}"

    def node_keys(self, node_id: str) -> list[str]:
        """KEYS for the per-node scripts: node, leases, sessions, nodes."""
        return [self.node(node_id), self.leases(node_id), self.sessions(node_id), self.nodes]


LEASES_SUFFIX = ":leases"
SESSIONS_SUFFIX = ":sessions"

# KEYS node, leases, sessions, nodes; ARGV node id, url, ttl ms.
# A fresh start of the node: whatever leases and sessions an earlier process of the same
# id left are dropped (that process's sessions died with it).
REGISTER = """
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""

# KEYS node, leases, sessions, nodes; ARGV node id, url, ttl ms, session key prefix, and
# optionally the node's lease count.
# Returns 1, or 0 if the node had lapsed (others saw it dead; it is alive again now).
# Refreshes the node's leases (or sets their count: the node knows how many sessions it
# holds, so a lost release or an emptied Redis heals here), its session index, and each
# directory entry it is still home of (an entry another node claimed since is dropped
# from the index).
HEARTBEAT = """
local alive = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[4], ARGV[1])
if ARGV[5] then
    redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[3])
else
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
redis.call('PEXPIRE', KEYS[3], ARGV[3])
local index = redis.call('HGETALL', KEYS[3])
for i = 1, #index, 2 do
    local key = ARGV[4] .. index[i]
    if redis.call('GET', key) == ARGV[1] then
        redis.call('PEXPIRE', key, index[i + 1])
    else
        redis.call('HDEL', KEYS[3], index[i])
    end
end
return alive
"""

# KEYS nodes; ARGV node key prefix, leases suffix, sessions suffix.
# Returns {id1, url1, id2, url2, ...} of live nodes; forgets the dead ones' ids and keys.
NODES = """
local found = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    local node = ARGV[1] .. id
    local url = redis.call('GET', node)
    if url then
        found[#found + 1] = id
        found[#found + 1] = url
    else
        redis.call('SREM', KEYS[1], id)
        redis.call('DEL', node .. ARGV[2], node .. ARGV[3])
    end
end
return found
"""

# KEYS node, leases, sessions, nodes; ARGV node id.
FORGET = """
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
"""

# KEYS node, sessions, session; ARGV node id, session id, ttl ms.
# Returns 0 if the node is not alive (a dead node cannot become anyone's home).
CLAIM = """
local node_ttl = redis.call('PTTL', KEYS[1])
if node_ttl <= 0 then
    return 0
end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], node_ttl)
return 1
"""

# KEYS sessions, session; ARGV node id, session id.
# Returns 1 if the entry was this node's and is gone, 0 if it was not this node's.
RELEASE = """
redis.call('HDEL', KEYS[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
    return 1
end
return 0
"""

# KEYS node, leases, nodes; ARGV node key prefix, leases suffix, cap.
# Counts the leases of live nodes only (a dead node's count no longer matters, whether or
# not its key has expired yet), and takes one if that is under the cap.
# Returns 1 granted, 0 refused at the cap, -1 the node is not alive.
ACQUIRE = """
local node_ttl = redis.call('PTTL', KEYS[1])
if node_ttl <= 0 then
    return -1
end
local total = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    local node = ARGV[1] .. id
    if redis.call('EXISTS', node) == 1 then
        total = total + tonumber(redis.call('GET', node .. ARGV[2]) or '0')
    end
end
if total >= tonumber(ARGV[3]) then
    return 0
end
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], node_ttl)
return 1
"""

# KEYS leases. Returns 1 if a lease was given back, 0 if the node held none.
RELEASE_LEASE = """
if tonumber(redis.call('GET', KEYS[1]) or '0') > 0 then
    redis.call('DECR', KEYS[1])
    return 1
end
return 0
"""

# KEYS session, migration; ARGV node key prefix.
# Where a session is, for a resume that reached a node that does not hold it:
# {"migrated", record} (taken: the caller adopts it), {"home", id, url} (alive),
# {"lost", id} (its home is dead), or {} (no such session).
LOCATE = """
local record = redis.call('GET', KEYS[2])
if record then
    redis.call('DEL', KEYS[2])
    return {'migrated', record}
end
local home = redis.call('GET', KEYS[1])
if not home then
    return {}
end
local url = redis.call('GET', ARGV[1] .. home)
if url then
    return {'home', home, url}
end
return {'lost', home}
"""

# KEYS sessions, session, migration; ARGV node id, session id, record, ttl ms.
# A draining node hands a session over: the record is stored for the session's resume
# window and the directory entry (if still this node's) goes, so that a resume finds
# the record, not a home that refuses it.
HAND_OVER = """
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
redis.call('HDEL', KEYS[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
end
return 1
"""

SCRIPTS = (
    REGISTER,
    HEARTBEAT,
    NODES,
    FORGET,
    CLAIM,
    RELEASE,
    ACQUIRE,
    RELEASE_LEASE,
    LOCATE,
    HAND_OVER,
)
"""Every script, for ``Store.load_scripts``."""
