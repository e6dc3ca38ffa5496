-- quotad: one atomic rate-limit transition per key, on Redis.
--
-- The same algorithms as quotad-core, in the same exact integer arithmetic:
-- every value stays below 2^53, so a Lua double holds it exactly, and every
-- division is an exact floor or ceiling (math.fmod is exact; a plain a / b
-- can round up). One script serves all five algorithms so that a mixed
-- ALL_OR_NOTHING batch (say per-second and per-day) is one atomic call.
-- A lone check takes a short path of its algorithm first, which does the
-- same arithmetic without the general path's tables and closures (their
-- building costs more Redis time than the decision): the fixed window's
-- whenever it can count in place, the others' when they admit with
-- nothing unusual in the state. Everything else falls through to the
-- general path, which decides every case.
--
-- KEYS[i]   the state key of item i (a key may appear more than once). The
--           key names the algorithm, the window and the state format
--           (<prefix>:<policy>|{<key>}|<format><algorithm><window_ms>), so
--           state is only ever read under the parameters that wrote it.
-- ARGV[1]   "check" (decide each item), "all" (commit only if every item is
--           admitted), "peek" (decide, write nothing) or "lease" (settle and
--           grant a lease on one key: see *Leases* below for its arguments)
-- ARGV[2]   the deadline, in Redis's clock (ms since the epoch): past it the
--           caller has given up, and the script refuses to run
-- ARGV[3]   "" to decide by the Redis server's clock (TIME), or milliseconds
--           since the epoch (tests only)
-- ARGV[4..] per item: algorithm (a code below), limit, window_ms, capacity
--           (burst for the buckets, limit otherwise), cost; for an acquire
--           of a concurrency slot, window_ms is the slot TTL and the slot's
--           id (a decimal string) stands in capacity's place (a
--           concurrency policy's capacity is its limit, sent already). A calendar
--           quota (a fixed window over local days, weeks, months or
--           years) sends, for window_ms, "b0:b1:b2:b3": the bounds of three
--           consecutive local periods, which quotad computes (Lua has no
--           time zones) around its reading of this clock; the window is
--           the one holding the instant decided at, and none holding it
--           is an error (QUOTAD_CLOCK), never a guess.
--
-- Returns the TIME read (ms), then four integers per item: remaining,
-- retry_after_ms, reset_after_ms, reason (a code below; the item is
-- allowed exactly when it is WITHIN, and its limit is the capacity quotad
-- sent); when any item is an acquire, then one more: the ended slots the
-- call dropped (expired unreleased). The TIME alone means refused: past the deadline,
-- nothing read or written. A key holding state that cannot be read is an
-- error reply QUOTAD_CORRUPT naming the key in an all-or-nothing batch (or
-- an error raised on a lone check's short path); in "check" and "peek" it
-- fails only its own items, answered with reason 0 (UNREADABLE), and is
-- neither read further nor written.
--
-- The script's own codes, matched by the table in wire.rs (a test holds
-- them together; they are not quotad.v1's enum numbers, whatever those
-- become):
--   algorithms  1 fixed window, 2 sliding window, 3 token bucket,
--               4 leaky bucket, 5 sliding log, 6 concurrency (an acquire)
--   reasons     0 UNREADABLE (no decision), 1 WITHIN, 2 EXCEEDED,
--               3 TOO_BIG (cost exceeds capacity), 4 CAPACITY (an acquire
--               whose slot id is held already), 5 BATCH_REJECTED
--
-- State, with a TTL equal to the time until it is fresh again:
--   fixed window    hash: one field, the window's start (ms), whose value
--                   is the count (HINCRBY counts in place); for a calendar
--                   period "start:end", the bounds of the period the count
--                   was begun in, which a calendar in another zone goes on
--                   counting in until it ends
--   sliding window  string "start:previous:current"
--   token bucket    string "tokens:at" (tokens x window_ms)
--   leaky bucket    string "level:at" (level x window_ms)
--   sliding log     sorted set: member "ms:cost" per admission millisecond,
--                   score = the units admitted before it (a running total)
-- and, for a key holding leases, its ledger under the state key's name
-- followed by LEDGER (same hash tag, same slot): a string of grants
-- "id:units:granted_at:ends_at", with a TTL to when its last grant stops
-- counting. Checks of buckets and logs read it (their short paths step
-- aside when it exists); the windows charged their leases to the count.
--
-- An acquire (algorithm 6) is decided on the key's slots (slots.lua, which
-- quotad puts in front of this script): "check" takes a slot when it fits,
-- "all" takes every batch's slot or none, "peek" answers what an acquire
-- would (what is free now; the wait until the slots' ends free enough).
-- Two acquires of one key in one call see each other.

local WITHIN, EXCEEDED, TOO_BIG, CAPACITY, BATCH_REJECTED = 1, 2, 3, 4, 5
local UNREADABLE = 0
local FIXED_ID, LOG_ID = 1, 5
local SLOTS_ID = 6
local MAX_EXACT = 9007199254740992
-- Entries of a sliding log that have left, removed per write at most.
local MAX_GONE = 32
-- The suffix of a key's lease ledger (keys.rs, LEDGER_SUFFIX): the state
-- key's name and so its hash tag, its Cluster slot.
local LEDGER = '|g'
-- Lease replies: LEASED (then the outcome), UNKNOWN_LEASE, OVERSPENT.
local LEASED, UNKNOWN_LEASE, OVERSPENT = 1, 2, 3

local fmod = math.fmod
local tonumber = tonumber

-- The clock, and the deadline -----------------------------------------------

local t = redis.call('TIME')
local micros = tonumber(t[2])
local time = tonumber(t[1]) * 1000 + (micros - fmod(micros, 1000)) / 1000
-- The caller has given up: its answer was "failed", so nothing may count.
if time > tonumber(ARGV[2]) then
  return { time }
end

local mode = ARGV[1]
-- With an injected clock (tests), real time runs ahead of it, so a TTL
-- measured on the injected clock would expire state early; a minute of
-- slack keeps it. Stale state is harmless: it reads as fresh.
local now, ttl_slack = time, 0
if ARGV[3] ~= '' then now, ttl_slack = tonumber(ARGV[3]), 60000 end

-- The calendar period holding `at` among the bounds `arg` sends
-- ("b0:b1:b2:b3"): its start and end, or nil when none holds it.
local function calendar_window(arg, at)
  local prev
  for b in string.gmatch(arg, '%d+') do
    b = tonumber(b)
    if prev and prev <= at and at < b then return prev, b end
    prev = b
  end
  return nil
end

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

-- Short paths for a lone check ---------------------------------------------
--
-- The same arithmetic as the general path below, before anything of it is
-- built: its tables and closures cost more Redis time than the decision.
-- Each path answers only what it is sure of, and writes nothing otherwise;
-- everything else falls through to the general path.

if #KEYS == 1 and mode == 'check' then
  local key, alg = KEYS[1], ARGV[4]
  local limit, w, cost = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8])
  if alg == '1' then
    -- Fixed window: the count is a hash field named by its window's start,
    -- so HINCRBY counts in place; the hash's other fields are looked at
    -- only when a window's first count is made. Too big a cost, or another
    -- window's count, take the general path.
    -- The sum stays exact in a double: count <= limit after the check.
    local start, stop, field
    if w then
      start = now - fmod(now, w)
      stop = start + w
      field = start
    else
      start, stop = calendar_window(ARGV[6], now)
      -- A calendar count's field names its period's end too (see State).
      if start then field = string.format('%d:%d', start, stop) end
    end
    if start and cost <= limit and limit <= MAX_EXACT - cost then
      -- A key of another type answers WRONGTYPE: corrupt state, for quotad.
      local n = redis.call('HINCRBY', key, field, cost)
      local wait = stop - now
      local alone = true
      if n == cost then
        -- This window's first count: another window's may be there, a
        -- later one (Redis's clock stepped back) or one gone by.
        if redis.call('HLEN', key) > 1 then
          redis.call('HDEL', key, field)
          alone = false
        else
          redis.call('PEXPIRE', key, wait + ttl_slack)
        end
      end
      if alone then
        if n <= limit then
          -- Admitted: remaining and reset_after_ms; no wait, within the limit.
          return { time, limit - n, wait }
        end
        redis.call('HINCRBY', key, field, -cost)
        local before = n - cost
        if before > limit then before = limit end
        return { time, limit - before, wait, wait, EXCEEDED }
      end
    end
  elseif alg == '2' then
    -- Sliding window, admitted: GET, then SET. A denial, too big a cost or
    -- a later window take the general path.
    local start = now - fmod(now, w)
    -- A key of another type answers a table: the general path reports it.
    local raw = redis.pcall('GET', key)
    local prev, curr, here = 0, 0, cost <= limit and type(raw) ~= 'table'
    if here and raw then
      local s, p, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
      s = tonumber(s)
      if not s or s > start then
        here = false
      elseif s == start then
        prev, curr = tonumber(p), tonumber(c)
      elseif start - s <= w then
        prev = tonumber(c)
      end
    end
    if here then
      local elapsed = now - start
      -- round(prev x (w - elapsed) / w), halves up
      local x = prev * (w - elapsed)
      local r = fmod(x, w)
      local estimate = (x - r) / w + curr
      if 2 * r >= w then estimate = estimate + 1 end
      if estimate <= limit - cost then
        local reset = w - elapsed + w
        redis.call('SET', key, string.format('%d:%d:%d', start, prev, curr + cost), 'PX', reset + ttl_slack)
        return { time, limit - estimate - cost, reset }
      end
    end
  elseif alg == '3' or alg == '4' then
    -- Buckets, admitted. Token and leaky buckets are duals (tokens =
    -- capacity - level), so one computation in levels serves both; the
    -- token bucket stores its tokens.
    local cap = tonumber(ARGV[7]) * w
    local tokens = alg == '3'
    local raw = redis.pcall('GET', key)
    -- A bucket whose key holds leases refills under their cap: the
    -- general path reads them.
    local level, here = 0, type(raw) ~= 'table' and redis.call('EXISTS', key .. LEDGER) == 0
    if here and raw then
      local saved, at = string.match(raw, '^(%d+):(%d+)$')
      saved, at = tonumber(saved), tonumber(at)
      -- A state from later (the clock stepped back) takes the general path.
      if not at or at > now then
        here = false
      else
        if tokens then saved = cap - saved end
        if now - at < cdiv(saved, limit) then level = saved - limit * (now - at) end
      end
    end
    if here and level <= cap - cost * w then
      level = level + cost * w
      local reset = cdiv(level, limit)
      local stored = level
      if tokens then stored = cap - level end
      redis.call('SET', key, string.format('%d:%d', stored, now), 'PX', reset + ttl_slack)
      return { time, fdiv(cap - level, w), reset }
    end
  elseif alg == '5' then
    -- Sliding log, while no entry has left the window: admitted, or denied
    -- with nothing written. Entries that have left, a later entry or
    -- anything unexpected take the general path.
    local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    -- A log whose key holds leases counts them: the general path reads them.
    if not last.err and cost <= limit and redis.call('EXISTS', key .. LEDGER) == 0 then
      if #last == 0 then
        redis.call('ZADD', key, 0, string.format('%d:%d', now, cost))
        redis.call('PEXPIRE', key, w + ttl_slack)
        return { time, limit - cost, w }
      end
      local ms, c = string.match(last[1], '^(%d+):(%d+)$')
      ms, c = tonumber(ms), tonumber(c)
      local score = tonumber(last[2])
      if ms and ms <= now and ms + w > now then
        local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
        local fms = tonumber(string.match(first[1], '^(%d+):'))
        local total = score + c - tonumber(first[2])
        if fms and fms + w > now then
          if total <= limit - cost then
            if ms == now then
              redis.call('ZADD', key, score, string.format('%d:%d', ms, c + cost))
              redis.call('ZREM', key, last[1])
            else
              redis.call('ZADD', key, score + c, string.format('%d:%d', now, cost))
            end
            redis.call('PEXPIRE', key, w + ttl_slack)
            return { time, limit - total - cost, w }
          end
          -- Denied, nothing written: the wait is until the oldest entries
          -- whose leaving frees the excess have left, the last entry scored
          -- below first + excess (a score is the units before the entry).
          local target = tonumber(first[2]) + total - (limit - cost)
          local found = redis.call('ZREVRANGEBYSCORE', key, '(' .. string.format('%d', target), '-inf', 'LIMIT', 0, 1)
          local fm = tonumber(string.match(found[1] or '', '^(%d+):'))
          if fm then
            local remaining = limit - total
            if remaining < 0 then remaining = 0 end
            return { time, remaining, fm + w - now, ms + w - now, EXCEEDED }
          end
        end
      end
    end
  end
end

local function min(a, b)
  if a < b then return a end
  return b
end

local function max(a, b)
  if a > b then return a end
  return b
end

-- Raised (as an error object) by a read that finds a member of a log that
-- is not quotad's: caught for that item alone (see the main loop); any
-- other error stays a script error.
local NOT_QUOTADS = {}

local function corrupt(key, why)
  return redis.error_reply('QUOTAD_CORRUPT ' .. key .. ': ' .. why)
end

-- Loading and storing state ---------------------------------------------

-- The fixed window stored under `key`, { start, count } (a calendar
-- period's { start, count, end }), nil when there is none, or an error
-- reply. Of several windows (a call that found another window's count left
-- it for this path), the latest counts.
local function load_fixed(key)
  local raw = redis.pcall('HGETALL', key)
  if raw.err then return nil, corrupt(key, raw.err) end
  local st
  for i = 1, #raw, 2 do
    local s, e = string.match(raw[i], '^(%d+):(%d+)$')
    if not s then s = string.match(raw[i], '^%d+$') end
    if not (s and string.match(raw[i + 1], '^%d+$')) then
      return nil, corrupt(key, 'not fixed-window state')
    end
    s = tonumber(s)
    if not st or s > st[1] then st = { s, tonumber(raw[i + 1]), tonumber(e) } end
  end
  return st
end

-- The hash field a fixed window's count is stored in.
local function fixed_field(st)
  if st[3] then return string.format('%d:%d', st[1], st[3]) end
  return st[1]
end

-- Writes a fixed window's count as the hash's one field.
local function store_fixed(key, st, loaded, ttl)
  if loaded and not (st and loaded[1] == st[1] and loaded[3] == st[3]
      and redis.call('HLEN', key) == 1) then
    redis.call('DEL', key)
  end
  if st then
    redis.call('HSET', key, fixed_field(st), string.format('%d', st[2]))
    redis.call('PEXPIRE', key, ttl)
  end
end

local PATTERNS = {
  [2] = '^(%d+):(%d+):(%d+)$',
  [3] = '^(%d+):(%d+)$',
  [4] = '^(%d+):(%d+)$',
}
-- '%d', not tostring or '..': those write 2^53 as 9.007199254741e+15.
local FORMATS = { [2] = '%d:%d:%d', [3] = '%d:%d', [4] = '%d:%d' }

-- The numbers stored under `key`, nil when there is none, or an error reply.
local function load_string(key, alg)
  local raw = redis.pcall('GET', key)
  if not raw then return nil end
  if type(raw) == 'table' then return nil, corrupt(key, tostring(raw.err)) end
  local a, b, c = string.match(raw, PATTERNS[alg])
  if not a then return nil, corrupt(key, 'not the state of algorithm ' .. alg) end
  return { tonumber(a), tonumber(b), tonumber(c) }
end

-- The lease ledger under `key` (the state key's name with LEDGER after
-- it): a string of grants "id:units:granted_at:ends_at", oldest first,
-- separated by commas; {} when there is none, or an error reply. Ids stay
-- strings: they are full 64-bit values, which a double cannot hold.
local function load_ledger(key)
  local raw = redis.pcall('GET', key)
  if not raw then return {} end
  if type(raw) == 'table' then return nil, corrupt(key, tostring(raw.err)) end
  local grants = {}
  for entry in string.gmatch(raw, '[^,]+') do
    local id, u, g, e = string.match(entry, '^(%d+):(%d+):(%d+):(%d+)$')
    if not id then return nil, corrupt(key, 'not a lease ledger') end
    grants[#grants + 1] = { id = id, units = tonumber(u), granted = tonumber(g), ends = tonumber(e) }
  end
  return grants
end

-- Each algorithm's code is built when a call first needs it: a script's
-- body runs on every call, and making closures it does not use would cost
-- more than the decision itself.
local BUILD = {}

BUILD[1] = function()
-- Fixed window -----------------------------------------------------------

local FIXED = {}

function FIXED.floor(st) return st[1] end

function FIXED.advance(p, st, at)
  local start, stop
  if p.bounds and st and st[3] and at < st[3] then
    -- A calendar count runs to the end of the period it was begun in,
    -- whichever zone began it (the key names the period kind only).
    return { p = p, at = at, start = st[1], stop = st[3], count = st[2] }
  elseif p.bounds then
    start, stop = calendar_window(p.bounds, at)
    if not start then
      error({ err = 'QUOTAD_CLOCK the instant decided at is outside the calendar periods quotad sent' })
    end
  else
    start = at - fmod(at, p.window)
    stop = start + p.window
  end
  local count = 0
  -- (A calendar count whose period has ended counts for nothing.)
  if st and not p.bounds and st[1] >= start then count = st[2] end
  return { p = p, at = at, start = start, stop = stop, count = count }
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
  if m.count > 0 and m.p.bounds then return { m.start, m.count, m.stop } end
  if m.count > 0 then return { m.start, m.count } end
  return nil
end

-- Every leased unit must land in the window it was charged to.
function FIXED.lease_end(m) return m.stop end
FIXED.grant = FIXED.consume
function FIXED.linger(m) return 0 end

-- A live lease ends with its window: that window is this one.
function FIXED.refund(m, g, unused)
  m.count = max(m.count - unused, 0)
  return nil
end

return FIXED
end

BUILD[2] = function()
-- Sliding window counter -------------------------------------------------

local SLIDING = {}

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

-- A leased unit counts in the current window: it must be spent before
-- this window becomes the previous one.
function SLIDING.lease_end(m) return m.start + m.p.window end
SLIDING.grant = SLIDING.consume
function SLIDING.linger(m) return 0 end

function SLIDING.refund(m, g, unused)
  m.curr = max(m.curr - unused, 0)
  return nil
end

return SLIDING
end

-- Leases a bucket holds back --------------------------------------------
--
-- A lease takes its units out of the bucket when granted, and while it is
-- live the bucket refills only up to capacity - outstanding (a leaky bucket
-- drains only down to outstanding), the cap rising at each lease's end: the
-- same segments as quotad-core's bucket.rs. `held` is a list of
-- { ends_at, units }, soonest end first. Every sum stays below 2^53: the
-- units a ledger holds were live together once, charged to one bucket, so
-- they never exceed its capacity; each flow is compared (by a ceiling
-- division) before it is multiplied out, so no product passes a cap.

local HELD
local function held_lib()
  if HELD then return HELD end
  local H = {}

  local function before(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end

  -- The grants live after `from`.
  function H.after(grants, from)
    local held = {}
    for _, g in ipairs(grants) do
      if g.ends > from then held[#held + 1] = { g.ends, g.units } end
    end
    table.sort(held, before)
    return held
  end

  -- Units outstanding, scaled by `unit`.
  function H.scaled(held, unit)
    local sum = 0
    for _, h in ipairs(held) do sum = sum + h[2] * unit end
    return sum
  end

  -- Drops the leases that have ended by `at`.
  function H.pass(held, at)
    local kept = {}
    for _, h in ipairs(held) do
      if h[1] > at then kept[#kept + 1] = h end
    end
    return kept
  end

  function H.add(held, ends, units)
    held[#held + 1] = { ends, units }
    table.sort(held, before)
  end

  function H.remove(held, ends, units)
    for i, h in ipairs(held) do
      if h[1] == ends and h[2] == units then
        table.remove(held, i)
        return
      end
    end
  end

  -- The segment i of `held` (1 .. #held + 1): its end and the units held
  -- during it are walked by the callers; the last is open-ended.
  local function seg_end(held, i)
    if i <= #held then return held[i][1], held[i][2] end
    return math.huge, 0
  end

  -- min(v + rate * dt, cap), without forming a product past cap.
  local function add_capped(v, rate, dt, cap)
    if v >= cap or dt >= cdiv(cap - v, rate) then return cap end
    return v + rate * dt
  end

  -- max(v - rate * dt, 0) raised to min(floor, v), likewise.
  local function sub_floored(v, rate, dt, floor)
    local f = min(floor, v)
    if v <= f then return v end
    if dt >= cdiv(v - f, rate) then return f end
    return v - rate * dt
  end

  -- Tokens at `to`, refilled from `tokens` at `from` under each segment's
  -- cap capacity - held.
  function H.refill(tokens, from, to, rate, cap, unit, held)
    local during, t = H.scaled(held, unit), from
    for i = 1, #held + 1 do
      local e, u = seg_end(held, i)
      local untl = min(e, to)
      tokens = add_capped(tokens, rate, untl - t, max(cap - during, 0))
      t = untl
      if e >= to then break end
      during = during - u * unit
    end
    return tokens
  end

  -- The wait from `at` until tokens refilled under the caps reach `need`.
  function H.wait_tokens(need, tokens, at, rate, cap, unit, held)
    local during, t = H.scaled(held, unit), at
    for i = 1, #held + 1 do
      local e, u = seg_end(held, i)
      local c = max(cap - during, 0)
      if c >= need then
        local reached = t + cdiv(max(need - tokens, 0), rate)
        if reached <= e then return reached - at end
      end
      tokens = add_capped(tokens, rate, e - t, c)
      t = e
      during = during - u * unit
    end
    return MAX_EXACT
  end

  -- Level at `to`, drained from `level` at `from` down to each segment's
  -- floor: the dual of refill.
  function H.drain(level, from, to, rate, unit, held)
    local during, t = H.scaled(held, unit), from
    for i = 1, #held + 1 do
      local e, u = seg_end(held, i)
      local untl = min(e, to)
      level = sub_floored(level, rate, untl - t, during)
      t = untl
      if e >= to then break end
      during = during - u * unit
    end
    return level
  end

  -- The wait from `at` until the level, drained to the floors, is at most
  -- `target`.
  function H.wait_level(target, level, at, rate, unit, held)
    local during, t = H.scaled(held, unit), at
    for i = 1, #held + 1 do
      local e, u = seg_end(held, i)
      if during <= target then
        local reached = t + cdiv(max(level - target, 0), rate)
        if reached <= e then return reached - at end
      end
      level = sub_floored(level, rate, e - t, during)
      t = e
      during = during - u * unit
    end
    return MAX_EXACT
  end

  HELD = H
  return H
end

BUILD[3] = function()
-- Token bucket (units of 1/window of a token) ---------------------------

local TOKEN = {}
local H = held_lib()

function TOKEN.floor(st) return st[2] end

function TOKEN.advance(p, st, at, grants)
  local unit = p.window
  local cap = p.cap * unit
  local tokens, held = cap, {}
  if st and not (grants and #grants > 0) then
    local saved = st[1]
    local dt = max(at - st[2], 0)
    if saved < cap and dt < cdiv(cap - saved, p.limit) then
      tokens = saved + p.limit * dt
    end
  elseif st then
    held = H.after(grants, st[2])
    tokens = H.refill(st[1], st[2], at, p.limit, cap, unit, held)
    held = H.pass(held, at)
  end
  return { p = p, at = at, unit = unit, cap = cap, tokens = tokens, held = held }
end

function TOKEN.fits(m, c) return m.tokens >= c * m.unit end
function TOKEN.consume(m, c) m.tokens = m.tokens - c * m.unit end
function TOKEN.remaining(m) return fdiv(m.tokens, m.unit) end

function TOKEN.retry(m, c)
  if #m.held > 0 then
    return H.wait_tokens(c * m.unit, m.tokens, m.at, m.p.limit, m.cap, m.unit, m.held)
  end
  return cdiv(c * m.unit - m.tokens, m.p.limit)
end

function TOKEN.reset(m)
  if #m.held > 0 then
    return H.wait_tokens(m.cap, m.tokens, m.at, m.p.limit, m.cap, m.unit, m.held)
  end
  return cdiv(m.cap - m.tokens, m.p.limit)
end

function TOKEN.into(m)
  if m.tokens < m.cap then return { m.tokens, m.at } end
  return nil
end

function TOKEN.lease_end(m) return math.huge end
function TOKEN.linger(m) return 0 end

function TOKEN.grant(m, units, ends)
  TOKEN.consume(m, units)
  H.add(m.held, ends, units)
end

function TOKEN.refund(m, g, unused)
  H.remove(m.held, g.ends, g.units)
  local c = max(m.cap - H.scaled(m.held, m.unit), 0)
  local back = unused * m.unit
  if m.tokens >= c or back >= c - m.tokens then
    m.tokens = c
  else
    m.tokens = m.tokens + back
  end
  return nil
end

return TOKEN
end

BUILD[4] = function()
-- Leaky bucket (units of 1/window of a token) ---------------------------

local LEAKY = {}
local H = held_lib()

function LEAKY.floor(st) return st[2] end

function LEAKY.advance(p, st, at, grants)
  local unit = p.window
  local level, held = 0, {}
  if st and not (grants and #grants > 0) then
    local saved = st[1]
    local dt = max(at - st[2], 0)
    if dt < cdiv(saved, p.limit) then
      level = saved - p.limit * dt
    end
  elseif st then
    held = H.after(grants, st[2])
    level = H.drain(st[1], st[2], at, p.limit, unit, held)
    held = H.pass(held, at)
  end
  return { p = p, at = at, unit = unit, cap = p.cap * unit, level = level, held = held }
end

function LEAKY.fits(m, c) return m.level <= m.cap - c * m.unit end
function LEAKY.consume(m, c) m.level = m.level + c * m.unit end
function LEAKY.remaining(m) return fdiv(max(m.cap - m.level, 0), m.unit) end

function LEAKY.retry(m, c)
  local target = m.cap - c * m.unit
  if #m.held > 0 then
    return H.wait_level(target, m.level, m.at, m.p.limit, m.unit, m.held)
  end
  return cdiv(m.level - target, m.p.limit)
end

function LEAKY.reset(m)
  if #m.held > 0 then
    return H.wait_level(0, m.level, m.at, m.p.limit, m.unit, m.held)
  end
  return cdiv(m.level, m.p.limit)
end

function LEAKY.into(m)
  if m.level > 0 then return { m.level, m.at } end
  return nil
end

function LEAKY.lease_end(m) return math.huge end
function LEAKY.linger(m) return 0 end

function LEAKY.grant(m, units, ends)
  LEAKY.consume(m, units)
  H.add(m.held, ends, units)
end

function LEAKY.refund(m, g, unused)
  H.remove(m.held, g.ends, g.units)
  local floor = H.scaled(m.held, m.unit)
  m.level = max(max(m.level - unused * m.unit, 0), min(floor, m.level))
  return nil
end

return LEAKY
end

BUILD[5] = function()
local LOG = {}

-- Sliding log: a sorted set, one member "ms:cost" per admission
-- millisecond, scored by the units admitted before it. The total in the
-- window is a subtraction, and the retry time a search by score: a check
-- costs O(log n), whatever the number of entries.


local function log_entry(member, score)
  local ms, cost = string.match(member, '^(%d+):(%d+)$')
  if not ms then return nil end
  return { ms = tonumber(ms), cost = tonumber(cost), score = tonumber(score), member = member }
end

-- The live part of the log under `key` at `now`: nil when there is no
-- key, `{ stale = true }` when every entry has left, or an error reply.
-- Entries that have left are only counted (`gone`, the leading ones); up
-- to MAX_GONE of them are dropped when the state is written (the rest by
-- later writes), so a peek or a refused batch changes nothing.
function LOG.load(key, window, now)
  local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last.err then return nil, corrupt(key, last.err) end
  if #last == 0 then return nil end
  last = log_entry(last[1], last[2])
  if not last then return nil, corrupt(key, 'not a sliding log') end
  local at = max(now, last.ms)
  if last.ms + window <= at then return { stale = true } end
  local seen = {}
  -- The entry at `rank`; past the end counts as live (the last one is).
  local function live(rank)
    local e = seen[rank]
    if e == nil then
      local raw = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
      if #raw == 0 then return true end
      e = log_entry(raw[1], raw[2]) or false
      seen[rank] = e
    end
    if not e then return nil end
    return e.ms + window > at
  end
  -- The first live entry: galloping from the front, then halving, so the
  -- common answers (none or one gone) cost one or two reads. Past the
  -- first few, it gallops from the back too (ranks >= hi are live), so a
  -- log whose entries mostly left at once costs O(log live), not
  -- O(log gone): ranks < lo have left, ranks >= hi have not.
  -- (`hi` is read, by ZCARD, only once the back is probed.)
  local lo, hi, step = 0, nil, 1
  while hi == nil or lo < hi do
    local probe = lo + step - 1
    if hi and probe >= hi then break end
    local ok = live(probe)
    if ok == nil then return nil, corrupt(key, 'not a sliding log') end
    if ok then hi = probe break end
    lo = probe + 1
    if step >= 8 and not hi then hi = redis.call('ZCARD', key) - 1 end
    if step >= 8 and hi - step >= lo then
      probe = hi - step
      ok = live(probe)
      if ok == nil then return nil, corrupt(key, 'not a sliding log') end
      if ok then hi = probe else lo = probe + 1 break end
    end
    step = step * 2
  end
  while lo < hi do
    local mid = fdiv(lo + hi, 2)
    local ok = live(mid)
    if ok == nil then return nil, corrupt(key, 'not a sliding log') end
    if ok then hi = mid else lo = mid + 1 end
  end
  if not seen[lo] then live(lo) end
  return { key = key, first = seen[lo], last = last, gone = lo }
end

-- A log's state in this call: `first` and `last` stored entries (nil when
-- none), and what earlier items consumed at `at`: `merged` into the stored
-- last entry (same millisecond), or `pending` as a new one.
function LOG.floor(st)
  if st.last then return max(st.last.ms, st.at or 0) end
  return st.at
end

-- A key's leases count too (`leased`, { counted until, units }): a lease
-- is one entry, from its grant until a window after its end, as its holder
-- may admit with it until then.
function LOG.advance(p, st, at, grants)
  local m = { p = p, at = at, st = st, total = 0, merged = 0, pending = 0, leased = {}, lent = 0 }
  if st then
    m.merged, m.pending = st.merged or 0, st.pending or 0
    if st.last then m.total = st.last.score + st.last.cost - st.first.score end
    m.total = m.total + m.merged + m.pending
  end
  if grants then
    for _, g in ipairs(grants) do
      local untl = g.ends + p.window
      if untl > at then
        m.leased[#m.leased + 1] = { untl, g.units }
        m.lent = m.lent + g.units
      end
    end
  end
  return m
end

function LOG.fits(m, c) return m.total + m.lent <= m.p.limit - c end

function LOG.consume(m, c)
  local st = m.st
  if st and st.last and st.last.ms == m.at then
    m.merged = m.merged + c
  else
    m.pending = m.pending + c
  end
  m.total = m.total + c
end

function LOG.remaining(m) return max(m.p.limit - m.total - m.lent, 0) end

-- The wait until `excess` units have left, the log's entries and the
-- leases' together, soonest first. Reads the whole log: only a denial on
-- a key that holds leases comes here (the memory store walks its log
-- then too).
local function wait_with_leases(m, excess)
  local w, st = m.p.window, m.st
  local leaving = {}
  for _, l in ipairs(m.leased) do leaving[#leaving + 1] = { l[1], l[2] } end
  if st and st.last then
    local raw = redis.call('ZRANGE', st.key, st.gone or 0, -1)
    for i, member in ipairs(raw) do
      local e = log_entry(member, 0)
      if not e then error(NOT_QUOTADS) end
      local units = e.cost
      if i == #raw then units = units + m.merged end
      leaving[#leaving + 1] = { e.ms + w, units }
    end
  end
  if m.pending > 0 then leaving[#leaving + 1] = { m.at + w, m.pending } end
  table.sort(leaving, function(a, b) return a[1] < b[1] end)
  local freed = 0
  for _, l in ipairs(leaving) do
    freed = freed + l[2]
    if freed >= excess then return max(l[1] - m.at, 0) end
  end
  return w
end

function LOG.retry(m, c)
  if #m.leased > 0 then return wait_with_leases(m, m.total + m.lent - (m.p.limit - c)) end
  local excess = m.total - (m.p.limit - c)
  local st = m.st
  if not (st and st.last) then return m.p.window end
  -- The oldest entries whose leaving frees `excess` units: the last entry
  -- scored below first + excess (a score is the units before the entry).
  local target = st.first.score + excess
  if st.last.score + st.last.cost + m.merged < target then return m.p.window end
  local found = redis.call('ZREVRANGEBYSCORE', st.key, '(' .. string.format('%d', target), '-inf', 'LIMIT', 0, 1)
  local entry = found[1] and log_entry(found[1], 0)
  if not entry then error(NOT_QUOTADS) end
  return entry.ms + m.p.window - m.at
end

local function log_reset(m)
  if m.total == 0 then return 0 end
  if m.pending > 0 then return m.p.window end
  return m.st.last.ms + m.p.window - m.at
end

function LOG.reset(m)
  local reset = log_reset(m)
  for _, l in ipairs(m.leased) do reset = max(reset, l[1] - m.at) end
  return reset
end

function LOG.lease_end(m) return math.huge end
function LOG.linger(m) return m.p.window end

-- A lease takes no entry of the log: it is counted as one of `leased`.
function LOG.grant(m, units, ends)
  m.leased[#m.leased + 1] = { ends + m.p.window, units }
  m.lent = m.lent + units
end

-- What was spent stays counted, as admitted at the return, for a window:
-- the ledger keeps it as a lease that ended then.
function LOG.refund(m, g, unused)
  local untl = g.ends + m.p.window
  for i, l in ipairs(m.leased) do
    if l[1] == untl and l[2] == g.units then
      table.remove(m.leased, i)
      m.lent = m.lent - g.units
      break
    end
  end
  local spent = g.units - unused
  if spent == 0 then return nil end
  -- Never from before the grant: a clock that stepped back.
  local stop = max(m.at, g.granted)
  m.leased[#m.leased + 1] = { stop + m.p.window, spent }
  m.lent = m.lent + spent
  return { id = g.id, units = spent, granted = g.granted, ends = stop }
end

-- What this call consumed, kept for the next item on the same key and for
-- the write at the end.
function LOG.into(m)
  local st = m.st or {}
  st.merged, st.pending, st.at = m.merged, m.pending, m.at
  if st.last or st.pending > 0 then return st end
  return nil
end

function LOG.store(key, st, ttl)
  local last = st.last
  -- At most MAX_GONE entries that have left go per write: a log whose
  -- entries mostly left at once (a key unused for most of a window) is
  -- emptied over its next writes, never in one long call; the rest wait at
  -- the front, where `load` steps over them in O(log n).
  if st.gone and st.gone > 0 then
    redis.call('ZREMRANGEBYRANK', key, 0, min(st.gone, MAX_GONE) - 1)
    st.gone = 0
  end
  if not last then
    redis.call('ZADD', key, 0, string.format('%d:%d', st.at, st.pending))
  else
    if st.merged > 0 then
      redis.call('ZADD', key, last.score, string.format('%d:%d', last.ms, last.cost + st.merged))
      redis.call('ZREM', key, last.member)
    end
    if st.pending > 0 then
      redis.call('ZADD', key, last.score + last.cost + st.merged, string.format('%d:%d', st.at, st.pending))
    end
  end
  redis.call('PEXPIRE', key, ttl)
end

return LOG
end

-- The shared steps -------------------------------------------------------

local METERS = setmetatable({}, {
  __index = function(meters, alg)
    local M = BUILD[alg]()
    meters[alg] = M
    return M
  end,
})

-- `grants`: the key's leases, for the algorithms whose checks count them
-- (buckets and the log); nil for a key without any.
local function evaluate(p, st, now, cost, consume, grants)
  local M = METERS[p.alg]
  local at = now
  if st then at = max(now, M.floor(st)) end
  local skew = at - now
  local m = M.advance(p, st, at, grants)
  local allowed, reason, retry = 0, TOO_BIG, 0
  if cost <= p.cap then
    if M.fits(m, cost) then
      if consume then M.consume(m, cost) end
      allowed, reason = 1, WITHIN
    else
      reason, retry = EXCEEDED, M.retry(m, cost) + skew
    end
  end
  local reset = M.reset(m)
  if reset > 0 then reset = reset + skew end
  return m, { allowed, p.cap, M.remaining(m), retry, reset, reason }
end


-- Leases ------------------------------------------------------------------
--
-- mode "lease": KEYS[1] the state key, KEYS[2] its ledger; ARGV[4..8] as
-- one item (its cost unused), then the lease terms and the request:
-- ARGV[9] max_units, ARGV[10] min_units, ARGV[11] max_ttl_ms, ARGV[12] the
-- most live grants a key holds, ARGV[13] the id of the lease to settle
-- ("" for none), ARGV[14] its ends_at, ARGV[15] what its holder spent,
-- ARGV[16] units wanted (0: none), ARGV[17] the new lease's id. Ids are
-- decimal strings, compared as strings, never numbers.
--
-- The settle is validated first, at the clock, and an unknown or
-- overspent lease changes nothing. Then, at the key's instant, ended
-- grants are purged, the lease settled (its unspent units go back, as the
-- algorithm's refund says) and a new one granted: at most the units
-- wanted, max_units and a fair share of what is free, none below
-- min_units or past the key's bound on live grants (direct). State and
-- ledger are written together; the ledger's TTL runs to the last instant
-- any of its grants counts.
--
-- Returns TIME, then OVERSPENT and the lease's units, or UNKNOWN_LEASE,
-- or LEASED and: settled (0 none named, 1 returned, 2 ended), units
-- returned, answer (0 none asked, 1 granted, 2 direct), units granted,
-- granted_at, ends_at, remaining, reset_after_ms.

if mode == 'lease' then
  local key, lkey = KEYS[1], KEYS[2]
  local p = {
    alg = tonumber(ARGV[4]),
    limit = tonumber(ARGV[5]),
    window = tonumber(ARGV[6]),
    cap = tonumber(ARGV[7]),
  }
  if not p.window then p.bounds = ARGV[6] end
  local max_units, min_units = tonumber(ARGV[9]), tonumber(ARGV[10])
  local max_ttl, max_grants = tonumber(ARGV[11]), tonumber(ARGV[12])
  local settle_id, settle_ends, spent = ARGV[13], tonumber(ARGV[14]), tonumber(ARGV[15])
  local want, new_id = tonumber(ARGV[16]), ARGV[17]
  local grants, err = load_ledger(lkey)
  if err then return err end
  if settle_id ~= '' then
    local held
    for _, g in ipairs(grants) do
      if g.id == settle_id then held = g break end
    end
    -- Held, live or ended (a log counts an ended one a while longer), or
    -- not held and ended by its own account: settled. Otherwise unknown.
    if held and held.ends > now and spent > held.units then
      local r = { time, OVERSPENT, held.units }
      return r
    end
    if not held and settle_ends > now then
      local r = { time, UNKNOWN_LEASE }
      return r
    end
  end
  local st
  if p.alg == LOG_ID then
    st, err = METERS[LOG_ID].load(key, p.window, now)
  elseif p.alg == FIXED_ID then
    st, err = load_fixed(key)
  else
    st, err = load_string(key, p.alg)
  end
  if err then return err end
  local was_stale = false
  if st and st.stale then st, was_stale = nil, true end
  local loaded_st = st
  local M = METERS[p.alg]
  local at = now
  if st then at = max(now, M.floor(st)) end
  local m = M.advance(p, st, at, grants)
  local linger = M.linger(m)
  local kept = {}
  for _, g in ipairs(grants) do
    if g.ends + linger > at then kept[#kept + 1] = g end
  end
  grants = kept
  local settled, returned = 0, 0
  if settle_id ~= '' then
    settled = 2
    for i, g in ipairs(grants) do
      if g.id == settle_id and g.ends > at then
        table.remove(grants, i)
        returned = g.units - min(spent, g.units)
        local still = M.refund(m, g, returned)
        if still then grants[#grants + 1] = still end
        settled = 1
        break
      end
    end
  end
  local answer, units, ends = 0, 0, 0
  if want > 0 then
    answer = 2
    local live = 0
    for _, g in ipairs(grants) do
      if g.ends > at then live = live + 1 end
    end
    local stop = M.lease_end(m)
    -- The bound counts every grant held, live or still counted after its
    -- end (a log's): a settle never adds one, so this bounds them all.
    if #grants < max_grants then
      local u = min(min(want, max_units), fdiv(M.remaining(m), live + 1))
      if u >= min_units and M.fits(m, u) and stop > at then
        ends = min(stop, at + max_ttl)
        M.grant(m, u, ends)
        grants[#grants + 1] = { id = new_id, units = u, granted = at, ends = ends }
        answer, units = 1, u
      end
    end
  end
  local remaining, reset = M.remaining(m), M.reset(m)
  -- From the clock, as a check reports it (`at` is ahead of it when the
  -- clock stepped back), and the state's TTL with it.
  if reset > 0 then reset = reset + (at - now) end
  local ttl = max(reset, 1) + ttl_slack
  local into = M.into(m)
  if p.alg == LOG_ID then
    if was_stale then redis.call('UNLINK', key) end
    if into then M.store(key, into, ttl) end
  elseif p.alg == FIXED_ID then
    store_fixed(key, into, loaded_st, ttl)
  elseif into then
    redis.call('SET', key, string.format(FORMATS[p.alg], unpack(into)), 'PX', ttl)
  elseif loaded_st then
    redis.call('DEL', key)
  end
  if #grants == 0 then
    redis.call('DEL', lkey)
  else
    local parts, last = {}, 0
    for i, g in ipairs(grants) do
      parts[i] = string.format('%s:%d:%d:%d', g.id, g.units, g.granted, g.ends)
      last = max(last, g.ends + linger)
    end
    redis.call('SET', lkey, table.concat(parts, ','), 'PX', max(last - now, 1) + ttl_slack)
  end
  local r = { time, LEASED, settled, returned, answer, units, at, ends, remaining, reset }
  return r
end

-- Each key's state as loaded (for an all-or-nothing batch that is
-- refused), as it stands after the items so far, and its new TTL.
local loaded, states, resets, order, algs, stale, ledgers = {}, {}, {}, {}, {}, {}, {}
local unreadable = {}
-- The slots' functions, built by the first acquire; the ended slots the
-- writes drop; whether the reply carries their count.
local SLOTS, expired, acquires = nil, 0, false
local items, decisions = {}, {}
local all_allowed = true
for i = 1, #KEYS do
  local key = KEYS[i]
  local b = 3 + (i - 1) * 5
  local p = {
    alg = tonumber(ARGV[b + 1]),
    limit = tonumber(ARGV[b + 2]),
    window = tonumber(ARGV[b + 3]),
    cap = tonumber(ARGV[b + 4]),
  }
  -- A calendar quota's bounds (see ARGV above).
  if not p.window then p.bounds = ARGV[b + 3] end
  local cost = tonumber(ARGV[b + 5])
  if loaded[key] == nil then
    local st, err
    if p.alg == SLOTS_ID then
      SLOTS = SLOTS or SLOTS_LIB()
      local why
      st, why = SLOTS.load(key, now)
      if not st then err = corrupt(key, why) end
    elseif p.alg == LOG_ID then
      st, err = METERS[LOG_ID].load(key, p.window, now)
    elseif p.alg == FIXED_ID then
      st, err = load_fixed(key)
    else
      st, err = load_string(key, p.alg)
    end
    if err then
      -- An all-or-nothing batch is decided whole.
      if mode == 'all' then return err end
      unreadable[key] = true
    end
    -- A log whose every entry has left reads as fresh; its key goes when
    -- the state is written.
    if st and st.stale then st, stale[key] = nil, true end
    -- Buckets and the log count a key's leases; the windows charged them
    -- to their counts when they were granted.
    if not err and p.alg >= 3 and p.alg ~= SLOTS_ID then
      local grants
      grants, err = load_ledger(key .. LEDGER)
      if err then
        if mode == 'all' then return err end
        unreadable[key] = true
      elseif #grants > 0 then
        ledgers[key] = grants
      end
    end
    loaded[key] = st or false
    states[key] = st
    -- An unreadable key is not written.
    if not unreadable[key] then order[#order + 1] = key end
    algs[key] = p.alg
  end
  local d = { 0, 0, 0, 0, 0, UNREADABLE }
  if p.alg == SLOTS_ID then acquires = true end
  if p.alg == SLOTS_ID and not unreadable[key] then
    -- An acquire: ARGV[b + 4] is the slot's id, p.window its TTL. A Peek
    -- takes nothing, and so checks no id.
    local st, id, taking = states[key], ARGV[b + 4], mode ~= 'peek'
    if taking and SLOTS.holds(st, id) then
      d = { 0, p.limit, 0, 0, 0, CAPACITY }
    else
      local fits, remaining, retry, reset = SLOTS.decide(st, p.limit, p.window, cost, now, taking)
      if fits and taking then SLOTS.take(st, id, cost, p.window, now) end
      d = { 0, p.limit, remaining, retry, reset, EXCEEDED }
      if fits then d[1], d[6] = 1, WITHIN end
    end
    if taking then resets[key] = 0 end
  elseif not unreadable[key] then
    local ok, m, decided = true, nil, nil
    if p.alg == LOG_ID then
      -- A denial's wait reads a member the load did not: one that is not
      -- quotad's fails this item only (the key's state stays as the items
      -- before it left it), or the whole of an all-or-nothing batch.
      ok, m, decided = pcall(evaluate, p, states[key], now, cost, mode ~= 'peek', ledgers[key])
      -- On failure `m` is the error: only a member that is not quotad's is
      -- this item's; anything else is a bug, raised as before.
      if not ok and m ~= NOT_QUOTADS then error(m, 0) end
      if not ok and mode == 'all' then return corrupt(key, 'not a sliding log') end
    else
      m, decided = evaluate(p, states[key], now, cost, mode ~= 'peek', ledgers[key])
    end
    if ok then
      d = decided
      if mode ~= 'peek' then
        states[key] = METERS[p.alg].into(m)
        resets[key] = d[5]
      end
    end
  end
  -- Kept to answer a refused all-or-nothing batch.
  if mode == 'all' then items[i] = { p = p, cost = cost } end
  decisions[i] = d
  if d[1] == 0 then all_allowed = false end
end

if mode == 'all' and not all_allowed then
  -- Nothing is written; what would have fit is reported as rejected, with
  -- the key's budget as it stands.
  for i = 1, #KEYS do
    if decisions[i][1] == 1 and items[i].p.alg == SLOTS_ID then
      -- The slots as they were: what is free, and when they end.
      local p = items[i].p
      local st = SLOTS.as_loaded(states[KEYS[i]])
      local _, remaining, _, reset = SLOTS.decide(st, p.limit, p.window, items[i].cost, now, false)
      decisions[i] = { 0, p.limit, remaining, 0, reset, BATCH_REJECTED }
    elseif decisions[i][1] == 1 then
      local st = loaded[KEYS[i]] or nil
      if st and items[i].p.alg == LOG_ID then st.merged, st.pending, st.at = 0, 0, nil end
      local _, d = evaluate(items[i].p, st, now, items[i].cost, false, ledgers[KEYS[i]])
      decisions[i] = { 0, d[2], d[3], 0, d[5], BATCH_REJECTED }
    end
  end
elseif mode ~= 'peek' then
  for _, key in ipairs(order) do
    -- A key none of whose items was decided (each failed on a member of
    -- its log) is left as it was.
    if resets[key] ~= nil then
      local st = states[key]
      local ttl = max(resets[key], 1) + ttl_slack
      if algs[key] == SLOTS_ID then
        expired = expired + SLOTS.store(key, st, now, ttl_slack, false)
      elseif algs[key] == LOG_ID then
        -- UNLINK: a log of thousands of entries is freed off Redis's thread.
        if stale[key] then redis.call('UNLINK', key) end
        if st then METERS[LOG_ID].store(key, st, ttl) end
      elseif algs[key] == FIXED_ID then
        store_fixed(key, st, loaded[key] or nil, ttl)
      elseif st then
        redis.call('SET', key, string.format(FORMATS[algs[key]], unpack(st)), 'PX', ttl)
      elseif loaded[key] then
        redis.call('DEL', key)
      end
    end
  end
end

local out = { time }
for i = 1, #decisions do
  local d = decisions[i]
  out[#out + 1] = d[3]
  out[#out + 1] = d[4]
  out[#out + 1] = d[5]
  out[#out + 1] = d[6]
end
if acquires then out[#out + 1] = expired end
return out
