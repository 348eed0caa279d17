// A 2025-era MCP server on the TypeScript SDK 1.x (@modelcontextprotocol/sdk, the npm `latest`,
// which the reference servers are built on), over Streamable HTTP: the bridge tests
// (tests/era2025) run it behind taskgate. Stateful by default (a session per initialize, kept
// by id, as the SDK's own examples keep them); --stateless answers each POST on its own.
//
//   node server.mjs [--port N] [--name NAME] [--stateless] [--resumable] [--marks-file F]
//
// --resumable keeps each session's events (the SDK's example event store) and answers a GET
// with Last-Event-ID by replaying them: its `poll_me` tool then moves its call to polling (the
// call's stream closed before the answer, which the client gets by resuming).
//
// It prints `READY <url>` once it listens. Its `wait` tool notes "started <mark>" and
// "cancelled <mark>" in --marks-file.

import http from "node:http";
import { randomUUID } from "node:crypto";
import { appendFileSync } from "node:fs";
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import {
  isInitializeRequest,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { InMemoryTaskMessageQueue, InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks";
import { InMemoryEventStore } from "@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js";
import { z } from "zod";

function option(flag, fallback) {
  const at = process.argv.indexOf(flag);
  return at >= 0 ? process.argv[at + 1] : fallback;
}

const name = option("--name", "ts-sdk1");
const port = Number(option("--port", "0"));
const stateless = process.argv.includes("--stateless");
const resumable = process.argv.includes("--resumable");
const marksFile = option("--marks-file", "/dev/null");

// One task store for the process (a stateless server builds a server per request): each task
// belongs to the session that created it, as the SDK keeps them.
const taskStore = new InMemoryTaskStore();
// Where a task's requests to the client wait for its tasks/result stream (the side channel).
const taskMessageQueue = new InMemoryTaskMessageQueue();

function build() {
  const server = new McpServer(
    { name, version: "1.0.0" },
    {
      capabilities: {
        logging: {},
        resources: { subscribe: true },
        tasks: { requests: { tools: { call: {} } }, cancel: {}, list: {} },
      },
      taskStore,
      taskMessageQueue,
    },
  );
  const text = (value) => ({ content: [{ type: "text", text: String(value) }] });
  // Tasks the SDK's experimental way: `report` may run as a task, `report_required` must.
  // Each works `seconds`, then stores its result (`isError: true` when `fail`), unless the
  // task was cancelled meanwhile.
  const reporting = {
    async createTask({ seconds, fail }, { taskStore: tasks, taskRequestedTtl }) {
      const task = await tasks.createTask({ ttl: taskRequestedTtl, pollInterval: 100 });
      setTimeout(async () => {
        const now = await tasks.getTask(task.taskId);
        if (now.status !== "working") return;
        const result = fail
          ? { content: [{ type: "text", text: "report failed" }], isError: true }
          : text(`report of ${seconds}s by ${name}`);
        await tasks.storeTaskResult(task.taskId, fail ? "failed" : "completed", result);
      }, seconds * 1000);
      return { task };
    },
    async getTask(_args, { taskId, taskStore: tasks }) {
      return await tasks.getTask(taskId);
    },
    async getTaskResult(_args, { taskId, taskStore: tasks }) {
      return await tasks.getTaskResult(taskId);
    },
  };
  // `approval`: a task that asks its client `questions` yes/no questions in turn (through the
  // side channel: the SDK queues each for the task's tasks/result), each while the task says
  // input_required, and reports the answers.
  server.experimental.tasks.registerToolTask(
    "approval",
    { description: "Ask, as a task.", inputSchema: { questions: z.number() } },
    {
      async createTask({ questions }, { taskStore: tasks, taskRequestedTtl }) {
        const task = await tasks.createTask({ ttl: taskRequestedTtl, pollInterval: 100 });
        (async () => {
          const answers = [];
          for (let n = 1; n <= questions; n++) {
            await tasks.updateTaskStatus(task.taskId, "input_required");
            const answer = await server.server.elicitInput(
              {
                message: `approve step ${n}?`,
                requestedSchema: { type: "object", properties: { ok: { type: "boolean" } } },
              },
              { relatedTask: { taskId: task.taskId } },
            );
            answers.push(answer.action === "accept" && answer.content?.ok ? "yes" : "no");
            await tasks.updateTaskStatus(task.taskId, "working");
          }
          await tasks.storeTaskResult(task.taskId, "completed", text(answers.join(",")));
        })().catch((error) => appendFileSync(marksFile, `approval failed ${error}\n`));
        return { task };
      },
      async getTask(_args, { taskId, taskStore: tasks }) {
        return await tasks.getTask(taskId);
      },
      async getTaskResult(_args, { taskId, taskStore: tasks }) {
        return await tasks.getTaskResult(taskId);
      },
    },
  );
  const reportInput = { seconds: z.number(), fail: z.boolean().optional() };
  server.experimental.tasks.registerToolTask(
    "report",
    { description: "A report, as a task.", inputSchema: reportInput, execution: { taskSupport: "optional" } },
    reporting,
  );
  server.experimental.tasks.registerToolTask(
    "report_required",
    { description: "A report that runs only as a task.", inputSchema: reportInput },
    reporting,
  );
  server.registerTool(
    "add",
    { description: "Add two integers.", inputSchema: { a: z.number(), b: z.number() } },
    async ({ a, b }) => text(a + b),
  );
  // Resource subscriptions, per session (a server per session): `touch` says the resource was
  // updated, on the session's own stream, when the client subscribed to it.
  const subscribed = new Set();
  server.server.setRequestHandler(SubscribeRequestSchema, async (request) => {
    subscribed.add(request.params.uri);
    return {};
  });
  server.server.setRequestHandler(UnsubscribeRequestSchema, async (request) => {
    subscribed.delete(request.params.uri);
    return {};
  });
  server.registerTool(
    "touch",
    { description: "Update a resource.", inputSchema: { uri: z.string() } },
    async ({ uri }) => {
      if (subscribed.has(uri)) await server.server.sendResourceUpdated({ uri });
      return text(subscribed.has(uri) ? "told" : "nobody listens");
    },
  );
  // `shout`: a debug message and an error one on the session's own stream, which the SDK sends
  // only at or above the level the client set (logging/setLevel).
  server.registerTool("shout", { description: "Log twice." }, async (extra) => {
    for (const [level, data] of [["debug", "whisper"], ["error", "shout"]]) {
      await server.server.sendLoggingMessage({ level, logger: "test", data }, extra.sessionId);
    }
    return text("shouted");
  });
  server.registerTool("poll_me", { description: "Answer after closing the call's stream." }, async (extra) => {
    extra.closeSSEStream?.(); // only where the session keeps its events (--resumable)
    await new Promise((resolve) => setTimeout(resolve, 100));
    return text("polled");
  });
  server.registerTool("whoami", { description: "Which replica answered." }, async () =>
    text(name),
  );
  server.registerTool(
    "session_marker",
    { description: "A mark of the session the call came in." },
    async (extra) => text(`${name}:${extra.sessionId ?? "none"}`),
  );
  server.registerTool(
    "count",
    { description: "Count, reporting progress at each step.", inputSchema: { to: z.number() } },
    async ({ to }, extra) => {
      const token = extra._meta?.progressToken;
      for (let step = 1; step <= to; step++) {
        if (token !== undefined) {
          await extra.sendNotification({
            method: "notifications/progress",
            params: { progressToken: token, progress: step, total: to, message: `step ${step}` },
          });
        }
      }
      return text(`counted to ${to}`);
    },
  );
  server.registerTool(
    "wait",
    {
      description: "Wait, noting the start and a cancellation in --marks-file.",
      inputSchema: { seconds: z.number(), mark: z.string() },
    },
    async ({ seconds, mark }, extra) => {
      appendFileSync(marksFile, `started ${mark}\n`);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, seconds * 1000);
        extra.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          appendFileSync(marksFile, `cancelled ${mark}\n`);
          resolve();
        });
      });
      return text("waited");
    },
  );
  server.registerTool(
    "confirm",
    { description: "Ask the client a yes/no question.", inputSchema: { question: z.string() } },
    async ({ question }, extra) => {
      try {
        // On the call's own stream (relatedRequestId); without it the SDK asks on the
        // session's GET stream.
        const answer = await server.server.elicitInput(
          {
            message: question,
            requestedSchema: { type: "object", properties: { ok: { type: "boolean" } } },
          },
          { relatedRequestId: extra.requestId },
        );
        return text(answer.action === "accept" ? (answer.content?.ok ? "yes" : "no") : answer.action);
      } catch (error) {
        return { content: [{ type: "text", text: `Error: ${error.message}` }], isError: true };
      }
    },
  );
  server.registerTool(
    "survey",
    {
      description:
        "Ask two questions in turn, reporting progress after the first answer; note " +
        "`cancelled survey` in --marks-file if cancelled while asking.",
    },
    async (extra) => {
      extra.signal.addEventListener("abort", () => appendFileSync(marksFile, "cancelled survey\n"));
      const token = extra._meta?.progressToken;
      const answers = [];
      for (const [step, question] of ["first?", "second?"].entries()) {
        const answer = await server.server.elicitInput(
          {
            message: question,
            requestedSchema: { type: "object", properties: { ok: { type: "boolean" } } },
          },
          { relatedRequestId: extra.requestId },
        );
        answers.push(answer.action === "accept" && answer.content?.ok ? "yes" : "no");
        if (token !== undefined) {
          await extra.sendNotification({
            method: "notifications/progress",
            params: { progressToken: token, progress: step + 1, total: 2, message: `answered ${question}` },
          });
        }
      }
      return text(answers.join(","));
    },
  );
  server.registerTool(
    "confirm_unrelated",
    {
      description: "Ask as the SDK's own examples ask: on the session's GET stream.",
      inputSchema: { question: z.string() },
    },
    async ({ question }) => {
      try {
        const answer = await server.server.elicitInput({
          message: question,
          requestedSchema: { type: "object", properties: { ok: { type: "boolean" } } },
        });
        return text(answer.action);
      } catch (error) {
        return { content: [{ type: "text", text: `Error: ${error.message}` }], isError: true };
      }
    },
  );
  server.registerPrompt(
    "greet",
    { description: "A greeting.", argsSchema: { who: z.string() } },
    ({ who }) => ({ messages: [{ role: "user", content: { type: "text", text: `Hello, ${who}!` } }] }),
  );
  server.registerResource(
    "readme",
    "note://readme",
    { mimeType: "text/plain" },
    async (uri) => ({ contents: [{ uri: uri.href, text: "a note" }] }),
  );
  server.registerResource(
    "note",
    new ResourceTemplate("note://by/{topic}", {
      list: undefined,
      complete: { topic: (value) => ["alpha", "albatross", "beta"].filter((c) => c.startsWith(value)) },
    }),
    {},
    async (uri, { topic }) => ({ contents: [{ uri: uri.href, text: `a note on ${topic}` }] }),
  );
  return server;
}

