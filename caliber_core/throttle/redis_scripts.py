"""The ledger's rule in Lua: the scripts the Redis store runs, each one atomic step on one account's slot.

``RECORD_SCRIPT`` is :func:`caliber_core.throttle.ledger.advance` rewritten
for Redis: the expiry check, the increment and any escalation of one request,
its reply kept under the request's token. ``RESOLVE_SCRIPT`` settles a
request in doubt; ``FLAG_SCRIPT`` flags or unflags. KEYS are
:func:`.redis_keys.account_keys` (all in the account's hash slot).
``GROUP_RECORD_SCRIPT`` is the record script for a group (its member's rows
added in the group's slot); ``LIFT_SCRIPT`` adds the rows a request's groups
served above the account's own level, once per token, in the account's slot.
"""

from __future__ import annotations

import hashlib

from .ledger import AccountState, Decision, Event
from .ledger_store import StoreUnavailable

RECORD_SCRIPT = """
local done = redis.call('GET', KEYS[4])
if done == 'void' or done == 'voided' then return {-1} end
if done then return cjson.decode(done) end
local now = tonumber(ARGV[1]); local rows = tonumber(ARGV[2]); local after = tonumber(ARGV[3])
local top = tonumber(ARGV[4]); local expire = tonumber(ARGV[5]); local shadow = ARGV[6] == '1'
local s = redis.call('HMGET', KEYS[1], 'flagged', 'level', 'at_level', 'flagged_at', 'reason', 'first_seen')
local flagged = s[1] == '1'
local level = tonumber(s[2] or '0'); local at_level = tonumber(s[3] or '0')
local flagged_at = s[4] or ''; local reason = s[5] or ''
local events = {}
if flagged and expire >= 0 and flagged_at ~= '' and now >= tonumber(flagged_at) + expire then
  flagged = false; level = 0; at_level = 0; flagged_at = ''
  table.insert(events, ARGV[1] .. '|expired|0|' .. reason)
  redis.call('DEL', KEYS[3])
end
local out = {}
local remaining = rows
while remaining > 0 do
  if flagged and level < top and at_level >= after then
    level = level + 1; at_level = 0
    table.insert(events, ARGV[1] .. '|escalated|' .. level .. '|' .. reason)
  else
    local take = remaining
    if flagged and level < top then take = math.min(remaining, after - at_level) end
    table.insert(out, level); table.insert(out, take)
    redis.call('HINCRBY', KEYS[1], 'q:' .. level, take)
    if shadow and level > 0 then redis.call('HINCRBY', KEYS[1], 's:' .. level, take) end
    if flagged then at_level = at_level + take end
    remaining = remaining - take
  end
end
if flagged and level < top and at_level >= after then
  level = level + 1; at_level = 0
  table.insert(events, ARGV[1] .. '|escalated|' .. level .. '|' .. reason)
end
if not flagged then reason = '' end
redis.call('HSET', KEYS[1], 'flagged', flagged and '1' or '0', 'level', level, 'at_level', at_level,
           'flagged_at', flagged_at, 'reason', reason, 'last_seen', ARGV[1])
if not s[6] then redis.call('HSET', KEYS[1], 'first_seen', ARGV[1]) end
for _, e in ipairs(events) do redis.call('RPUSH', KEYS[2], e) end
table.insert(out, 1, flagged and 1 or 0)
table.insert(out, 2, level)
for _, e in ipairs(events) do table.insert(out, e) end
redis.call('SET', KEYS[4], cjson.encode(out), 'EX', tonumber(ARGV[8]))
return out
"""

