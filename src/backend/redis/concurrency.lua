-- quotad: concurrency slots of one key, on Redis, in one atomic call: a
-- lone Acquire, Renew or Release. slots.lua, which quotad puts in front of
-- this script, reads, decides and writes the slots (quota.lua uses the same
-- for an acquire in a batch, and for a Peek).
--
-- The same rules as quotad-core's MemoryStore::acquire, renew and release:
-- a slot is admitted when the live slots' units plus its cost are within
-- the limit; it ends slot_ttl after it was taken or last renewed, unless
-- released first; a release frees only the slot with its id, and an
-- unknown or ended one is answered as released.
--
-- KEYS[1]   the slots key (see slots.lua)
-- ARGV[1]   "acquire", "renew" or "release"
-- ARGV[2]   the deadline, in Redis's clock (ms): past it the caller has
--           given up, and the script refuses to run
-- ARGV[3]   "" to decide by the Redis server's clock (TIME), or ms since
--           the epoch (tests only)
-- ARGV[4]   limit; ARGV[5] slot_ttl_ms; ARGV[6] cost; ARGV[7] the slot id
--
-- Returns the TIME read (ms) alone when refused; otherwise the TIME, then
--   acquire: code (1 WITHIN, 2 EXCEEDED, 6 ID_IN_USE), remaining,
--            retry_after_ms, reset_after_ms, expired (ended slots dropped),
--            the new slot's end (0 when denied)
--   renew, release: held (1 when the slot was live), remaining, ends_at
--            (the slot's end after a renew), expired

local t = redis.call('TIME')
local micros = tonumber(t[2])
local time = tonumber(t[1]) * 1000 + (micros - math.fmod(micros, 1000)) / 1000
if time > tonumber(ARGV[2]) then
  return { time }
end
local now, ttl_slack = time, 0
if ARGV[3] ~= '' then now, ttl_slack = tonumber(ARGV[3]), 60000 end

local key, mode = KEYS[1], ARGV[1]
local limit, slot_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local cost, id = tonumber(ARGV[6]), ARGV[7]

local S = SLOTS_LIB()
local st, why = S.load(key, now)
if not st then
  return redis.error_reply('QUOTAD_CORRUPT ' .. key .. ': ' .. why)
end

if mode == 'acquire' then
  if S.holds(st, id) then
    -- The ended slots go now, so that they are counted once.
    local expired = S.store(key, st, now, ttl_slack, false)
    return { time, 6, 0, 0, 0, expired, 0 }
  end
  local admitted, remaining, retry, reset = S.decide(st, limit, slot_ttl, cost, now, true)
  local ends = 0
  if admitted then ends = S.take(st, id, cost, slot_ttl, now) end
  local expired = S.store(key, st, now, ttl_slack, false)
  local code = 2
  if admitted then code = 1 end
  return { time, code, remaining, retry, reset, expired, ends }
end

local i
for n, s in ipairs(st.live) do
  if s[1] == id then i = n end
end
local ends_at = 0
if i and mode == 'renew' then
  local s = st.live[i]
  s[3] = now + slot_ttl
  ends_at = s[3]
  redis.call('HSET', key, id, string.format('%d:%d:%d', s[2], s[4], s[3]))
elseif i then
  st.held = st.held - st.live[i][2]
  table.remove(st.live, i)
  redis.call('HDEL', key, id)
end
local expired = S.store(key, st, now, ttl_slack, i ~= nil)
local remaining = limit - st.held
if remaining < 0 then remaining = 0 end
return { time, i and 1 or 0, remaining, ends_at, expired }
