// An MCP client configuration as docs/serve.md gives it, run by the official client over stdio.
//
//   node spec/npm/mcp_config_sdk.mjs '{ "mcpServers": { "mayura": { "command": ..., "args": [...] } } }'
//
// Starts the server the configuration names, lists its tools, writes a file and runs a command
// in its sandbox, and prints one JSON object with what it saw.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const config = JSON.parse(process.argv[2]);
const server = config.mcpServers.mayura;
const client = new Client({ name: 'readme', version: '1.0.0' });
await client.connect(new StdioClientTransport({ command: server.command, args: server.args, stderr: 'ignore' }));
const { tools } = await client.listTools();
await client.callTool({ name: 'workspace.write', arguments: { path: 'hello.txt', text: 'hello from the sandbox' } });
const r = await client.callTool({ name: 'workspace.exec', arguments: { command: 'cat hello.txt; echo; whoami' } });
await client.close();
process.stdout.write(JSON.stringify({ tools: tools.map((t) => t.name).sort(), stdout: r.structuredContent.stdout,
  is_error: r.isError }) + '\n');
