-- quotad: one atomic rate-limit transition per key, on Redis.
--
-- The same algorithms as quotad-core, in the same exact integer arithmetic:
-- every value stays below 2^53, so a Lua double holds it exactly, and every
-- division is an exact floor or ceiling (math.fmod is exact; a plain a / b
-- can round up). One script serves all five algorithms so that a mixed
-- ALL_OR_NOTHING batch (say per-second and per-day) is one atomic call.
--
-- KEYS[i]   the state key of item i (a key may appear more than once)
-- ARGV[1]   "check" (decide each item), "all" (commit only if every item is
--           admitted) or "peek" (decide, write nothing)
-- ARGV[2]   the deadline, in Redis's clock (ms since the epoch): past it the
--           caller has given up, and the script refuses to run
-- ARGV[3]   "" to decide by the Redis server's clock (TIME), or milliseconds
--           since the epoch (tests only)
-- ARGV[4..] per item: algorithm (1-5), limit, window_ms, burst, cost
--
-- Returns the status (1 decided, 0 refused: past the deadline, nothing read
-- or written), the TIME read (ms), then six integers per item: allowed
-- (0/1), limit, remaining, retry_after_ms, reset_after_ms, reason (the
-- quotad.v1.Reason number). A key holding state that cannot be read is an
-- error reply QUOTAD_CORRUPT naming the key.
--
-- State is a MessagePack array (the kind, then integers), stored with a TTL
-- equal to the time until it is fresh again.

local WITHIN, EXCEEDED, TOO_BIG, BATCH_REJECTED = 1, 2, 3, 5

local fmod = math.fmod

local function fdiv(a, b)
  return (a - fmod(a, b)) / b
end

local function cdiv(a, b)
  local r = fmod(a, b)
  local q = (a - r) / b
  if r > 0 then
    q = q + 1
  end
  return q
end

local function min(a, b)
  if a < b then return a end
  return b
end

local function max(a, b)
  if a > b then return a end
  return b
end

-- Fixed window -----------------------------------------------------------

local FIXED = { kind = 'F' }

function FIXED.floor(st) return st[1] end

function FIXED.advance(p, st, at)
  local start = at - fmod(at, p.window)
  local count = 0
  if st and st[1] >= start then count = st[2] end
  return { p = p, at = at, start = start, stop = start + p.window, count = count }
end

function FIXED.fits(m, c) return m.count <= m.p.limit - c end
function FIXED.consume(m, c) m.count = m.count + c end
function FIXED.remaining(m) return max(m.p.limit - m.count, 0) end
function FIXED.retry(m, c) return m.stop - m.at end

function FIXED.reset(m)
  if m.count == 0 then return 0 end
  return m.stop - m.at
end

function FIXED.into(m)
  if m.count > 0 then return { m.start, m.count } end
  return nil
end

-- Sliding window counter -------------------------------------------------

local SLIDING = { kind = 'S' }

-- round(count * (window - elapsed) / window), halves up
local function weighted(count, elapsed, w)
  local x = count * (w - elapsed)
  local r = fmod(x, w)
  local q = (x - r) / w
  if 2 * r >= w then q = q + 1 end
  return q
end

-- the smallest elapsed in [0, w) with weighted(count, elapsed, w) <= allowance
local function first_elapsed(count, allowance, w)
  if count == 0 then return 0 end
  local room = (allowance + 1) * w - fdiv(w, 2) - 1
  local e = max(w - fdiv(room, count), 0)
  if e < w then return e end
  return nil
end

function SLIDING.floor(st) return st[1] end

function SLIDING.advance(p, st, at)
  local w = p.window
  local start = at - fmod(at, w)
  local prev, curr = 0, 0
  if st then
    if st[1] >= start then
      prev, curr = st[2], st[3]
    elseif start - st[1] <= w then
      prev, curr = st[3], 0
    end
  end
  return { p = p, at = at, start = start, elapsed = at - start, prev = prev, curr = curr }
end

local function estimate(m)
  return weighted(m.prev, m.elapsed, m.p.window) + m.curr
end

function SLIDING.fits(m, c) return estimate(m) <= m.p.limit - c end
function SLIDING.consume(m, c) m.curr = m.curr + c end
function SLIDING.remaining(m) return max(m.p.limit - estimate(m), 0) end

function SLIDING.retry(m, c)
  local w = m.p.window
  local allowance = m.p.limit - c
  local left = allowance - m.curr
  if left >= 0 then
    local e = first_elapsed(m.prev, left, w)
    if e then return max(e - m.elapsed, 0) end
  end
  local to_next = w - m.elapsed
  local e = first_elapsed(m.curr, allowance, w)
  if e then return to_next + e end
  return to_next + w
end

