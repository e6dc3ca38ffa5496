-- One change of a runtime override, atomically (src/backend/redis/overrides.rs).
-- KEYS[1]: the hash of overrides.
-- ARGV[1]: the deadline (ms, Redis clock); past it, nothing is done.
-- ARGV[2]: 'set' or 'del'; ARGV[3]: the field; ARGV[4]: the value ('set').
-- ARGV[5]: what the fields of the same policy start with.
-- ARGV[6]: how many runtime overrides of that policy may be stored.
-- Overrides expired by Redis's own clock (TIME) are purged: a writer whose
-- clock is skewed neither purges live overrides nor keeps dead ones.
-- Answers {-1} past the deadline, {-2, count} when a new override would
-- exceed ARGV[6] (nothing written but purges), else
-- {version, epoch, previous value or nil, purged}; a removal that changes
-- nothing (the field absent, nothing purged) answers the version as it is.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now > tonumber(ARGV[1]) then
  return {-1}
end
local key = KEYS[1]
-- The epoch names this history of versions: fixed when the hash is made,
-- so a hash lost and made again counts from a larger epoch, never back
-- through numbers a replica has seen.
local epoch = redis.call('HGET', key, '#epoch')
if not epoch and ARGV[2] == 'del' and redis.call('EXISTS', key) == 0 then
  -- Nothing to remove, and no hash to make for it: the version of a
  -- store that has none.
  return {0, '0', false, 0}
end
if not epoch then
  epoch = t[1] .. string.format('%06d', tonumber(t[2]))
  redis.call('HSET', key, '#epoch', epoch)
end
local prefix = ARGV[5]
local all = redis.call('HGETALL', key)
local count, purged, previous = 0, 0, false
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if string.sub(f, 1, 1) ~= '#' then
    local at = string.match(v, '"expires_at_ms":(%d+)')
    if at and tonumber(at) <= now then
      redis.call('HDEL', key, f)
      purged = purged + 1
    elseif f == ARGV[3] then
      previous = v
    elseif string.sub(f, 1, #prefix) == prefix then
      count = count + 1
    end
  end
end
if ARGV[2] == 'set' then
  if not previous and count >= tonumber(ARGV[6]) then
    if purged > 0 then
      redis.call('HINCRBY', key, '#version', 1)
    end
    return {-2, count}
  end
  redis.call('HSET', key, ARGV[3], ARGV[4])
elseif ARGV[2] == 'del' then
  if not previous and purged == 0 then
    -- Nothing changed: the version stays, so no replica reads the hash
    -- again for it.
    local version = tonumber(redis.call('HGET', key, '#version')) or 0
    return {version, epoch, false, 0}
  end
  if previous then
    redis.call('HDEL', key, ARGV[3])
  end
else
  return redis.error_reply('unknown overrides operation')
end
local version = redis.call('HINCRBY', key, '#version', 1)
return {version, epoch, previous, purged}