# Settle a request in doubt (or void a counted one whose answer failed). ARGV[1]: '1' the caller
# was served, '0' it was told the request failed. Returns 1 if the request had been counted.
RESOLVE_SCRIPT = """
local done = redis.call('GET', KEYS[2])
if not done then redis.call('SET', KEYS[2], 'void', 'EX', tonumber(ARGV[2])) return 0 end
if done == 'void' then return 0 end
if done == 'voided' then return 1 end
if ARGV[1] == '0' then
  local out = cjson.decode(done)
  local i = 3
  while i < #out and type(out[i]) == 'number' and type(out[i + 1]) == 'number' do
    redis.call('HINCRBY', KEYS[1], 'q:' .. out[i], -out[i + 1])
    redis.call('HINCRBY', KEYS[1], 'f:' .. out[i], out[i + 1])
    i = i + 2
  end
  redis.call('SET', KEYS[2], 'voided', 'EX', tonumber(ARGV[2]))
end
return 1
"""

FLAG_SCRIPT = """
local flagged = ARGV[1] == '1'
local s = redis.call('HMGET', KEYS[1], 'flagged', 'flagged_at', 'reason')
local expire = tonumber(ARGV[6])
if s[1] == '1' and expire >= 0 and s[2] and s[2] ~= '' and tonumber(ARGV[4]) >= tonumber(s[2]) + expire then
  redis.call('RPUSH', KEYS[2], ARGV[4] .. '|expired|0|' .. (s[3] or ''))
end
redis.call('HSET', KEYS[1], 'flagged', ARGV[1], 'level', ARGV[2], 'at_level', 0,
           'flagged_at', flagged and ARGV[4] or '', 'reason', flagged and ARGV[3] or '')
redis.call('RPUSH', KEYS[2], ARGV[4] .. '|' .. (flagged and 'flagged' or 'unflagged') .. '|' .. ARGV[2] .. '|' .. ARGV[3])
if flagged then redis.call('SET', KEYS[3], '1') else redis.call('DEL', KEYS[3]) end
return 1
"""

# The record script for a group: the same rule, and the member's rows under the same token
# (KEYS[5]: :func:`.redis_keys.members_key`, ARGV[9]: the member).
_MEMBER_LINES = """
redis.call('HINCRBY', KEYS[5], ARGV[9], rows)
redis.call('HSETNX', KEYS[5], 'first:' .. ARGV[9], ARGV[1])
redis.call('HSET', KEYS[5], 'last:' .. ARGV[9], ARGV[1])
"""
_REPLY_LINE = "redis.call('SET', KEYS[4], cjson.encode(out), 'EX', tonumber(ARGV[8]))"
GROUP_RECORD_SCRIPT = RECORD_SCRIPT.replace(_REPLY_LINE, _MEMBER_LINES.strip() + "\n" + _REPLY_LINE)
assert GROUP_RECORD_SCRIPT != RECORD_SCRIPT

# Rows a request's groups served above its account's own level, once per token (KEYS[2] marks it done).
# ARGV: seconds to keep the mark, then (field, rows) pairs 'l:<own>:<served>'.
LIFT_SCRIPT = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], tonumber(ARGV[i + 1])) end
return 1
"""

SCRIPTS = {"record": RECORD_SCRIPT, "resolve": RESOLVE_SCRIPT, "flag": FLAG_SCRIPT,
           "group_record": GROUP_RECORD_SCRIPT, "lift": LIFT_SCRIPT}
SHAS = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in SCRIPTS.items()}


def event_of(text) -> Event:
    """An event as the scripts keep it: ``at|event|level|reason``."""
    text = text.decode() if isinstance(text, bytes) else text
    at, event, level, reason = text.split("|", 3)
    return Event(float(at), event, int(level), reason)


def decision_of(reply, token: str | None = None) -> Decision:
    """``RECORD_SCRIPT``'s reply as a Decision: flag, level, (level, rows) segments, then events."""
    if int(reply[0]) == -1:
        raise StoreUnavailable("redis store: this request's token was voided while it was in doubt")
    flagged, level = bool(reply[0]), int(reply[1])
    rest = reply[2:]
    n_seg = sum(1 for x in rest if isinstance(x, int))
    segments = tuple((int(rest[i]), int(rest[i + 1])) for i in range(0, n_seg, 2))
    events = tuple(event_of(e) for e in rest[n_seg:])
    return Decision(segments, events, AccountState(flagged=flagged, level=level), token=token)
