// Drives the Firepool MCP server with the official TypeScript SDK client, the way Claude Desktop, Cursor and
// the MCP Inspector do, and prints what it saw as one JSON object on stdout (tests/integration/test_mcp_typescript.py
// asserts on it). It records observations rather than judging them, except where the SDK itself refuses
// (a schema it cannot compile, structured content that does not match a tool's outputSchema): those throw.
//
//   node drive.mjs '{"transport": "stdio", "command": "/venv/bin/firepool", "args": ["mcp"], "env": {...}}'
//   node drive.mjs '{"transport": "http", "url": "http://127.0.0.1:8322/mcp", "token": "..."}'
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import { Ajv2020 } from 'ajv/dist/2020.js';

const config = JSON.parse(process.argv[2]);
const report = { transport: config.transport, http: [], conversations: {} };

// Every HTTP exchange the transport makes: method, status, content type and the MCP headers both ways.
function tappedFetch(log) {
  return async (url, init = {}) => {
    const headers = new Headers(init.headers);
    const response = await fetch(url, init);
    let rpc = null;
    if (typeof init.body === 'string') {
      const body = JSON.parse(init.body);
      rpc = body.method ?? (body.result !== undefined ? 'result' : null);
    }
    log.push({
      method: init.method ?? 'GET', rpc, status: response.status,
      content_type: response.headers.get('content-type'),
      sent_session_id: headers.get('mcp-session-id'),
      sent_protocol_version: headers.get('mcp-protocol-version'),
      got_session_id: response.headers.get('mcp-session-id'),
    });
    return response;
  };
}

// Every JSON-RPC message the client receives (the SDK overwrites transport.onmessage when it connects).
function tapMessages(transport, log) {
  let inner;
  Object.defineProperty(transport, 'onmessage', {
    configurable: true,
    get: () => inner,
    set: (fn) => { inner = fn && ((message, extra) => { log.push(message); fn(message, extra); }); },
  });
}

function makeTransport() {
  if (config.transport === 'stdio') {
    // As a user's MCP config launches it: command, args and env only (the SDK adds HOME, PATH, ...).
    return new StdioClientTransport({ command: config.command, args: config.args, env: config.env, stderr: 'pipe' });
  }
  return new StreamableHTTPClientTransport(new URL(config.url), {
    requestInit: { headers: { Authorization: `Bearer ${config.token}` } },
    fetch: tappedFetch(report.http),
  });
}

async function connect(name) {
  const transport = makeTransport();
  const received = [];
  tapMessages(transport, received);
  const client = new Client({ name: `firepool-ts-test-${name}`, version: '1.0.0' });
  await client.connect(transport);
  const init = received.find((m) => m.result?.protocolVersion);
  return { client, transport, received, init: init?.result };
}

function text(result) {
  return (result.content ?? []).filter((b) => b.type === 'text').map((b) => b.text).join('\n');
}

// A tool call as the model would see it: the result, or the JSON-RPC error the SDK raised.
async function attempt(client, name, args, options) {
  try {
    const result = await client.callTool({ name, arguments: args }, undefined, options);
    return { is_error: result.isError === true, text: text(result), structured: result.structuredContent ?? null,
             content_types: (result.content ?? []).map((b) => b.type) };
  } catch (error) {
    if (error instanceof McpError) return { rpc_error: { code: error.code, message: error.message } };
    throw error;
  }
}

async function run(client, args, options) {
  const res = await attempt(client, 'run_in_sandbox', args, options);
  if (res.rpc_error || res.is_error) throw new Error(`run_in_sandbox ${JSON.stringify(args)}: ${JSON.stringify(res)}`);
  return res.structured;
}

// Each tool's schemas, checked against the JSON Schema 2020-12 meta-schema (what the spec says they are) and
// compiled; the SDK compiles outputSchema itself in listTools (draft-07 Ajv) and would have thrown already.
function schemaProblems(tools) {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  const problems = {};
  for (const tool of tools) {
    for (const key of ['inputSchema', 'outputSchema']) {
      const schema = tool[key];
      if (schema === undefined) continue;
      const where = `${tool.name}.${key}`;
      if (schema.type !== 'object') problems[where] = `type is ${JSON.stringify(schema.type)}, not "object"`;
      else if (!ajv.validateSchema(schema)) problems[where] = ajv.errorsText(ajv.errors);
      else {
        try { ajv.compile(schema); } catch (error) { problems[where] = String(error.message ?? error); }
      }
    }
  }
  return problems;
}

