"""The MCP session: lifecycle, dispatch to threads, cancellation, progress.

Both eras of the protocol: the handshake (`initialize`, versions 2024-11-05
to 2025-11-25) and the stateless 2026-07-28, where every request carries its
version and capabilities in `_meta` and `server/discover` replaces the
handshake. The reader (the main thread) answers quick requests itself and
hands each `tools/call` to a worker thread (calls.py keeps the calls in flight).
"""

from __future__ import annotations

import gc
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import logger
from .. import __version__
from ..config import parse_serve
from .protocol import (
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR,
    UNSUPPORTED_VERSION, Channel, RequestId, error, is_id, lenient_loads, lone_surrogate_refused, result,
)
from .calls import Call, CallContext, InFlight, Workers, progress_token
from ..calls.setup import up_checks
from .checks import Checks
from .offer import Offer

if TYPE_CHECKING:  # the tool layer, loaded once the first answer is out (Session.tools)
    from .results import ToolResult
    from .tools import Tools

LEGACY_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS = ("2026-07-28",)
LATEST_LEGACY = LEGACY_VERSIONS[-1]
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SERVER_INFO = {"name": "lnk-link-run", "version": __version__}
# In-flight calls get this long to answer after stdin closes (clients wait 2 s).
EOF_GRACE = 1.5
# Calls killed at the end get this long to see it (their workers end at once).
KILLED_WAIT = 0.5
# At the end, queued answers go out while the client reads; once nothing moved this long, serve leaves.
FLUSH_IDLE = 1.0
KNOWN_METHODS = {"initialize", "ping", "tools/list", "tools/call", "server/discover", "subscriptions/listen"}
RESOURCE_METHODS = {"resources/list", "resources/templates/list", "resources/read"}  # with kept output alone