const transports = new Map(); // session id -> its transport (stateful)

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const raw = Buffer.concat(chunks).toString("utf8");
  return raw ? JSON.parse(raw) : undefined;
}

function refuse(res, status, message, code = -32000) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code, message }, id: null }));
}

async function handle(req, res) {
  const body = req.method === "POST" ? await readJson(req) : undefined;
  if (stateless) {
    if (req.method !== "POST") return refuse(res, 405, "Method not allowed.");
    const server = build();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on("close", () => {
      transport.close();
      server.close();
    });
    await server.connect(transport);
    return transport.handleRequest(req, res, body);
  }
  const sessionId = req.headers["mcp-session-id"];
  const known = sessionId ? transports.get(sessionId) : undefined;
  if (known) return known.handleRequest(req, res, body);
  if (sessionId) return refuse(res, 404, "Session not found", -32001);
  if (req.method !== "POST" || !isInitializeRequest(body)) {
    return refuse(res, 400, "Bad Request: No valid session ID provided");
  }
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    onsessioninitialized: (id) => transports.set(id, transport),
    ...(resumable ? { eventStore: new InMemoryEventStore(), retryInterval: 20 } : {}),
  });
  transport.onclose = () => {
    if (transport.sessionId) transports.delete(transport.sessionId);
  };
  await build().connect(transport);
  return transport.handleRequest(req, res, body);
}

const listener = http.createServer((req, res) => {
  handle(req, res).catch((error) => {
    if (!res.headersSent) refuse(res, 500, String(error));
  });
});
listener.listen(port, "127.0.0.1", () => {
  console.log(`READY http://127.0.0.1:${listener.address().port}/mcp`);
});
process.on("SIGTERM", () => listener.close(() => process.exit(0)));