async function main() {
  const a = await connect('a');
  const { client } = a;
  report.initialize = {
    protocol_version: a.init?.protocolVersion ?? null,
    transport_protocol_version: a.transport.protocolVersion ?? null,
    server_info: client.getServerVersion() ?? null,
    capabilities: client.getServerCapabilities() ?? null,
    has_instructions: typeof client.getInstructions() === 'string' && client.getInstructions().length > 0,
    session_id: a.transport.sessionId ?? null,
  };

  const { tools } = await client.listTools();
  report.tools = Object.fromEntries(tools.map((t) => [t.name, {
    title: t.title ?? null, annotations: t.annotations ?? null, has_output_schema: t.outputSchema !== undefined,
    required: t.inputSchema.required ?? [], description_chars: (t.description ?? '').length,
  }]));
  report.schema_problems = schemaProblems(tools);

  // One conversation, two calls, no `session` argument: what a client that never heard of Firepool sends.
  const first = await run(client, { command: 'echo kept > note.txt; echo one' });
  const second = await run(client, { command: 'cat note.txt' });
  report.conversations.a = { first, second };

  // Python state across calls (the live kernel), in a named session of the same conversation.
  const py1 = await attempt(client, 'python_exec', { code: 'x = 41', session: 'ts-py' });
  const py2 = await attempt(client, 'python_exec', { code: 'x + 1', session: 'ts-py' });
  report.python = { first: py1, second: py2 };

  // A second conversation (a second connection) gets a different sandbox.
  const b = await connect('b');
  const other = await run(b.client, { command: 'cat note.txt 2>/dev/null || echo absent' });
  report.conversations.b = { first: other, session_id: b.transport.sessionId ?? null };

  // Bad input: the spec wants argument problems as tool results with isError (the model can read and retry)
  // and an unknown tool as a JSON-RPC error.
  report.errors = {
    negative_timeout: await attempt(client, 'run_in_sandbox', { command: 'true', timeout_s: -1 }),
    missing_command: await attempt(client, 'run_in_sandbox', {}),
    wrong_type: await attempt(client, 'run_in_sandbox', { command: 42 }),
    unknown_argument: await attempt(client, 'run_in_sandbox', { command: 'true', bogus: 1 }),
    bad_session: await attempt(client, 'run_in_sandbox', { command: 'true', session: 'no spaces!' }),
    missing_file: await attempt(client, 'read_file', { path: 'missing.txt', session: 'ts-errors' }),
    unknown_tool: await attempt(client, 'no_such_tool', {}),
  };
  report.after_errors = await run(client, { command: 'echo alive' });

  // Progress notifications while a call runs (the server sends them about every 2 s).
  const progress = [];
  const slow = await run(client, { command: 'echo step-one; sleep 5; echo done', session: 'ts-progress' },
                         { onprogress: (p) => progress.push(p), resetTimeoutOnProgress: true });
  report.progress = { result: slow, notifications: progress };

  // The user presses stop: the SDK sends notifications/cancelled and rejects the call; the job must end.
  const abort = new AbortController();
  const began = Date.now();
  const session = `ts-cancel-${process.pid}`;
  const cancelled = client.callTool({ name: 'run_in_sandbox', arguments: { command: 'sleep 33', session } },
                                    undefined, { signal: abort.signal });
  setTimeout(() => abort.abort('the user pressed stop'), 3000);
  const outcome = await cancelled.then(() => 'completed', (error) => `rejected: ${error?.name ?? error}`);
  const check = await run(client, { session,
    command: "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 33' || true" });
  report.cancel = { session, outcome, ms: Date.now() - began, sleepers_left: check.stdout_tail.trim(), after: check };

  // Every other tool once: the SDK checks each structured result against the tool's outputSchema.
  const dot = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
  const t = { session: 'ts-tools' };
  report.tool_calls = {
    write_files: await attempt(client, 'write_files', { ...t, files: [{ path: 'src/a.txt', text: 'hello\n' },
                                                                       { path: 'dot.png', base64: dot }] }),
    read_text: await attempt(client, 'read_file', { ...t, path: 'src/a.txt' }),
    read_image: await attempt(client, 'read_file', { ...t, path: 'dot.png' }),
    list_files: await attempt(client, 'list_files', { ...t }),
    outputs: await attempt(client, 'run_in_sandbox', { ...t, command: 'cp dot.png outputs/; echo x,y > outputs/t.csv' }),
    install_packages: await attempt(client, 'install_packages', { ...t, packages: ['pip'] }),
    sandbox_info: await attempt(client, 'sandbox_info', { ...t }),
  };
  const bg = await attempt(client, 'run_in_sandbox', { ...t, command: 'sleep 30', background: true });
  report.tool_calls.background = bg;
  report.tool_calls.job_status = await attempt(client, 'job_status', { job_id: bg.structured.job_id });
  report.tool_calls.job_cancel = await attempt(client, 'job_cancel', { job_id: bg.structured.job_id });
  report.tool_calls.end_session = await attempt(client, 'end_session', { ...t });

  // Resources and prompts, as far as the server declares them.
  const caps = client.getServerCapabilities() ?? {};
  report.resources = null;
  if (caps.resources) {
    const listed = await client.listResources();
    const templates = await client.listResourceTemplates();
    const log = await client.readResource({ uri: first.log_uri ?? second.log_uri });
    const made = await run(client, { command: 'echo a,b > outputs/table.csv', session: 'ts-files' });
    const file = await client.readResource({ uri: made.artifacts[0].uri });
    report.resources = {
      listed: listed.resources.map((r) => r.uri),
      templates: templates.resourceTemplates.map((t) => t.uriTemplate),
      log: log.contents.map((c) => ({ uri: c.uri, mime_type: c.mimeType ?? null, text: c.text ?? null })),
      file: file.contents.map((c) => ({ uri: c.uri, mime_type: c.mimeType ?? null,
                                        bytes: c.blob !== undefined ? Buffer.from(c.blob, 'base64').toString() : null,
                                        text: c.text ?? null })),
    };
  }
  report.prompts = caps.prompts ? (await client.listPrompts()).prompts.map((p) => p.name) : null;

  report.notifications = [...a.received, ...b.received]
    .filter((m) => m.method !== undefined).map((m) => m.method);

  report.close = {};
  for (const [name, conn] of [['a', a], ['b', b]]) {
    report.close[name] = await close(conn);
  }
  if (config.transport === 'http') {
    // The old session id after DELETE: the spec says the server answers 404 (the client then re-initializes).
    const stale = await fetch(config.url, {
      method: 'POST',
      headers: { Authorization: `Bearer ${config.token}`, 'Content-Type': 'application/json',
                 Accept: 'application/json, text/event-stream', 'mcp-session-id': report.initialize.session_id,
                 'mcp-protocol-version': report.initialize.protocol_version },
      body: JSON.stringify({ jsonrpc: '2.0', id: 99, method: 'tools/list' }),
    });
    report.stale_session_status = stale.status;
  }
}

async function close({ client, transport }) {
  if (config.transport === 'http') {
    const began = Date.now();
    await transport.terminateSession();  // HTTP DELETE with Mcp-Session-Id
    await client.close();
    return { ms: Date.now() - began };
  }
  // stdio: the SDK ends the server's stdin, then SIGTERM after 2 s, then SIGKILL: a clean server exits on EOF.
  const child = transport._process;
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  const began = Date.now();
  await client.close();
  const how = await exited;
  return { ms: Date.now() - began, exit_code: how.code, signal: how.signal };
}

try {
  await main();
  report.ok = true;
} catch (error) {
  report.ok = false;
  report.error = String(error?.stack ?? error);
}
process.stdout.write(JSON.stringify(report) + '\n');
process.exit(0);