function SLIDING.reset(m)
  local to_next = m.p.window - m.elapsed
  if m.curr > 0 then return to_next + m.p.window end
  if m.prev > 0 then return to_next end
  return 0
end

function SLIDING.into(m)
  if m.prev > 0 or m.curr > 0 then return { m.start, m.prev, m.curr } end
  return nil
end

-- Token bucket (units of 1/window of a token) ---------------------------

local TOKEN = { kind = 'T' }

function TOKEN.floor(st) return st[2] end

function TOKEN.advance(p, st, at)
  local unit = p.window
  local cap = p.burst * unit
  local tokens = cap
  if st then
    local saved, from = st[1], st[3]
    if from ~= unit and from ~= 0 then
      saved = min(fdiv(saved, from), p.burst) * unit
    end
    local dt = max(at - st[2], 0)
    if saved < cap and dt < cdiv(cap - saved, p.limit) then
      tokens = saved + p.limit * dt
    end
  end
  return { p = p, at = at, unit = unit, cap = cap, tokens = tokens }
end

function TOKEN.fits(m, c) return m.tokens >= c * m.unit end
function TOKEN.consume(m, c) m.tokens = m.tokens - c * m.unit end
function TOKEN.remaining(m) return fdiv(m.tokens, m.unit) end
function TOKEN.retry(m, c) return cdiv(c * m.unit - m.tokens, m.p.limit) end
function TOKEN.reset(m) return cdiv(m.cap - m.tokens, m.p.limit) end

function TOKEN.into(m)
  if m.tokens < m.cap then return { m.tokens, m.at, m.unit } end
  return nil
end

-- Leaky bucket (units of 1/window of a token) ---------------------------

local LEAKY = { kind = 'L' }

function LEAKY.floor(st) return st[2] end

function LEAKY.advance(p, st, at)
  local unit = p.window
  local level = 0
  if st then
    local saved, from = st[1], st[3]
    if from ~= unit and from ~= 0 then
      saved = min(cdiv(saved, from), p.burst) * unit
    end
    local dt = max(at - st[2], 0)
    if dt < cdiv(saved, p.limit) then
      level = saved - p.limit * dt
    end
  end
  return { p = p, at = at, unit = unit, cap = p.burst * unit, level = level }
end

function LEAKY.fits(m, c) return m.level <= m.cap - c * m.unit end
function LEAKY.consume(m, c) m.level = m.level + c * m.unit end
function LEAKY.remaining(m) return fdiv(max(m.cap - m.level, 0), m.unit) end
function LEAKY.retry(m, c) return cdiv(m.level - (m.cap - c * m.unit), m.p.limit) end
function LEAKY.reset(m) return cdiv(m.level, m.p.limit) end

function LEAKY.into(m)
  if m.level > 0 then return { m.level, m.at, m.unit } end
  return nil
end

-- Sliding log: pairs (admitted at ms, cost), oldest first, kept flat in the
-- state array from index `head`; expired pairs are skipped, not copied.

local LOG = { kind = 'G' }

function LOG.floor(st)
  local n = #st
  if n == 0 then return 0 end
  return st[n - 1]
end

function LOG.advance(p, st, at)
  st = st or {}
  local head, total = 1, 0
  -- An admission at `ms` counts during `[ms, ms + window)`.
  while head < #st and st[head] + p.window <= at do
    head = head + 2
  end
  for i = head + 1, #st, 2 do
    total = total + st[i]
  end
  return { p = p, at = at, st = st, head = head, total = total }
end

function LOG.fits(m, c) return m.total <= m.p.limit - c end

function LOG.consume(m, c)
  local st, n = m.st, #m.st
  if n >= m.head and st[n - 1] == m.at then
    st[n] = st[n] + c
  else
    st[n + 1] = m.at
    st[n + 2] = c
  end
  m.total = m.total + c
end

function LOG.remaining(m) return max(m.p.limit - m.total, 0) end

function LOG.retry(m, c)
  local excess = m.total - (m.p.limit - c)
  local freed = 0
  for i = m.head, #m.st, 2 do
    freed = freed + m.st[i + 1]
    if freed >= excess then return m.st[i] + m.p.window - m.at end
  end
  return m.p.window
end

function LOG.reset(m)
  local n = #m.st
  if n < m.head then return 0 end
  return m.st[n - 1] + m.p.window - m.at
end

