#!/usr/bin/env node
// A 2025-era MCP client: the official TypeScript SDK v1 (@modelcontextprotocol/sdk, the version
// pinned in package.json) over Streamable HTTP, against taskgate's legacy front door or the
// `report` demo backend direct (backends/report.py). tests/gateway/test_legacy_clients.py runs
// it; it is plain JavaScript, with no compile step.
//
//   node legacy_client.mjs URL TOKEN STEPS
//
// TOKEN is a bearer token, sent as `Authorization: Bearer TOKEN` on every request (through the
// transport's requestInit), or "-" for none. STEPS is a JSON array, run in order after connect
// (the `initialize` handshake), each one of
//   {"list": "tools" | "prompts" | "resources" | "resourceTemplates"}
//   {"call": NAME, "args": {...}}
// The client declares the elicitation capability (form mode) and accepts every elicitation with
// {value: "yes-from-ts"}.
//
// After the steps it ends the session (transport.terminateSession(): a DELETE with the
// Mcp-Session-Id) and closes, then prints ONE JSON line on stdout:
//   {"protocolVersion", "sessionId", "results": [...], "error": null | {...},
//    "deleteStatus", "elicitations": [...], "http": [...], "transportErrors": [...]}
// The line is printed only once the DELETE is done, so that a failed DELETE is in it too.
// Each result is {"step", "result", "wire"}: `result` as the SDK returned it (its schemas drop
// keys they do not know from list items), `wire` the JSON-RPC result as it arrived. `http` is
// every HTTP request the transport made (method, the headers it sent with Authorization
// redacted, the status). On any error the line has `error` set and the exit status is 1 (2 for
// a usage error, with no line).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const USAGE = 'usage: node legacy_client.mjs URL TOKEN|- STEPS_JSON';
const ELICIT_ANSWER = 'yes-from-ts';
const LISTS = {
    tools: client => client.listTools(),
    prompts: client => client.listPrompts(),
    resources: client => client.listResources(),
    resourceTemplates: client => client.listResourceTemplates()
};
const LIST_METHODS = {
    tools: 'tools/list',
    prompts: 'prompts/list',
    resources: 'resources/list',
    resourceTemplates: 'resources/templates/list'
};

function usage(message) {
    process.stderr.write(`${message}\n${USAGE}\n`);
    process.exit(2);
}

function parseArgs(argv) {
    if (argv.length !== 3) usage(`expected 3 arguments, got ${argv.length}`);
    const [url, token, stepsJson] = argv;
    let steps;
    try {
        steps = JSON.parse(stepsJson);
    } catch (error) {
        usage(`STEPS is not JSON: ${error.message}`);
    }
    if (!Array.isArray(steps)) usage('STEPS must be a JSON array');
    for (const step of steps) {
        const known = (typeof step?.list === 'string' && Object.hasOwn(LISTS, step.list)) || typeof step?.call === 'string';
        if (!known) usage(`unknown step ${JSON.stringify(step)}`);
    }
    return { url: new URL(url), token: token === '-' ? undefined : token, steps };
}

function errorFields(error) {
    const fields = { name: error?.constructor?.name ?? typeof error, message: String(error?.message ?? error) };
    if (error?.code !== undefined) fields.code = error.code;
    if (error?.data !== undefined) fields.data = error.data;
    return fields;
}

// How long the end of the run waits for the answers' heads (the status of the GET stream the
// transport opened in the background, of the POST answering an elicitation) before it records
// them as still pending (status null).
const HEADS_LIMIT_MS = 5000;

// Every HTTP exchange the transport makes, as it made it: how this client behaves on the wire
// (which headers, when it opens its GET stream, what it does on DELETE) is part of what the tests
// check. `heads` gets each exchange's promise of its answer's head.
function recordingFetch(http, heads) {
    return async (input, init = {}) => {
        const headers = Object.fromEntries(new Headers(init.headers ?? {}).entries());
        if (headers.authorization !== undefined) headers.authorization = 'Bearer <redacted>';
        const entry = { method: init.method ?? 'GET', headers, status: null };
        if (typeof init.body === 'string') {
            try {
                const body = JSON.parse(init.body);
                entry.jsonrpc = Array.isArray(body) ? body.map(summary) : summary(body);
            } catch {
                entry.jsonrpc = null;
            }
        }
        http.push(entry);
        const head = fetch(input, init).then(
            response => {
                entry.status = response.status;
                entry.contentType = response.headers.get('content-type');
                entry.sessionId = response.headers.get('mcp-session-id');
                return response;
            },
            error => {
                entry.error = String(error?.message ?? error);
                throw error;
            }
        );
        heads.push(head);
        return head;
    };
}

