-- wrk script: claim+settle pairs over the single-call routes, an
-- independent load generator for `settle serve` (issue 14 item 3).
--
--   wrk -t64 -c64 -d10s --latency -s bench/wrk-pairs.lua http://127.0.0.1:7411
--
-- Use as many threads as connections (-t = -c): each thread then drives
-- one connection, whose answers come back in the order of its requests,
-- so a claim's answer is matched to its key. Each connection claims a
-- fresh key; when the claim answers `execute`, its next request settles
-- that key under the returned fence. Latency is per request (claim or
-- settle); pairs/s is the settle count over the duration, printed at the end.

local counter = 0
local threads = {}

function setup(thread)
  thread:set("id", counter)
  table.insert(threads, thread)
  counter = counter + 1
end

local fp = string.rep("07", 32)
local binding = '{"principal":"wrk","scopes":["pay"],"generation":0}'
local outcome = '{"status":"completed","result":{"ok":true},"response_sha256":"' .. string.rep("65", 32) .. '"}'
local claim_body = '{"fingerprint":"' .. fp .. '","binding":' .. binding .. '}'
local headers = { ["Content-Type"] = "application/json" }

function init(args)
  n = 0
  run = tostring(os.time()) .. "-" .. tostring(math.random(1, 1000000000))
  queue = {}    -- settlements ready to send: {key, fence}
  last = nil    -- the request this thread's one connection sent last
  settled = 0
  failed = 0
end

function request()
  local s = table.remove(queue, 1)
  if s then
    last = { kind = "settle" }
    local body = '{"fence":' .. s.fence .. ',"fingerprint":"' .. fp .. '","binding":' .. binding .. ',"outcome":' .. outcome .. '}'
    return wrk.format("POST", "/v1/operations/" .. s.key .. "/settle", headers, body)
  end
  n = n + 1
  local key = "wrk-" .. run .. "-" .. id .. "-" .. n
  last = { kind = "claim", key = key }
  return wrk.format("POST", "/v1/operations/" .. key .. "/claim", headers, claim_body)
end

function response(status, hdrs, body)
  local r = last
  if status ~= 200 then
    failed = failed + 1
    return
  end
  local fence = body:match('"fence":(%d+)')
  if r and r.kind == "claim" and body:find('"decision":"execute"', 1, true) and fence then
    table.insert(queue, { key = r.key, fence = fence })
  elseif body:find('"receipt"', 1, true) then
    settled = settled + 1
  end
end

function done(summary, latency, requests)
  local total_settled, total_failed = 0, 0
  for _, t in ipairs(threads) do
    total_settled = total_settled + (t:get("settled") or 0)
    total_failed = total_failed + (t:get("failed") or 0)
  end
  local secs = summary.duration / 1e6
  io.write(string.format(
    '{"mode":"wrk","requests":%d,"pairs":%d,"pairs_per_s":%.1f,"failed":%d,"p50_ms":%.3f,"p99_ms":%.3f,"p999_ms":%.3f,"max_ms":%.3f}\n',
    summary.requests, total_settled, total_settled / secs, total_failed,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000, latency.max / 1000))
end
