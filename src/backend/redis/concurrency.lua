-- quotad: concurrency slots of one key, on Redis, in one atomic call.
--
-- The same rules as quotad-core's MemoryStore::acquire, renew and release:
-- a slot is admitted when the live slots' units plus its cost are within
-- the limit; it ends slot_ttl after it was taken or last renewed, unless
-- released first; a release frees only the slot with its id, and an
-- unknown or ended one is answered as released.
--
-- KEYS[1]   the slots key (<prefix>:<policy>|{<key>}|<format>C0, so the
--           key's hash tag, its Cluster slot): a hash, one field per slot,
--           its id (a decimal string: a double cannot hold every u64), the
--           value "units:granted_at:ends_at"; a TTL to a minute after its
--           last slot ends
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

-- The live slots, ended ones dropped: { id, units, ends_at } each.
local flat = redis.call('HGETALL', key)
local live, gone, held = {}, {}, 0
for i = 1, #flat, 2 do
  local units, granted, ends = string.match(flat[i + 1], '^(%d+):(%d+):(%d+)$')
  if not units then
    return redis.error_reply('QUOTAD_CORRUPT ' .. key)
  end
  units, ends = tonumber(units), tonumber(ends)
  if ends > now then
    live[#live + 1] = { flat[i], units, ends, granted }
    held = held + units
  else
    gone[#gone + 1] = flat[i]
  end
end
if #gone > 0 then
  redis.call('HDEL', key, unpack(gone))
end

local function last_end()
  local last = 0
  for _, s in ipairs(live) do
    if s[3] > last then last = s[3] end
  end
  return last
end

-- Keeps the key a minute past its last slot's end (so that a call in that
-- minute finds ended slots and counts them as expired unreleased), or drops
-- it when none is left.
local GRACE = 60000
local function expire()
  local last = last_end()
  if last > now then
    redis.call('PEXPIRE', key, last - now + ttl_slack + GRACE)
  else
    redis.call('UNLINK', key)
  end
end

local function find()
  for i, s in ipairs(live) do
    if s[1] == id then return i end
  end
  return nil
end

if mode == 'acquire' then
  if find() then
    return { time, 6, 0, 0, 0, #gone, 0 }
  end
  if held <= limit - cost then
    local ends = now + slot_ttl
    redis.call('HSET', key, id, string.format('%d:%d:%d', cost, now, ends))
    live[#live + 1] = { id, cost, ends, now }
    expire()
    return { time, 1, limit - held - cost, 0, last_end() - now, #gone, ends }
  end
  -- The earliest end after which the cost fits, soonest ends first.
  table.sort(live, function(a, b) return a[3] < b[3] end)
  local left, retry = held, 0
  for _, s in ipairs(live) do
    left = left - s[2]
    if left <= limit - cost then
      retry = s[3] - now
      break
    end
  end
  if #gone > 0 then expire() end
  local remaining = limit - held
  if remaining < 0 then remaining = 0 end
  return { time, 2, remaining, retry, last_end() - now, #gone, 0 }
end

local i = find()
local ends_at = 0
if i and mode == 'renew' then
  local s = live[i]
  s[3] = now + slot_ttl
  ends_at = s[3]
  redis.call('HSET', key, id, string.format('%d:%d:%d', s[2], s[4], s[3]))
elseif i then
  held = held - live[i][2]
  table.remove(live, i)
  redis.call('HDEL', key, id)
end
if i or #gone > 0 then expire() end
local remaining = limit - held
if remaining < 0 then remaining = 0 end
return { time, i and 1 or 0, remaining, ends_at, #gone }