async function settle(promises, limitMs) {
    let timer;
    const limit = new Promise(resolve => {
        timer = setTimeout(resolve, limitMs);
    });
    await Promise.race([Promise.allSettled(promises), limit]);
    clearTimeout(timer);
}

function summary(message) {
    const out = {};
    if (message.method !== undefined) out.method = message.method;
    if (message.id !== undefined) out.id = message.id;
    if (message.result !== undefined) out.result = true;
    if (message.error !== undefined) out.error = message.error.code;
    return out;
}

async function runStep(client, step, wire) {
    if (step.list !== undefined) {
        const result = await LISTS[step.list](client);
        return { step, result, wire: wire.last(LIST_METHODS[step.list]) };
    }
    const result = await client.callTool({ name: step.call, arguments: step.args ?? {} });
    return { step, result, wire: wire.last('tools/call') };
}

// The JSON-RPC results as they arrived, before the SDK's result schemas, keyed by the method of
// the request they answer.
function wireLog(transport) {
    const methodsById = new Map();
    const lastByMethod = new Map();
    const send = transport.send.bind(transport);
    transport.send = (message, options) => {
        if (message.method !== undefined && message.id !== undefined) methodsById.set(message.id, message.method);
        return send(message, options);
    };
    return {
        // After client.connect(), which sets the transport's onmessage.
        attach() {
            const onmessage = transport.onmessage;
            transport.onmessage = (message, extra) => {
                if (message.result !== undefined && methodsById.has(message.id)) {
                    lastByMethod.set(methodsById.get(message.id), structuredClone(message.result));
                }
                onmessage?.(message, extra);
            };
        },
        last(method) {
            return lastByMethod.get(method) ?? null;
        }
    };
}

async function main() {
    const options = parseArgs(process.argv.slice(2));
    const http = [];
    const heads = [];
    const transportErrors = [];
    const elicitations = [];
    const transport = new StreamableHTTPClientTransport(options.url, {
        requestInit: options.token ? { headers: { Authorization: `Bearer ${options.token}` } } : undefined,
        fetch: recordingFetch(http, heads)
    });
    const client = new Client(
        { name: 'taskgate-legacy-client-check', version: '0.0.0' },
        { capabilities: { elicitation: { form: {} } } }
    );
    client.setRequestHandler(ElicitRequestSchema, async request => {
        elicitations.push(request.params);
        return { action: 'accept', content: { value: ELICIT_ANSWER } };
    });
    // Called for what the transport does in the background too (the GET stream it opens after
    // `notifications/initialized`, its reconnections): kept, not fatal, as the SDK treats them.
    client.onerror = error => transportErrors.push(errorFields(error));
    const wire = wireLog(transport);
    const out = {
        protocolVersion: null,
        sessionId: null,
        serverInfo: null,
        results: [],
        error: null,
        deleteStatus: null,
        elicitations,
        http,
        transportErrors
    };
    try {
        await client.connect(transport);
        wire.attach();
        out.protocolVersion = transport.protocolVersion ?? null;
        out.sessionId = transport.sessionId ?? null;
        out.serverInfo = client.getServerVersion() ?? null;
        for (const step of options.steps) {
            out.results.push(await runStep(client, step, wire));
        }
        await settle(heads, HEADS_LIMIT_MS);
        const before = http.length;
        await transport.terminateSession();
        out.deleteStatus = http.slice(before).find(entry => entry.method === 'DELETE')?.status ?? null;
    } catch (error) {
        out.error = errorFields(error);
    } finally {
        await client.close().catch(error => transportErrors.push(errorFields(error)));
    }
    process.stdout.write(`${JSON.stringify(out)}\n`);
    process.exitCode = out.error === null ? 0 : 1;
}

await main();
