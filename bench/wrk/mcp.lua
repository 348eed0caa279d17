-- One MCP request POSTed again and again, every response checked (wrk 4.x; driven by
-- bench/load.py for bench/run.py, bench/auth_cost.py and bench/legacy.py). The request comes
-- from the environment, so that one script serves every method and era and no token shows in
-- wrk's argv:
--
--   BENCH_BODY     the JSON-RPC request body (required)
--   BENCH_METHOD   its method, sent as Mcp-Method (required unless BENCH_SESSION is set)
--   BENCH_NAME     sent as Mcp-Name: the tool's name, or the task's id (optional)
--   BENCH_EXPECT   text every good response body holds besides "result" (optional)
--   BENCH_TOKEN    sent as Authorization: Bearer ... (optional)
--   BENCH_SESSION  sent as Mcp-Session-Id: a 2025-era request on that session (optional).
--                  Then neither Mcp-Method nor Mcp-Name is sent: 2025-era clients send neither
--                  (the body, without params._meta, is the caller's to shape)
--   BENCH_VERSION  sent as MCP-Protocol-Version (optional; default 2026-07-28)
--
--   BENCH_BODY='{"jsonrpc":"2.0","id":1,"method":"tasks/get",...}' BENCH_METHOD=tasks/get \
--   BENCH_NAME=TASK_ID BENCH_EXPECT=TASK_ID \
--   wrk -t2 -c16 -d5s --latency -s bench/wrk/mcp.lua http://127.0.0.1:PORT/mcp
--
--   BENCH_BODY='{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}' \
--   BENCH_SESSION=SESSION_ID BENCH_VERSION=2025-11-25 BENCH_EXPECT=structuredContent \
--   wrk -t2 -c16 -d5s --latency -s bench/wrk/mcp.lua http://127.0.0.1:PORT/mcp
--
-- Good: HTTP 200 with a body holding "result" and BENCH_EXPECT; anything else is bad (wrk
-- itself only counts statuses >= 400, and taskgate answers some JSON-RPC errors with 200).
-- done() prints one line that bench/load.py parses:
--   taskgate-bench good=N bad=M

local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

local function required(name)
   local value = os.getenv(name)
   if value == nil or value == "" then
      error(name .. " is not set: see the head of bench/wrk/mcp.lua")
   end
   return value
end

-- Per thread (each has its own Lua state); wrk builds the one request from these after init.
function init(args)
   local name = os.getenv("BENCH_NAME") or ""
   local token = os.getenv("BENCH_TOKEN") or ""
   local session = os.getenv("BENCH_SESSION") or ""
   local version = os.getenv("BENCH_VERSION") or ""
   if version == "" then
      version = "2026-07-28"
   end
   expect = os.getenv("BENCH_EXPECT") or ""
   wrk.method = "POST"
   wrk.body = required("BENCH_BODY")
   wrk.headers["Content-Type"] = "application/json"
   wrk.headers["Accept"] = "application/json, text/event-stream"
   wrk.headers["MCP-Protocol-Version"] = version
   if session ~= "" then
      wrk.headers["Mcp-Session-Id"] = session
   else
      wrk.headers["Mcp-Method"] = required("BENCH_METHOD")
      if name ~= "" then
         wrk.headers["Mcp-Name"] = name
      end
   end
   if token ~= "" then
      wrk.headers["Authorization"] = "Bearer " .. token
   end
   good, bad = 0, 0
end

function response(status, headers, body)
   if status == 200 and body:find('"result"', 1, true) and body:find(expect, 1, true) then
      good = good + 1
   else
      bad = bad + 1
   end
end

function done(summary, latency, requests)
   local good_total, bad_total = 0, 0
   for _, thread in ipairs(threads) do
      good_total = good_total + thread:get("good")
      bad_total = bad_total + thread:get("bad")
   end
   io.write(string.format("taskgate-bench good=%d bad=%d\n", good_total, bad_total))
end
