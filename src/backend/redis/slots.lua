-- quotad: the concurrency slots of one key, the part of the scripts that
-- reads, decides and writes them. quotad puts it in front of both scripts
-- that hold slots when it loads them (mod.rs): concurrency.lua (a lone
-- Acquire, Renew or Release) and quota.lua (an acquire as an item of a
-- batch next to rate items, and a Peek), so a slot is decided by the same
-- code whichever call it is, in the same exact integer arithmetic as
-- quotad-core's algorithm::acquire.
--
-- A key's slots (<prefix>:<policy>|{<key>}|<format>C0, so the key's hash
-- tag, its Cluster slot): a hash, one field per slot, its id (a decimal
-- string: a double cannot hold every u64), the value
-- "units:granted_at:ends_at"; a TTL to a minute after its last slot ends.
--
-- SLOTS_LIB() builds the functions when a call first needs them: a
-- script's body runs on every call, and a check of a rate makes none.

local function SLOTS_LIB()
  local S = {}

  -- The slots under `key` at `now`: `live` ({ id, units, ends_at,
  -- granted_at } each), `gone` (the ids of ended ones), `held` (the live
  -- units) and `added` (slots this call takes, none yet); or nil and why
  -- the key cannot be read.
  function S.load(key, now)
    local flat = redis.pcall('HGETALL', key)
    if flat.err then return nil, flat.err end
    local live, gone, held = {}, {}, 0
    for i = 1, #flat, 2 do
      local units, granted, ends = string.match(flat[i + 1], '^(%d+):(%d+):(%d+)$')
      if not units then return nil, 'not concurrency slots' end
      units, ends = tonumber(units), tonumber(ends)
      if ends > now then
        live[#live + 1] = { flat[i], units, ends, granted }
        held = held + units
      else
        gone[#gone + 1] = flat[i]
      end
    end
    return { live = live, gone = gone, held = held, base = held, added = {} }
  end

  -- The slots as they were loaded, before this call added any: what a
  -- refused all-or-nothing batch reports.
  function S.as_loaded(st)
    return { live = st.live, gone = st.gone, held = st.base, base = st.base, added = {} }
  end

  -- The last end of the slots, the added ones included; 0 when none.
  function S.last_end(st)
    local last = 0
    for _, list in ipairs({ st.live, st.added }) do
      for _, s in ipairs(list) do
        if s[3] > last then last = s[3] end
      end
    end
    return last
  end

  -- Whether a slot with `id` is held (loaded live, or added by this call).
  function S.holds(st, id)
    for _, list in ipairs({ st.live, st.added }) do
      for _, s in ipairs(list) do
        if s[1] == id then return true end
      end
    end
    return false
  end

  -- The earliest end after which `cost` fits if no slot is released or
  -- renewed: soonest ends first.
  function S.retry(st, limit, cost, now)
    local ends = {}
    for _, list in ipairs({ st.live, st.added }) do
      for _, s in ipairs(list) do ends[#ends + 1] = s end
    end
    table.sort(ends, function(a, b) return a[3] < b[3] end)
    local left = st.held
    for _, s in ipairs(ends) do
      left = left - s[2]
      if left <= limit - cost then return s[3] - now end
    end
    return 0
  end

  -- What an acquire of `cost` units answers on `st`, changing nothing:
  -- admitted, remaining, retry_after_ms, reset_after_ms. When admitted,
  -- remaining and the reset count the new slot, ending at now + slot_ttl,
  -- if `taking`; a Peek (not taking) answers what is free now and when the
  -- held slots end.
  function S.decide(st, limit, slot_ttl, cost, now, taking)
    local last = S.last_end(st)
    if st.held <= limit - cost then
      if not taking then
        local reset = 0
        if last > now then reset = last - now end
        return true, limit - st.held, 0, reset
      end
      local ends = now + slot_ttl
      if last > ends then ends = last end
      return true, limit - st.held - cost, 0, ends - now
    end
    local remaining = limit - st.held
    if remaining < 0 then remaining = 0 end
    local reset = 0
    if last > now then reset = last - now end
    return false, remaining, S.retry(st, limit, cost, now), reset
  end

  -- Adds the slot `id` of `cost` units, ending at now + slot_ttl; written
  -- by S.store. Returns its end.
  function S.take(st, id, cost, slot_ttl, now)
    local ends = now + slot_ttl
    st.added[#st.added + 1] = { id, cost, ends, now }
    st.held = st.held + cost
    return ends
  end

  -- Writes what changed of `st` under `key`: drops the ended slots, adds
  -- the taken ones, and keeps the key a minute past its last slot's end
  -- (so that a call in that minute finds ended slots and counts them as
  -- expired unreleased), or drops it when none is left. `changed`: live
  -- slots were renewed or released (and written) by the caller. Returns
  -- how many ended slots were dropped.
  function S.store(key, st, now, ttl_slack, changed)
    -- In chunks: Lua 5.1's unpack refuses more than about 8,000 values,
    -- and a key of up to 10,000 slots can see them all end between two
    -- calls; an error here would come after the batch's other writes.
    for j = 1, #st.gone, 1000 do
      redis.call('HDEL', key, unpack(st.gone, j, math.min(j + 999, #st.gone)))
    end
    for _, s in ipairs(st.added) do
      redis.call('HSET', key, s[1], string.format('%d:%d:%d', s[2], s[4], s[3]))
    end
    if changed or #st.gone > 0 or #st.added > 0 then
      local last = S.last_end(st)
      if last > now then
        redis.call('PEXPIRE', key, last - now + ttl_slack + 60000)
      else
        redis.call('UNLINK', key)
      end
    end
    return #st.gone
  end

  return S
end