class Session:
    def __init__(self, instructions: str, load_tools: Callable[[], Tools], channel: Channel,
                 keeps_output: bool = False) -> None:
        self._load_tools = load_tools
        self.keeps_output = keeps_output  # resources offered: known from the settings, before the tool layer loads
        self._tools: Tools | None = None
        self._tools_lock = threading.Lock()  # loaded once, whichever thread asks first
        self.channel = channel
        self.legacy_version: str | None = None  # set by initialize
        self.calls = InFlight()
        self.workers = Workers()
        self.instructions = instructions
        self.on_first_answer: Callable[[], None] | None = None  # called once the first message was handled
        self.checks = Checks(None)  # up's (--checks): the calls that run a program wait for them

    @property
    def tools(self) -> Tools:
        """The tool table, loaded by the reader at its first use: after the
        first answer (the handshake never waits for the tool layer's imports),
        or for a first request that needs it."""
        with self._tools_lock:
            if self._tools is None:
                self.channel.use_orjson()  # with the tool layer, whose values it writes (protocol.py)
                self._tools = self._load_tools()
            return self._tools

    # -- the read loop ----------------------------------------------------

    def run(self) -> int:
        # The handler only records and wakes the read: an exception raised from
        # it could land anywhere on this thread (inside a `try` that swallows it).
        stopped: list[int] = []

        def stop(signum: int, frame: object) -> None:
            stopped.append(signum)
            self.channel.interrupt()

        def handle(line: bytes | None) -> None:  # on the stdin thread, one line at a time
            if line is None:
                self.channel.send(error(None, INVALID_REQUEST, "the message is over 64 MB; send smaller messages"))
                return
            self.handle_line(line)
            if self.on_first_answer is not None:
                first, self.on_first_answer = self.on_first_answer, None
                first()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self.channel.serve_lines(handle, self.workers.start)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        self.shutdown(0.0 if stopped else EOF_GRACE)
        return 0

    def shutdown(self, grace: float) -> None:
        """Stop reading; let calls in flight answer within `grace`, then kill them,
        then give the answers queued the time the client takes to read them."""
        self.checks.forget_waiting()
        self.workers.wait(time.monotonic() + grace)
        self.calls.silence_all()
        # A call killed between its program's spawn and its watch kills it as
        # the watch begins: its worker gets that moment before serve exits.
        self.workers.wait(time.monotonic() + KILLED_WAIT)
        if self._tools is not None:  # without the tool layer, no call ran and no spare was made
            self._tools.close()
        self.channel.flush(FLUSH_IDLE)
        self.channel.close()

    def handle_line(self, line: bytes) -> None:
        try:
            message = self.channel.loads(line)
        except ValueError as problem:
            try:
                refused = lone_surrogate_refused(lenient_loads(line, problem))
            except ValueError:
                refused = error(None, PARSE_ERROR, f"the line is not JSON ({problem}); send one JSON-RPC message a line")
            if refused is not None:
                self.channel.send(refused)
            return
        if isinstance(message, list):
            self._batch(message)
            return
        response = self.handle(message)
        if response is not None:
            self.channel.send(response)

    def _batch(self, messages: list[Any]) -> None:
        if self.legacy_version != "2025-03-26" or not messages:
            self.channel.send(error(None, INVALID_REQUEST, "a batch is not accepted at this protocol version; send one message a line"))
            return

        def answer_all() -> None:
            # Each call on a thread of its own, as when sent alone; the rest here, in turn.
            responses: list[dict[str, Any] | None] = [None] * len(messages)

            def answer(index: int) -> None:
                responses[index] = self.handle(messages[index], inline=True)

            calls: list[threading.Thread] = []
            for index, message in enumerate(messages):
                if isinstance(message, dict) and message.get("method") == "tools/call":
                    calls.append(threading.Thread(target=answer, args=(index,), daemon=True))
                    calls[-1].start()
                else:
                    answer(index)
            for thread in calls:
                thread.join()
            answered = [response for response in responses if response is not None]
            if answered:
                self.channel.send(answered)

        self.workers.run(answer_all)

    # -- one message ------------------------------------------------------

    def handle(self, message: object, inline: bool = False) -> dict[str, Any] | None:
        """The response to one message, or None (a notification, or answered by a thread)."""
        if not isinstance(message, dict):
            return error(None, INVALID_REQUEST, "a message must be a JSON object")
        has_id = "id" in message
        given_id = message.get("id")
        request_id = given_id if is_id(given_id) else None  # None: no answer can name it
        if message.get("jsonrpc") != "2.0":
            return error(request_id, INVALID_REQUEST, 'the message lacks "jsonrpc": "2.0"')
        method = message.get("method")
        if method is None:
            if "result" in message or "error" in message:
                return None  # a response from the client: we send no requests, so nothing waits for it
            return error(request_id, INVALID_REQUEST, "the message has no method")
        if not isinstance(method, str):
            return error(request_id, INVALID_REQUEST, "the method must be a string")
        params = message.get("params", {})
        if not has_id:
            if isinstance(params, dict):
                self._notification(method, params)
            return None
        if request_id is None:
            return error(None, INVALID_REQUEST,
                         "the id must be a string or an integer of 64 bits at most (-2**63 to 2**64-1)")
        if not isinstance(params, dict):
            return error(request_id, INVALID_PARAMS, "params must be an object")
        try:
            return self._request(request_id, method, params, inline)
        except Exception as problem:  # a bug of ours: say so, keep serving
            logger.error(f"internal error on {method}: {problem!r}")
            return error(request_id, INTERNAL_ERROR, f"internal error: {problem}")

    def _notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "notifications/cancelled":
            request_id = params.get("requestId")
            if is_id(request_id):
                self.calls.cancel(request_id)
        # Every other notification (initialized, roots changed, unknown ones) needs nothing.

    def _request(self, request_id: RequestId, method: str, params: dict[str, Any], inline: bool) -> dict[str, Any] | None:
        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        if not self._known(method):
            offers = "tools, and the resources of its kept output" if self.keeps_output else "tools only"
            return error(request_id, METHOD_NOT_FOUND, f"unknown method {method!r}; this server offers {offers}")
        if method == "initialize":
            return result(request_id, self._initialize(params))
        modern = VERSION_KEY in meta
        if modern:
            version = meta[VERSION_KEY]
            if version not in MODERN_VERSIONS:
                return error(request_id, UNSUPPORTED_VERSION, f"protocol version {version!r} is not supported",
                             {"supported": list(MODERN_VERSIONS + LEGACY_VERSIONS[::-1]), "requested": version})
            if not isinstance(meta.get(CAPABILITIES_KEY), dict):
                return error(request_id, INVALID_PARAMS, f"_meta lacks {CAPABILITIES_KEY}")
        elif method == "ping":
            return result(request_id, {})
        elif self.legacy_version is None or method in ("server/discover", "subscriptions/listen"):
            return error(request_id, INVALID_PARAMS,
                         f"{method} needs initialize first, or the 2026-07-28 _meta envelope "
                         f"({VERSION_KEY} and {CAPABILITIES_KEY})")
        else:
            version = self.legacy_version

        if method == "ping":
            value: dict[str, Any] = {}
        elif method == "server/discover":
            value = {
                "supportedVersions": list(MODERN_VERSIONS + LEGACY_VERSIONS[::-1]),
                "capabilities": self._capabilities({"tools": {}}),
                "instructions": self.instructions,
                "ttlMs": 0,
                "cacheScope": "private",
            }
        elif method == "tools/list":
            if "cursor" in params:
                return error(request_id, INVALID_PARAMS, "unknown cursor: this server lists every tool in one page")
            value = {"tools": self.tools.listing(version)}
            if modern:
                value.update(ttlMs=0, cacheScope="private")
        elif method == "subscriptions/listen":
            self._listen(request_id)
            return None
        elif method in RESOURCE_METHODS:
            return self._resources(request_id, method, params, meta, modern)
        else:  # tools/call
            return self._call(request_id, params, version, modern, inline)
        return result(request_id, self._complete(value, modern))

    def _complete(self, value: dict[str, Any], modern: bool) -> dict[str, Any]:
        if modern:
            value["resultType"] = "complete"
            value.setdefault("_meta", {})[SERVER_INFO_KEY] = SERVER_INFO
        return value

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        version = asked if asked in LEGACY_VERSIONS else LATEST_LEGACY
        self.legacy_version = version
        info = dict(SERVER_INFO)
        if version >= "2025-06-18":
            info["title"] = "Link Run"
        if version >= "2025-11-25":
            info["description"] = "Runs an agent's programs, each call in a sandbox of its own."
        return {
            "protocolVersion": version,
            "capabilities": self._capabilities({"tools": {"listChanged": False}}),
            "serverInfo": info,
            "instructions": self.instructions,
        }

    def _known(self, method: str) -> bool:
        return method in KNOWN_METHODS or (method in RESOURCE_METHODS and self.keeps_output)

    def _resources(self, request_id: RequestId, method: str, params: dict[str, Any], meta: dict[str, Any], modern: bool) -> dict[str, Any]:
        from .reading import resources

        assert self.tools.kept is not None  # known only then
        value, problem = resources(method, params, meta, self.tools.kept)
        if problem is not None:
            return error(request_id, *problem)
        return result(request_id, self._complete(value, modern))

    def _capabilities(self, capabilities: dict[str, Any]) -> dict[str, Any]:
        """With kept output, resources too: a call's answer links each kept stream, and resources/read serves it."""
        if self.keeps_output:
            capabilities["resources"] = {}
        return capabilities

    def _listen(self, request_id: RequestId) -> None:
        # The tool list never changes: acknowledge with no notifications and
        # hold the request open until it is cancelled or stdin closes.
        self.calls.add(Call(request_id, None), replace=True)
        self.channel.send({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": {}, "_meta": {"io.modelcontextprotocol/subscriptionId": request_id}},
        })

    # -- tools/call ---------------------------------------------------------

    def _call(self, request_id: RequestId, params: dict[str, Any], version: str, modern: bool, inline: bool) -> dict[str, Any] | None:
        try:
            name, arguments, meta = self._checked_call(params)
        except _BadParams as bad:
            return error(request_id, INVALID_PARAMS, str(bad))

        call = Call(request_id, progress_token(meta))
        if not self.calls.add(call):
            return error(request_id, INVALID_REQUEST, f"request id {request_id!r} is already in flight; use a new id")

        context = CallContext(meta, call.cancel)

        def work() -> dict[str, Any] | None:
            response = None
            try:
                if call.progress_token is not None:
                    context.progress = call.progress_sender(self.channel, version)
                outcome = self.checks.refusal(name) or self._run_tool(name, arguments, context)
                response = self._answer_call(call, outcome, version, modern)
                return response
            finally:
                self.calls.forget(call, answered=response is not None)
                if inline:
                    context.later.run()  # a batch's answers go out together, after all its calls

        if inline:
            return work()

        def answer() -> None:
            try:
                response = work()
                if response is not None:
                    self.channel.send(response)
            finally:
                context.later.run()  # what the call left to do: its answer is out

        # Run on the thread that read the request, once another reads on: no
        # thread is woken between the request and its program.
        job = self.workers.count(answer)
        if not self.channel.leave_for_reader(job):
            self.workers.start(job)
        return None

    def _checked_call(self, params: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """A tools/call's name, arguments (null is none) and _meta; _BadParams says what is wrong."""
        name = params.get("name")
        if not isinstance(name, str):
            raise _BadParams("tools/call needs a string name")
        arguments = params.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise _BadParams("tools/call arguments must be an object")
        if name not in self.tools.table:
            raise _BadParams(self.tools.unknown(name))
        meta = params.get("_meta")
        return name, arguments, meta if isinstance(meta, dict) else {}

    def _run_tool(self, name: str, arguments: dict[str, Any], context: CallContext) -> ToolResult | None:
        """The tool's outcome; a failure inside the server becomes one the agent reads."""
        try:
            return self.tools.call(name, arguments, context)
        except Exception as problem:
            logger.error(f"{name} failed: {problem!r}")
            from .results import ToolResult

            return ToolResult(f"The call failed inside the server: {problem}. Try again; "
                              "if it keeps failing, the server's log (stderr) says more.", is_error=True)

    def _answer_call(self, call: Call, outcome: ToolResult | None, version: str, modern: bool) -> dict[str, Any] | None:
        """The call's answer, or None when it was cancelled (it gets none)."""
        if outcome is None or not call.may_answer():
            return None
        return result(call.id, self._complete(outcome.answer(version), modern))


class _BadParams(Exception):
    """A tools/call whose params are wrong: the message says what."""


def main(argv: list[str]) -> int:
    """serve; with --checks, up's work still to do (checks.py), done after the handshake, before a program runs."""
    if argv and argv[0] in ("-h", "--help"):
        from ..config import SERVE_USAGE
        print(f"usage: {SERVE_USAGE}")
        return 0
    logger.start("serve", quiet_for_a_client=True)  # a client shows its stderr: warnings and errors only
    # A call holds a few descriptors, and many calls run at once: never let a
    # soft limit of 1024 refuse one while the hard limit allows it.
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    settings = parse_serve(argv)
    if settings.background is not None:
        from ..state.layout import check_filesystem

        check_filesystem(settings.background.state)
    if settings.proxy:
        from ..calls.setup import check_proxy_settings

        assert settings.state is not None  # config: --proxy needs --state
        check_proxy_settings(settings.state)
    # Clients pass almost no environment (no LANG): our streams are bytes, and
    # texts we print on stderr must not depend on the locale.
    if isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr.reconfigure(encoding="utf-8", errors="replace")
    offer = Offer(settings)

    def load_tools() -> Tools:
        from .tools import Tools

        tools = Tools(settings, offer)
        if tools.background is not None:
            tools.background.start_sweeping()
        return tools

    # The handshake's instructions from the settings alone: the tool layer loads after it.
    session = Session(offer.instructions(), load_tools, Channel(), keeps_output=settings.keep is not None)
    if settings.checks is not None:
        session.checks = Checks(partial(up_checks, settings.checks, settings.sandbox, settings.write, settings.seccomp))

    def first_answered() -> None:
        # The answer out first: the writer thread would wait for the interpreter lock the imports hold.
        session.channel.flush(FLUSH_IDLE)
        gc.enable()  # off for the start (cli.py)
        session.checks.start()  # on a thread of their own, beside the tool layer's loading
        # Spares and the proxy are made with what the checks make (the /etc view).
        session.checks.after(session.tools.first_answered)

    session.on_first_answer = first_answered
    code = session.run()
    if not session.checks.passed():
        code = 1
    sys.stderr.flush()
    os._exit(code)  # daemon threads may still hold a killed call; do not wait for them
