#!/usr/bin/env node
// The official MCP TypeScript SDK v2 client (@modelcontextprotocol/client, pinned in
// package.json), pinned to protocol revision 2026-07-28 and declaring elicitation, against
// taskgate in front of a 2025-era test server (tests/era2025/py_sdk1_server.py or
// tests/clients/ts1/server.mjs). tests/era2025/test_ts_sdk_v2.py runs it.
//
//   node bridge.mjs URL
//
// In order: connect (server/discover), tools/list, tools/call add {a: 2, b: 40}, then
// tools/call survey, whose server asks two questions in turn: the SDK's multi-round-trip driver
// answers each `input_required` through the elicitation handler below (ok: true for "first?",
// false for anything else) and retries with inputResponses and the requestState.
//
// Prints ONE JSON object on stdout: {discover, tools, add, survey, asked}. On any error: the
// error on stderr and exit status 1 (2 for a usage error).

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const PROTOCOL_VERSION = '2026-07-28';

async function main() {
    const [url, ...rest] = process.argv.slice(2);
    if (!url || rest.length) {
        process.stderr.write('usage: node bridge.mjs URL\n');
        process.exit(2);
    }
    const client = new Client(
        { name: 'taskgate-ts-bridge-check', version: '0.0.0' },
        { versionNegotiation: { mode: { pin: PROTOCOL_VERSION } }, capabilities: { elicitation: {} } }
    );
    const asked = [];
    client.setRequestHandler('elicitation/create', async request => {
        asked.push(request.params.message);
        return { action: 'accept', content: { ok: request.params.message === 'first?' } };
    });
    await client.connect(new StreamableHTTPClientTransport(new URL(url)));
    const out = { discover: client.getDiscoverResult() ?? null };
    try {
        out.tools = (await client.listTools()).tools.map(tool => tool.name).sort();
        out.add = await client.callTool({ name: 'add', arguments: { a: 2, b: 40 } });
        out.survey = await client.callTool({ name: 'survey', arguments: {} });
        out.asked = asked;
    } finally {
        await client.close();
    }
    process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().catch(error => {
    process.stderr.write(`${String(error?.stack ?? error)}\n`);
    process.exit(1);
});
