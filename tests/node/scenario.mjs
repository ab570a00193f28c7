// One conversation with lnk-link-run serve through a TypeScript SDK client,
// shared by v1.mjs and v2.mjs. It prints one JSON report on stdout for
// tests/test_sdk_node.py to judge; it judges nothing itself, so a surprise is
// reported, not hidden.
//
// The report holds what the client saw (results, errors, progress) and the
// wire: every message the client sent and received on the server's pipes, in
// order, taken where the transport hands them over.

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

// Usage: node v1.mjs|v2.mjs <mode> <files folder> -- <server argv...>
export function parseArgs(argv) {
    const dash = argv.indexOf("--");
    if (dash < 2 || dash === argv.length - 1) {
        throw new Error("usage: node v1.mjs|v2.mjs <mode> <files folder> -- <server command...>");
    }
    const [mode, files] = argv.slice(0, dash);
    const [command, ...args] = argv.slice(dash + 1);
    return { mode, files, command, args };
}

// Records both directions of the transport: `send` is wrapped, and the
// `onmessage` the client installs is wrapped as it is installed, so the
// handshake's messages are caught too.
export function tap(transport) {
    const wire = [];
    const send = transport.send.bind(transport);
    transport.send = (message, options) => {
        wire.push({ dir: "out", message });
        return send(message, options);
    };
    let handler;
    Object.defineProperty(transport, "onmessage", {
        configurable: true,
        get: () => handler,
        set: (fn) => {
            handler = fn && ((message, extra) => {
                wire.push({ dir: "in", message });
                return fn(message, extra);
            });
        },
    });
    return wire;
}

function describeError(error) {
    return {
        name: error?.constructor?.name ?? typeof error,
        code: error?.code ?? null,
        message: String(error?.message ?? error),
    };
}

function textOf(result) {
    return (result.content ?? []).filter((b) => b.type === "text").map((b) => b.text).join("");
}

function shownResult(result) {
    return {
        isError: result.isError ?? false,
        hasIsErrorKey: "isError" in result,
        structuredContent: result.structuredContent ?? null,
        text: textOf(result),
        keys: Object.keys(result).sort(),
    };
}

async function waitFor(what, condition, timeoutMs = 10_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
        const value = condition();
        if (value) return value;
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await new Promise((resolve) => setTimeout(resolve, 10));
    }
}

function alive(pid) {
    try {
        process.kill(pid, 0);
    } catch {
        return false;
    }
    try {  // a zombie counts as gone
        const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
        return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] !== "Z";
    } catch {
        return false;
    }
}

// `sdk` adapts the two client generations: callTool(client, params, {signal, onprogress}).
export async function converse({ sdk, label, client, transport, files, negotiated }) {
    const report = { sdk: label, errors: [], steps: [] };
    const wire = tap(transport);
    report.wire = wire;
    let stderr = "";
    transport.stderr?.on("data", (chunk) => { stderr += chunk; });
    client.onerror = (error) => report.errors.push(String(error?.message ?? error));
    const started = Date.now();
    const meta = { "link.local/thread": `thread-${label}`, "link.local/hops": 1 };

    const step = async (name, body) => {
        try {
            report[name] = await body();
        } catch (error) {
            report[name] = { thrown: describeError(error) };
        }
        report.steps.push(name);
    };

    try {
        await client.connect(transport);
        report.connectMs = Date.now() - started;
        report.negotiated = negotiated(client) ?? null;
        report.serverVersion = client.getServerVersion() ?? null;
        report.instructions = client.getInstructions?.() ?? null;
        report.serverPid = transport.pid ?? null;
        const proc = transport._process;

        await step("tools", async () => {
            const { tools } = await client.listTools();
            return tools.map((t) => ({
                name: t.name, title: t.title ?? null, hasOutputSchema: Boolean(t.outputSchema),
                outputSchemaType: t.outputSchema?.type ?? null, annotations: t.annotations ?? null,
                inputSchema: t.inputSchema,
            }));
        });

        await step("call", async () => shownResult(await sdk.callTool(client, {
            name: "command", arguments: { program: "echo", args: ["hello", "from", label] }, _meta: meta,
        })));

        await step("refusal", async () => shownResult(await sdk.callTool(client, {
            name: "command", arguments: { program: "not-allowed-here", args: [] }, _meta: meta,
        })));

        await step("badArguments", async () => shownResult(await sdk.callTool(client, {
            name: "command", arguments: { program: "echo", args: "not an array" },
        })));

        await step("unknownTool", async () => {
            const result = await sdk.callTool(client, { name: "no_such_tool", arguments: {} });
            return { returned: shownResult(result) };
        });

        await step("progress", async () => {
            const events = [];
            const result = await sdk.callTool(client, {
                name: "command",
                arguments: { program: "sh", args: ["-c", "for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done"] },
            }, { onprogress: (p) => events.push(p) });
            return { events, result: shownResult(result) };
        });

        await step("cancel", async () => {
            const pidFile = join(files, "work", `cancel-${label}.pid`);
            const controller = new AbortController();
            const call = sdk.callTool(client, {
                name: "command",
                arguments: {
                    program: "sh", folder: "work",
                    args: ["-c", `sleep 30 & echo $$ $! > cancel-${label}.pid.tmp; mv cancel-${label}.pid.tmp cancel-${label}.pid; wait`],
                },
            }, { signal: controller.signal });
            const outcome = call.then((r) => ({ answered: shownResult(r) }), (e) => ({ rejected: describeError(e) }));
            const pids = await waitFor("the pid file", () => existsSync(pidFile) && readFileSync(pidFile, "utf8").trim())
                .then((text) => text.split(/\s+/).map(Number));
            const abortedAt = Date.now();
            controller.abort("user pressed stop");
            const settled = await outcome;
            await waitFor("the cancelled group to die", () => pids.every((pid) => !alive(pid)));
            return { ...settled, pids, goneMs: Date.now() - abortedAt };
        });

        await step("afterCancel", async () => shownResult(await sdk.callTool(client, {
            name: "command", arguments: { program: "echo", args: ["still", "here"] },
        })));

        const closing = Date.now();
        await client.close();
        report.closeMs = Date.now() - closing;
        report.serverExit = proc ? { code: proc.exitCode, signal: proc.signalCode } : null;
    } catch (error) {
        report.fatal = describeError(error);
        try { await client.close(); } catch { /* already gone */ }
    }
    report.stderr = stderr;
    report.elapsedMs = Date.now() - started;
    return report;
}

export function print(report) {
    process.stdout.write(JSON.stringify(report) + "\n");
}
