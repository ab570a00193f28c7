// A silent call longer than the client's timer, as opencode makes it: the TS
// SDK v1's request timeout, reset by each progress notification.
// Usage: node quiet.mjs <timeout ms> <seconds of silence> -- <server command...>
// Prints one JSON line: {"answered": text or null, "error": message or null, "progress": count, "ms": elapsed}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const argv = process.argv.slice(2);
const [timeout, seconds] = [Number(argv[0]), Number(argv[1])];
const [command, ...args] = argv.slice(argv.indexOf("--") + 1);
const client = new Client({ name: "linkrun-test-quiet", version: "0.0.0" });
await client.connect(new StdioClientTransport({ command, args, stderr: "pipe" }));
let progress = 0;
const started = Date.now();
const report = { answered: null, error: null, progress: 0, ms: 0 };
try {
    const result = await client.callTool(
        { name: "command", arguments: { program: "sleep", args: [String(seconds)] } }, undefined,
        { timeout, resetTimeoutOnProgress: true, onprogress: () => { progress += 1; } });
    report.answered = result.content[0].text;
} catch (error) {
    report.error = String(error.message);
}
report.progress = progress;
report.ms = Date.now() - started;
console.log(JSON.stringify(report));
await client.close();