function LOG.into(m)
  local st, head = m.st, m.head
  if #st < head then return nil end
  if head == 1 then return st end
  local live = {}
  for i = head, #st do
    live[#live + 1] = st[i]
  end
  return live
end

-- The shared steps -------------------------------------------------------

local METERS = { FIXED, SLIDING, TOKEN, LEAKY, LOG }
local BY_KIND = { F = FIXED, S = SLIDING, T = TOKEN, L = LEAKY, G = LOG }

-- State is stored as MessagePack (cmsgpack, built into Redis): an array
-- whose first element is the kind, then the integers. cmsgpack writes a
-- whole-number double as an integer, so every value below 2^53 round-trips
-- exactly, and a sliding log of thousands of entries costs microseconds,
-- not the milliseconds of formatting and parsing text.
local KINDS = { F = 3, S = 4, T = 4, L = 4 }

local function decode(raw)
  if not raw then return nil end
  local ok, st = pcall(cmsgpack.unpack, raw)
  if not ok or type(st) ~= 'table' then return nil, false end
  local kind = st[1]
  if kind == 'G' then
    if #st % 2 ~= 1 then return nil, false end
  elseif KINDS[kind] ~= #st then
    return nil, false
  end
  for i = 2, #st do
    if type(st[i]) ~= 'number' then return nil, false end
  end
  table.remove(st, 1)
  st.kind = kind
  return st, true
end

local function encode(kind, st)
  table.insert(st, 1, kind)
  local raw = cmsgpack.pack(st)
  table.remove(st, 1)
  return raw
end

local function evaluate(p, st, now, cost, consume)
  local M = METERS[p.alg]
  if st and st.kind ~= M.kind then st = nil end
  local at = now
  if st then at = max(now, M.floor(st)) end
  local skew = at - now
  local function wait(ms)
    if ms == 0 then return 0 end
    return ms + skew
  end
  local m = M.advance(p, st, at)
  local allowed, reason, retry = 0, TOO_BIG, 0
  if cost <= p.cap then
    if M.fits(m, cost) then
      if consume then M.consume(m, cost) end
      allowed, reason = 1, WITHIN
    else
      reason, retry = EXCEEDED, wait(M.retry(m, cost))
    end
  end
  local decision = { allowed, p.cap, M.remaining(m), retry, wait(M.reset(m)), reason }
  local next = M.into(m)
  if next then next.kind = M.kind end
  return next, decision
end

local mode = ARGV[1]
local t = redis.call('TIME')
local time = tonumber(t[1]) * 1000 + fdiv(tonumber(t[2]), 1000)
-- The caller has given up: its answer was "failed", so nothing may count.
if time > tonumber(ARGV[2]) then
  return { 0, time }
end
local now = time
-- With an injected clock (tests), real time runs ahead of it, so a TTL
-- measured on the injected clock would expire state early; a minute of
-- slack keeps it. Stale state is harmless: it reads as fresh.
local ttl_slack = 0
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
  ttl_slack = 60000
end

local raw, states, resets, order = {}, {}, {}, {}
local items, decisions = {}, {}
local all_allowed = true
for i = 1, #KEYS do
  local key = KEYS[i]
  if raw[key] == nil then
    local value = redis.pcall('GET', key)
    if type(value) == 'table' and value.err then
      return redis.error_reply('QUOTAD_CORRUPT ' .. key .. ': ' .. value.err)
    end
    local st, ok = decode(value)
    if ok == false then
      return redis.error_reply('QUOTAD_CORRUPT ' .. key .. ' holds no quotad state')
    end
    raw[key] = value
    states[key] = st
    order[#order + 1] = key
  end
  local b = 3 + (i - 1) * 5
  local p = {
    alg = tonumber(ARGV[b + 1]),
    limit = tonumber(ARGV[b + 2]),
    window = tonumber(ARGV[b + 3]),
    burst = tonumber(ARGV[b + 4]),
  }
  if p.alg == 3 or p.alg == 4 then p.cap = p.burst else p.cap = p.limit end
  local cost = tonumber(ARGV[b + 5])
  local st, d = evaluate(p, states[key], now, cost, mode ~= 'peek')
  if mode ~= 'peek' then
    states[key] = st
    resets[key] = d[5]
  end
  items[i] = { p = p, cost = cost }
  decisions[i] = d
  if d[1] == 0 then all_allowed = false end
end

if mode == 'all' and not all_allowed then
  -- Nothing is written; what would have fit is reported as rejected, with
  -- the key's budget as it stands.
  for i = 1, #KEYS do
    if decisions[i][1] == 1 then
      local _, d = evaluate(items[i].p, decode(raw[KEYS[i]]), now, items[i].cost, false)
      decisions[i] = { 0, d[2], d[3], 0, d[5], BATCH_REJECTED }
    end
  end
elseif mode ~= 'peek' then
  for _, key in ipairs(order) do
    local st = states[key]
    if st then
      redis.call('SET', key, encode(st.kind, st), 'PX', max(resets[key], 1) + ttl_slack)
    elseif raw[key] then
      redis.call('DEL', key)
    end
  end
end

local out = { 1, time }
for i = 1, #decisions do
  for j = 1, 6 do
    out[#out + 1] = decisions[i][j]
  end
end
return out
