#!/usr/bin/env node
// The official MCP TypeScript SDK v2 client (@modelcontextprotocol/client, the version pinned in
// package.json), pinned to protocol revision 2026-07-28, against one MCP endpoint serving the
// `report` demo backend's surface (backends/report.py): taskgate, or the backend direct.
// tests/gateway/test_ts_client.py runs it; it is plain JavaScript, with no compile step.
//
//   node client.mjs URL [--token TOKEN] [--negotiation pin|auto|legacy] [--approve-task ID]
//                       [--cancel-task ID] [--try-generate-report]
//
// URL may also come from TASKGATE_URL, the bearer token from TASKGATE_TOKEN.
//
// --negotiation is the SDK's ClientOptions.versionNegotiation mode: `pin` (the default here),
// { pin: '2026-07-28' }: connect() probes with server/discover and fails unless that revision is
// offered; `auto`: the probe, falling back to the 2025 `initialize` handshake unless the answer
// is definitely modern; `legacy` (the SDK's own default): the 2025 `initialize` handshake only.
//
// In order: connect, tools/list, tools/call echo, prompts/list, prompts/get report_summarize,
// resources/list, resources/read reports://about, resources/templates/list, resources/read of
// two URIs of the template reports://{tenant}/reports/{id} (one plain ASCII, one that needs the
// =?base64?...?= header form), completion/complete of report_summarize's `tenant`; then
//   --approve-task ID      tasks/get ID (which must be input_required) and tasks/update ID
//                          accepting every input request it names with {approved: true};
//   --cancel-task ID       tasks/cancel ID;
//   --try-generate-report  tools/call generate_report, a task tool: the outcome is recorded
//                          (a result, or the SDK's error), not thrown.
// The Tasks extension's methods have no API in the SDK; they go through client.request with a
// pass-through result schema, which the SDK allows for tasks/* on a 2026-07-28 connection.
//
// Prints ONE JSON object on stdout: each result as the SDK returned it, under the names used
// below. On any other error: the error on stderr and exit status 1 (2 for a usage error).

import { Client, ProtocolError, SdkError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const PROTOCOL_VERSION = '2026-07-28';
const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';
const USAGE =
    'usage: node client.mjs URL [--token TOKEN] [--negotiation pin|auto|legacy] [--approve-task ID] ' +
    '[--cancel-task ID] [--try-generate-report]';
const NEGOTIATION = { pin: { pin: PROTOCOL_VERSION }, auto: 'auto', legacy: 'legacy' };

// A Standard Schema (https://standardschema.dev) that takes any result as it is: client.request
// needs one for methods the SDK has no result schema of its own for (the Tasks extension's).
const ANY_RESULT = {
    '~standard': { version: 1, vendor: 'taskgate-tests', validate: value => ({ value }) }
};
const APPROVE = { action: 'accept', content: { approved: true } };

function usage(message) {
    process.stderr.write(`${message}\n${USAGE}\n`);
    process.exit(2);
}

function parseArgs(argv) {
    const options = {
        url: process.env.TASKGATE_URL,
        token: process.env.TASKGATE_TOKEN,
        negotiation: 'pin',
        approveTask: undefined,
        cancelTask: undefined,
        tryGenerateReport: false
    };
    const valued = {
        '--token': 'token',
        '--negotiation': 'negotiation',
        '--approve-task': 'approveTask',
        '--cancel-task': 'cancelTask'
    };
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i];
        if (Object.hasOwn(valued, arg)) {
            const value = argv[++i];
            if (value === undefined) usage(`${arg} needs a value`);
            options[valued[arg]] = value;
        } else if (arg === '--try-generate-report') {
            options.tryGenerateReport = true;
        } else if (arg.startsWith('--') || options.urlFromArgs) {
            usage(`unexpected argument ${arg}`);
        } else {
            options.url = arg;
            options.urlFromArgs = true;
        }
    }
    if (!options.url) usage('no URL given (argument or TASKGATE_URL)');
    if (!Object.hasOwn(NEGOTIATION, options.negotiation)) usage(`unknown --negotiation ${options.negotiation}`);
    return options;
}

