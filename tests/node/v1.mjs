// TS SDK v1 (@modelcontextprotocol/sdk): always the legacy initialize handshake.
// Usage: node v1.mjs legacy <files folder> -- <server command...>
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { converse, parseArgs, print } from "./scenario.mjs";

const { mode, files, command, args } = parseArgs(process.argv.slice(2));
if (mode !== "legacy") throw new Error(`v1 speaks only the legacy handshake, not ${mode}`);
// No env: the SDK passes its default few variables, as it does for a user.
const transport = new StdioClientTransport({ command, args, stderr: "pipe" });
const client = new Client({ name: "linkrun-test-v1", version: "0.0.0" });
const sdk = {
    callTool: (c, params, { signal, onprogress } = {}) =>
        c.callTool(params, undefined, { signal, onprogress, timeout: 30_000 }),
};
// v1 keeps the negotiated version to itself: read it off the wire's initialize answer instead.
print(await converse({ sdk, label: "v1-legacy", client, transport, files, negotiated: () => null }));
