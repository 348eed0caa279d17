-- tasks/get of one task, POSTed again and again (wrk 4.x; used by bench/auth_cost.py).
--
--   wrk -t2 -c16 -d10s --latency -s bench/wrk/tasks_get.lua http://127.0.0.1:PORT/mcp -- TASK_ID [TOKEN]
--
-- Every response is checked: HTTP 200 with a JSON-RPC result naming the task counts as good,
-- anything else as bad (wrk itself only counts HTTP statuses >= 400, and taskgate answers some
-- JSON-RPC errors with 200). done() prints one line the benchmark parses:
--   taskgate-bench good=N bad=M

local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

-- Per thread (each has its own Lua state); wrk builds the one request from these after init.
function init(args)
   task_id = args[1]
   local token = args[2]
   if task_id == nil or task_id == "" then
      error("usage: ... -- TASK_ID [TOKEN]")
   end
   wrk.method = "POST"
   wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"'
      .. task_id
      .. '","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
      .. '"io.modelcontextprotocol/clientCapabilities":'
      .. '{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}'
   wrk.headers["Content-Type"] = "application/json"
   wrk.headers["Accept"] = "application/json, text/event-stream"
   wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
   wrk.headers["Mcp-Method"] = "tasks/get"
   wrk.headers["Mcp-Name"] = task_id
   if token ~= nil and token ~= "" then
      wrk.headers["Authorization"] = "Bearer " .. token
   end
   good, bad = 0, 0
end

function response(status, headers, body)
   if status == 200 and body:find('"result"', 1, true) and body:find(task_id, 1, true) then
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