function errorFields(error) {
    const fields = { name: error?.constructor?.name ?? typeof error, message: String(error?.message ?? error) };
    if (error instanceof SdkError || error instanceof ProtocolError) {
        fields.code = error.code;
        if (error.data !== undefined) fields.data = error.data;
    }
    return fields;
}

async function run(client, options) {
    const out = {
        connected: {
            protocolEra: client.getProtocolEra(),
            protocolVersion: client.getNegotiatedProtocolVersion(),
            serverVersion: client.getServerVersion() ?? null,
            serverCapabilities: client.getServerCapabilities() ?? null,
            discover: client.getDiscoverResult() ?? null
        }
    };
    out.toolsList = await client.listTools();
    out.echo = await client.callTool({ name: 'echo', arguments: { text: 'via the ts sdk' } });
    out.promptsList = await client.listPrompts();
    out.prompt = await client.getPrompt({
        name: 'report_summarize',
        arguments: { tenant: 'acme', period: 'week' }
    });
    out.resourcesList = await client.listResources();
    out.resource = await client.readResource({ uri: 'reports://about' });
    out.templatesList = await client.listResourceTemplates();
    out.templated = await client.readResource({ uri: 'reports://acme/reports/42' });
    out.templatedUnicode = await client.readResource({ uri: 'reports://acme/reports/caf\u00e9' });
    out.completion = await client.complete({
        ref: { type: 'ref/prompt', name: 'report_summarize' },
        argument: { name: 'tenant', value: 'a' }
    });
    if (options.approveTask !== undefined) {
        const taskId = options.approveTask;
        out.taskGet = await client.request({ method: 'tasks/get', params: { taskId } }, ANY_RESULT);
        if (out.taskGet.status !== 'input_required') {
            throw new Error(`task ${taskId} is ${out.taskGet.status}, not input_required`);
        }
        const inputResponses = Object.fromEntries(Object.keys(out.taskGet.inputRequests ?? {}).map(key => [key, APPROVE]));
        out.taskUpdate = await client.request({ method: 'tasks/update', params: { taskId, inputResponses } }, ANY_RESULT);
    }
    if (options.cancelTask !== undefined) {
        const taskId = options.cancelTask;
        out.taskCancel = await client.request({ method: 'tasks/cancel', params: { taskId } }, ANY_RESULT);
    }
    if (options.tryGenerateReport) {
        try {
            out.generateReport = { result: await client.callTool({ name: 'generate_report', arguments: { size: 'small' } }) };
        } catch (error) {
            out.generateReport = { error: errorFields(error) };
        }
    }
    return out;
}

async function main() {
    const options = parseArgs(process.argv.slice(2));
    const transport = new StreamableHTTPClientTransport(new URL(options.url), {
        authProvider: options.token ? { token: async () => options.token } : undefined
    });
    const client = new Client(
        { name: 'taskgate-ts-client-check', version: '0.0.0' },
        {
            // The SDK's default is 'legacy': the 2025 initialize handshake, no 2026 headers.
            versionNegotiation: { mode: NEGOTIATION[options.negotiation] },
            // Sent in every request's _meta envelope; taskgate serves tasks/* only to a client
            // that declares the Tasks extension.
            capabilities: { extensions: { [TASKS_EXTENSION]: {} } }
        }
    );
    await client.connect(transport);
    let out;
    try {
        out = await run(client, options);
    } finally {
        await client.close();
    }
    process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().catch(error => {
    const lines = [String(error?.stack ?? error)];
    const fields = errorFields(error);
    if (fields.code !== undefined) lines.push(`code: ${JSON.stringify(fields.code)}`);
    if (fields.data !== undefined) lines.push(`data: ${JSON.stringify(fields.data)}`);
    if (error?.cause !== undefined) lines.push(`cause: ${String(error.cause?.stack ?? error.cause)}`);
    process.stderr.write(`${lines.join('\n')}\n`);
    process.exit(1);
});
