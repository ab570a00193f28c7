// TS SDK v2 (@modelcontextprotocol/client) in one of its negotiation modes.
// Usage: node v2.mjs legacy|auto|2026-07-28 <files folder> -- <server command...>
// "auto" probes server/discover on a short-lived sibling server process first;
// a version pins the stateless era with no fallback.
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { converse, parseArgs, print } from "./scenario.mjs";

const { mode, files, command, args } = parseArgs(process.argv.slice(2));
const negotiation = mode === "legacy" || mode === "auto" ? { mode } : { mode: { pin: mode } };
const transport = new StdioClientTransport({ command, args, stderr: "pipe" });
const client = new Client({ name: "linkrun-test-v2", version: "0.0.0" }, { versionNegotiation: negotiation });
const sdk = {
    callTool: (c, params, { signal, onprogress } = {}) => c.callTool(params, { signal, onprogress, timeout: 30_000 }),
};
print(await converse({
    sdk, label: `v2-${mode}`, client, transport, files, negotiated: (c) => c.getNegotiatedProtocolVersion(),
}));
