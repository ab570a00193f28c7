"""The raw pipe: what the SDK clients never send, and what a server must still
get right. Each test names the item of the MCP conformance checklist it
proves (F stdio framing, J JSON-RPC, L legacy lifecycle, M the 2026-07-28
envelope, T tools/list, C tools/call, X cancellation, P progress, I
instructions and serverInfo).

Every server these tests start is checked again when the test ends, on
everything it wrote: one JSON message a line (F1), no requests to the client
(M6), no log notifications (M7), well-formed errors with no undefined code
(J10), never `"isError": false` or null, a non-empty text beside structured
content (C4), and structured content that fits the declared output schema
(C5).
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import jsonschema
import orjson
import pytest
from conftest import (
    LEGACY, MODERN, PYTHON, RawServer, clean_env, pid_alive, serve_argv, text_of, wait_for,
)
from mcp_types import _v2025_11_25 as spec_legacy
from mcp_types import _v2026_07_28 as spec_modern

LEGACY_VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
RUN_FIELDS = {"exit", "signal", "timed_out", "output_bytes", "errors_bytes", "seconds", "output", "errors", "limit"}
# The first line of a command's text: how it ended, and how long it took.
ENDING = re.compile(r"^exit (\d+) · \d+\.\d\d s")
# Error codes the 2026-07-28 spec defines inside its reserved -32020…-32099 band.
SPEC_CODES_IN_BAND = {-32020, -32021, -32022}
EOF_GRACE = 1.5  # DESIGN §2: calls in flight get this long to answer after stdin closes


# -- helpers -------------------------------------------------------------------


def envelope(**more) -> dict:
    """The 2026-07-28 request `_meta`: the version and capabilities on every request."""
    return {VERSION_KEY: MODERN, CAPABILITIES_KEY: {}, **more}


def modern(server: RawServer, method: str, params: dict | None = None, request_id=None, **meta) -> dict:
    params = dict(params or {})
    params["_meta"] = {**envelope(), **params.get("_meta", {}), **meta}
    return server.request(method, params, request_id=request_id)


def wire(server: RawServer) -> list:
    """Everything the server wrote so far, parsed, in order."""
    return [orjson.loads(line) for line in list(server.raw)]


def messages(server: RawServer) -> list[dict]:
    """As `wire`, with batch answers opened up."""
    found = []
    for message in wire(server):
        found += message if isinstance(message, list) else [message]
    return found


def same_id(a, b) -> bool:
    return type(a) is type(b) and a == b


def responses_to(server: RawServer, request_id) -> list[dict]:
    return [m for m in messages(server) if "method" not in m and same_id(m.get("id"), request_id)]


def progress_for(server: RawServer, token) -> list[dict]:
    return [m["params"] for m in messages(server)
            if m.get("method") == "notifications/progress" and same_id(m["params"].get("progressToken"), token)]


def sh(script: str, **more) -> dict:
    return {"program": "sh", "args": ["-c", script], **more}


def error_of(response: dict) -> dict:
    assert "error" in response and "result" not in response, response
    return response["error"]


def nulls(value, path="") -> list[str]:
    """Where a null sits in a value: optional fields are left out, never null (P3 pitfall)."""
    if value is None:
        return [path or "(root)"]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in nulls(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in nulls(item, f"{path}[{index}]")]
    return []


def keys_of(value) -> set[str]:
    """Every key of every object inside a value."""
    if isinstance(value, dict):
        return set(value).union(*(keys_of(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(keys_of(item) for item in value))
    return set()


def conforms(model, value: dict) -> None:
    """Valid for the spec's wire model, and with no key the spec does not define."""
    model.model_validate(value)
    known = {field.alias or name for name, field in model.model_fields.items()}
    unknown = set(value) - known
    assert not unknown, f"{model.__name__} has keys the spec does not define: {sorted(unknown)}"


def every(cases, check) -> None:
    """Run `check` on each case; fail once, naming each case that failed and why."""
    failed = []
    for case in cases:
        try:
            check(case)
        except (AssertionError, KeyError, EOFError) as problem:
            failed.append(f"{case!r}: {type(problem).__name__}: {problem}")
    assert not failed, "\n".join(failed)


def wait_pid_file(path: Path) -> list[int]:
    text = wait_for(lambda: path.exists() and path.read_text().strip(), what=f"{path.name} to be written")
    return [int(pid) for pid in text.split()]


def pid_script(name: str) -> dict:
    """A call that writes the pids of its shell and a grandchild, then blocks until killed."""
    return sh(f"sleep 30 & echo $$ $! > {name}.tmp; mv {name}.tmp {name}; wait", folder="work")


def wait_gone(pids: list[int], timeout: float = 5.0) -> None:
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), timeout=timeout, what=f"pids {pids} to die")


# -- the checks every server gets at the end of its test -------------------------


def check_wire(server: RawServer, output_schema: dict) -> None:
    for line in list(server.raw):
        # F1: one JSON document a line, no newline inside it.
        assert line.endswith(b"\n") and line.count(b"\n") == 1, line[:200]
        message = orjson.loads(line)
        for item in message if isinstance(message, list) else [message]:
            check_message(item, output_schema)


def check_message(message: dict, output_schema: dict) -> None:
    assert isinstance(message, dict) and message.get("jsonrpc") == "2.0", message
    if "method" in message:
        assert "id" not in message, f"M6: the server sent a request: {message}"
        assert message["method"] != "notifications/message", f"M7: a log notification: {message}"
        return
    assert ("result" in message) != ("error" in message), message
    assert message["id"] is None or isinstance(message["id"], (str, int)), message
    if "error" in message:
        error = message["error"]
        assert isinstance(error["code"], int) and not isinstance(error["code"], bool), error
        assert isinstance(error["message"], str) and error["message"].strip(), error
        assert "\n" not in error["message"], error
        assert not (-32099 <= error["code"] <= -32020) or error["code"] in SPEC_CODES_IN_BAND, error
        return
    result = message["result"]
    assert isinstance(result, dict), message
    if "isError" in result:
        assert result["isError"] is True, f"C2: isError is sent only as true: {result}"
    if "structuredContent" in result:
        # C4: an object, with a readable text beside it; C5: it fits the declared schema.
        jsonschema.validate(result["structuredContent"], output_schema)
        assert any(b["type"] == "text" and b["text"].strip() for b in result["content"]), result
    if "content" in result:
        assert not nulls(result["content"]), result


@pytest.fixture(scope="module")
def output_schema(tmp_path_factory) -> dict:
    """The `command` tool's outputSchema, as a 2025-11-25 client is told it."""
    files = tmp_path_factory.mktemp("schema") / "files"
    files.mkdir()
    server = RawServer(serve_argv(files))
    try:
        server.initialize()
        tools = server.request("tools/list")["result"]["tools"]
    finally:
        server.close()
    schema = next(tool for tool in tools if tool["name"] == "command")["outputSchema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@pytest.fixture
def serve(servers, files, output_schema):
    """Start a server over `files` (`serve(*flags, argv=..., env=...)`); its wire is checked at the end."""
    started: list[RawServer] = []

    def start(*extra, argv=None, env=None, **options) -> RawServer:
        server = servers(argv or serve_argv(files, *extra, **options), env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        check_wire(server, output_schema)


@pytest.fixture
def legacy(serve) -> RawServer:
    server = serve()
    server.initialize(LEGACY)
    return server


# -- F: stdio framing and the process ------------------------------------------


def test_F5_a_server_whose_stdin_is_empty_exits_0_at_once_and_says_nothing(files):
    def timed(argv):
        started = time.monotonic()
        run = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=clean_env(), timeout=10)
        return run, time.monotonic() - started

    # What starting the interpreter and importing serve costs on this machine, now.
    _, baseline = timed(serve_argv(files)[:5] + ["--help"])
    run, elapsed = timed(serve_argv(files))
    assert run.returncode == 0, run.stderr
    assert run.stdout == b""
    assert elapsed < 1.0 or elapsed < baseline + 0.3, f"{elapsed:.2f} s to leave on an empty stdin"


def test_F5_a_call_shorter_than_the_grace_is_still_answered_after_stdin_closes(serve):
    server = serve()
    server.initialize()
    server.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                 "params": {"name": "command", "arguments": sh("sleep 0.5; echo finished")}})
    server.process.stdin.close()
    response = server.wait_response(5, timeout=EOF_GRACE + 2)
    assert "finished" in text_of(response["result"])
    assert server.process.wait(timeout=5) == 0


def test_F5_a_call_longer_than_the_grace_is_killed_unanswered_and_the_server_exits_0(serve, files):
    server = serve()
    server.initialize()
    server.send({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                 "params": {"name": "command", "arguments": pid_script("long.pid")}})
    pids = wait_pid_file(files / "work" / "long.pid")
    closed = time.monotonic()
    server.process.stdin.close()
    assert server.process.wait(timeout=EOF_GRACE + 3) == 0
    assert time.monotonic() - closed < EOF_GRACE + 1.0
    wait_gone(pids)
    server.kill()  # joins the reader: the wire is complete
    assert responses_to(server, 6) == []


def test_F5_sigterm_kills_calls_in_flight_and_exits_0_promptly(serve, files):
    server = serve()
    server.initialize()
    server.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                 "params": {"name": "command", "arguments": pid_script("term.pid")}})
    pids = wait_pid_file(files / "work" / "term.pid")
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=5) == 0
    assert time.monotonic() - signalled < 1.0
    wait_gone(pids)


def test_F5_the_server_leaves_when_its_stdout_goes_away(files):
    process = subprocess.Popen(serve_argv(files), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=clean_env())
    try:
        process.stdout.close()  # the client is gone: every write is EPIPE
        for request_id in range(3):
            process.stdin.write(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "ping"}) + b"\n")
            process.stdin.flush()
        # stdin stays open: only the broken stdout can make it leave.
        assert process.wait(timeout=5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()


# Loaded by the server's interpreter at start (not isolated, so PYTHONPATH counts):
# each time serve spawns a program, a library warns and prints in the middle of
# the call, and the first time it raises, as a bug in a library would.
NOISY_SITE = """
import sys, warnings
raised = []
def noisy(event, args):
    if event != "subprocess.Popen":
        return
    warnings.warn("a library warning in the middle of a call", UserWarning)
    print("a stray print in the middle of a call", flush=True)
    if not raised:
        raised.append(1)
        raise RuntimeError("a library failed in the middle of a call")
sys.addaudithook(noisy)
"""


def test_F2_warnings_prints_and_a_failing_library_never_reach_stdout(serve, files, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NOISY_SITE)
    argv = serve_argv(files)
    argv = [PYTHON, "-X", "dev", "-W", "always", "-m", "linkrun"] + argv[argv.index("serve"):]
    server = serve(argv=argv, env=clean_env(PYTHONWARNINGS="always", PYTHONPATH=str(site)))
    server.initialize()
    failed = server.call("command", {"program": "echo", "args": ["first"]})
    assert failed["isError"] is True  # the server caught the failure and said so
    assert "failed" in text_of(failed)
    for arguments in ({"program": "echo", "args": ["fine"]}, {"program": "rm"}, sh("printf '\\377 not utf-8'; exit 3"),
                      sh("sleep 5", timeout=0.2), {"program": "echo", "input": "x" * 200_000}):
        server.call("command", arguments)
    server.send_raw(b"{not json\n")
    server.request("nope/nope")
    assert server.close() == 0
    server.kill()
    assert b"a library warning in the middle of a call" in server.stderr
    assert b"a stray print in the middle of a call" in server.stderr
    lines = list(server.raw)
    assert len(lines) >= 9
    for line in lines:
        assert orjson.loads(line)["jsonrpc"] == "2.0"


def test_F4_crlf_line_endings_and_blank_lines_are_accepted(legacy):
    before = len(legacy.raw)
    legacy.send_raw(b"\n\r\n   \n")
    legacy.send_raw(b'{"jsonrpc":"2.0","id":"crlf","method":"ping"}\r\n')
    assert legacy.wait_response("crlf")["result"] == {}
    assert len(legacy.raw) == before + 1, "a blank line was answered"


def test_F4_concurrent_answers_and_progress_never_interleave_within_a_line(legacy):
    ids = list(range(100, 116))
    for request_id in ids:
        legacy.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {
            "name": "command", "_meta": {"progressToken": f"t{request_id}"},
            "arguments": sh("for i in 1 2 3; do head -c 30000 /dev/zero | tr '\\0' x; sleep 0.3; done")}})
    for request_id in ids:
        result = legacy.wait_response(request_id, timeout=30)["result"]
        assert result["structuredContent"]["output_bytes"] == 90000
    # The end-of-test check parses every line; here, each answer is its own line.
    assert sum(1 for m in wire(legacy) if "id" in m) == len(ids) + 1


def test_F6_the_server_needs_no_inherited_environment(serve):
    server = serve(env={})
    server.initialize()
    result = server.call("command", {"program": "echo", "args": ["naïve ☃ 日本"]})
    assert "naïve ☃ 日本" in text_of(result)
    assert result["structuredContent"]["output_bytes"] == len("naïve ☃ 日本\n".encode())


def test_F7_starting_writes_nothing_and_two_servers_share_a_folder(serve, files, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (files / "work" / "keep").write_text("x")
    before = sorted(p.relative_to(files) for p in files.rglob("*"))
    first = serve(env=clean_env(HOME=str(home)))
    second = serve(env=clean_env(HOME=str(home)))
    for server in (first, second):
        server.initialize()
        assert server.request("ping")["result"] == {}
    for server in (first, second):
        assert server.close() == 0
    assert sorted(p.relative_to(files) for p in files.rglob("*")) == before
    assert list(home.iterdir()) == []


# -- J: JSON-RPC ---------------------------------------------------------------


def test_J1_ids_come_back_verbatim_with_their_type(legacy):
    def check(request_id):
        assert legacy.request("ping", request_id=request_id)["result"] == {}
        assert same_id(legacy.request("tools/list", request_id=request_id)["id"], request_id)
        result = legacy.call("command", {"program": "echo", "args": ["id"]}, request_id=request_id)
        assert "isError" not in result
        assert same_id(modern(legacy, "ping", request_id=request_id)["id"], request_id)

    every([0, -1, "0", "abc", "", 2**53 + 1, "server-discover-probe-1"], check)


def test_J1_calls_1_and_string_1_are_two_requests(legacy):
    legacy.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "command", "arguments": sh("sleep 0.3; echo integer")}})
    legacy.send({"jsonrpc": "2.0", "id": "1", "method": "tools/call",
                 "params": {"name": "command", "arguments": sh("sleep 0.3; echo string")}})
    assert "integer" in text_of(legacy.wait_response(1)["result"])
    assert "string" in text_of(legacy.wait_response("1")["result"])


def test_J2_a_null_fractional_boolean_object_or_array_id_is_an_invalid_request_with_id_null(legacy):
    def check(bad_id):
        legacy.send({"jsonrpc": "2.0", "id": bad_id, "method": "ping"})
        response = legacy.wait_response(None)
        assert error_of(response)["code"] == -32600
        assert legacy.request("ping")["result"] == {}

    every([None, 1.5, 2.0, True, False, {"n": 1}, [1]], check)


def test_J3_an_unparseable_line_is_a_parse_error_and_the_server_reads_on(legacy):
    def check(line):
        legacy.send_raw(line + b"\n")
        assert error_of(legacy.wait_response(None))["code"] == -32700
        assert legacy.request("ping")["result"] == {}

    every([b"{not json", b"\xff\xfe\x00", b'{"jsonrpc":"2.0","id":1,"method":"ping"', b"[1, 2", b"nul",
           b'{"jsonrpc":"2.0","id":1,"method":"ping"}}'], check)
    assert legacy.process.poll() is None


def test_J3_an_integer_id_past_64_bits_is_refused_saying_the_range(legacy):
    legacy.send_raw(b'{"jsonrpc":"2.0","id":18446744073709551616,"method":"ping"}\n')  # 2**64
    assert error_of(legacy.wait_response(None))["message"] == (
        "the id must be a string or an integer of 64 bits at most (-2**63 to 2**64-1)")
    legacy.send_raw(b'{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"}\n')  # 2**64 - 1
    assert legacy.wait_response(18446744073709551615)["result"] == {}


def test_J3_a_lone_surrogate_is_refused_by_the_requests_own_id_naming_where_it_is(legacy):
    """JSON's grammar allows "\ud800"; UTF-8 cannot carry it, and orjson refuses the line."""
    def check(case):
        where, escaped = case
        arguments = {"program": "echo", "args": ["fine", "ARG"], "input": "fine"}
        line = orjson.dumps({"jsonrpc": "2.0", "id": "lone", "method": "tools/call",
                             "params": {"name": "command", "arguments": arguments}})
        legacy.send_raw(line.replace(b'"ARG"' if where == "args[1]" else b'"input"', escaped) + b"\n")
        response = legacy.wait_response("lone")
        assert error_of(response)["code"] == -32602, response
        named = where if where.startswith("a key") else f"the argument {where}"
        assert response["error"]["message"].startswith(f"{named} holds a lone surrogate"), response
        assert legacy.request("ping")["result"] == {}

    every([("args[1]", rb'"\ud800"'), ("args[1]", rb'"a\udc80b"'), ("args[1]", rb'"\udcff"'),
           ("a key of the arguments", rb'"\ud800x"')], check)
    legacy.send_raw(rb'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"\ud800"}}' + b"\n")
    legacy.send_raw(rb'{"jsonrpc":"2.0","id":"\ud800","method":"ping"}' + b"\n")
    assert error_of(legacy.wait_response(None))["code"] == -32600  # an id that cannot be written back
    assert legacy.request("ping")["result"] == {}  # and the notification was not answered


# Odd first lines: until its first answer is out, serve reads with the standard library's json, then orjson.
FIRST_LINES = [
    b"{not json", b"\xff\xfe\x00", b"nul", b"[1, 2", b'{"jsonrpc":"2.0","id":1,"method":"ping"}}', b"\xef\xbb\xbf{}",
    b'"\xed\xa0\x80"', b"[" * 1100 + b"]" * 1100, b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1e999,"method":"ping"}', b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}',
    rb'{"jsonrpc":"2.0","id":"lone","method":"ping","params":{"x":"a\udc80b"}}',
    rb'{"jsonrpc":"2.0","id":"\ud800","method":"ping"}',
    rb'{"jsonrpc":"2.0","id":"pair \ud83d\ude00 \u00e9 \\ud800","method":"ping"}',
]


def test_J3_a_servers_first_line_is_answered_as_any_later_line_is(serve):
    def answer(server: RawServer, line: bytes) -> dict:
        server.send_raw(line + b"\n")
        response = server.next_message()
        if response.get("error", {}).get("code") == -32700:  # the reader's own words follow
            response["error"]["message"] = response["error"]["message"].split(" (")[0]
        return response

    def check(line):
        server = serve()
        first = answer(server, line)
        server.initialize(LEGACY)
        assert answer(server, line) == first, first

    every(FIRST_LINES, check)


def test_J4_json_that_is_not_a_request_is_an_invalid_request_echoing_a_readable_id(legacy):
    def check(case):
        message, answer_id = case
        legacy.send(message)
        assert error_of(legacy.wait_response(answer_id))["code"] == -32600
        assert legacy.request("ping")["result"] == {}

    every([
        ({"id": 7, "method": "ping"}, 7),
        ({"jsonrpc": "1.0", "id": 8, "method": "ping"}, 8),
        ({"jsonrpc": "2.0", "id": 9}, 9),
        ({"jsonrpc": "2.0", "id": 10, "method": 5}, 10),
        ({"jsonrpc": "2.0", "id": 11, "method": None}, 11),
        (42, None),
        ("ping", None),
        (None, None),
    ], check)


UNKNOWN_METHODS = ["resources/list", "resources/read", "resources/templates/list", "prompts/list", "prompts/get",
                   "logging/setLevel", "completion/complete", "tasks/list", "sampling/createMessage", "no/such"]


def test_J5_an_unknown_method_is_method_not_found_in_either_era(legacy):
    def check(method):
        assert error_of(legacy.request(method, {}))["code"] == -32601
        assert error_of(modern(legacy, method))["code"] == -32601

    every(UNKNOWN_METHODS, check)


def test_J5_an_unknown_method_before_initialize_is_method_not_found(serve):
    server = serve()
    assert error_of(server.request("resources/list", {}))["code"] == -32601


def test_J6_bad_params_are_invalid_params(legacy):
    def check(case):
        method, params = case
        assert error_of(legacy.request(method, params))["code"] == -32602
        if isinstance(params, dict):
            assert error_of(modern(legacy, method, params))["code"] == -32602

    every([
        ("tools/list", [1]),
        ("tools/list", "all"),
        ("ping", [1]),
        ("tools/call", {"arguments": {}}),
        ("tools/call", {"name": 5, "arguments": {}}),
        ("tools/call", {"name": None}),
        ("tools/call", {"name": "command", "arguments": []}),
        ("tools/call", {"name": "command", "arguments": "program=echo"}),
        ("tools/call", {"name": "command", "arguments": 5}),
        ("tools/list", {"cursor": "next"}),
    ], check)


def test_J8_notifications_are_never_answered(legacy, files):
    before = len(legacy.raw)
    for method, params in [
        ("notifications/initialized", None),
        ("notifications/initialized", {}),
        ("notifications/cancelled", {"requestId": 12345, "reason": "gone"}),
        ("notifications/roots/list_changed", {}),
        ("notifications/progress", {"progressToken": 1, "progress": 1}),
        ("notifications/whatever", {"x": 1}),
        ("ping", None),
        ("no/such/method", {}),
        ("tools/list", "not even params"),
    ]:
        legacy.notify(method, params)
    legacy.send({"jsonrpc": "2.0", "method": "notifications/initialized", "params": envelope()})
    assert legacy.request("ping", request_id="after")["result"] == {}
    assert len(legacy.raw) == before + 1, wire(legacy)[before:]


def test_J9_responses_from_the_client_are_ignored(legacy):
    before = len(legacy.raw)
    legacy.send({"jsonrpc": "2.0", "id": 1, "result": {}})
    legacy.send({"jsonrpc": "2.0", "id": "x", "error": {"code": -32601, "message": "no"}})
    legacy.send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse"}})
    assert legacy.request("ping", request_id="after")["result"] == {}
    assert len(legacy.raw) == before + 1, wire(legacy)[before:]


def test_J10_every_error_has_an_integer_code_and_a_one_line_message(legacy):
    answers = [
        legacy.request("no/such"), legacy.request("tools/call", {"name": "nope"}),
        legacy.request("tools/list", {"cursor": "x"}), modern(legacy, "ping", **{VERSION_KEY: "1999-01-01"}),
        legacy.request("tools/call", {"name": "command", "arguments": []}),
    ]
    legacy.send_raw(b"}\n")
    answers.append(legacy.wait_response(None))
    for answer in answers:
        error = error_of(answer)
        assert isinstance(error["code"], int)
        assert error["message"] and "\n" not in error["message"]
        assert set(error) <= {"code", "message", "data"}


def test_J11_a_batch_at_2025_03_26_is_answered_with_one_array_of_the_requests_answers(serve):
    server = serve()
    server.initialize("2025-03-26")
    before = len(server.raw)
    server.send([
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "b", "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "command", "arguments": {"program": "echo", "args": ["batched"]}}},
        42,
    ])
    answer = server.next_message()
    assert isinstance(answer, list), answer
    by_id = {repr(item["id"]): item for item in answer}
    assert set(by_id) == {"1", "'b'", "3", "None"}
    assert by_id["1"]["result"] == {}
    assert by_id["'b'"]["result"]["tools"][0]["name"] == "command"
    call = by_id["3"]["result"]
    assert "batched" in text_of(call) and "structuredContent" not in call  # 2025-03-26 has none
    assert by_id["None"]["error"]["code"] == -32600
    # Nothing else came: the batch's answers are in the array only.
    assert server.request("ping", request_id="after")["result"] == {}
    assert len(server.raw) == before + 2


def test_J11_an_empty_batch_at_2025_03_26_is_one_invalid_request(serve):
    server = serve()
    server.initialize("2025-03-26")
    server.send([])
    response = server.wait_response(None)
    assert isinstance(response, dict)
    assert error_of(response)["code"] == -32600


def test_J11_a_batch_of_notifications_only_gets_no_answer(serve):
    server = serve()
    server.initialize("2025-03-26")
    before = len(server.raw)
    server.send([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    assert server.request("ping", request_id="after")["result"] == {}
    assert len(server.raw) == before + 1


@pytest.mark.parametrize("version", ["2024-11-05", "2025-06-18", "2025-11-25", None, MODERN])
def test_J11_a_batch_at_any_other_version_is_one_invalid_request_with_id_null(serve, version):
    server = serve()
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    if version == MODERN:
        ping["params"] = {"_meta": envelope()}
    elif version is not None:
        server.initialize(version)
    before = len(server.raw)
    server.send([ping])
    response = server.wait_response(None)
    assert error_of(response)["code"] == -32600
    assert server.request("ping", request_id="after")["result"] == {}
    assert len(server.raw) == before + 2  # no answer to the ping inside the batch


def test_J12_a_fast_call_is_answered_while_a_slow_one_runs(legacy):
    legacy.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                 "params": {"name": "command", "arguments": sh("sleep 1; echo slow")}})
    legacy.send({"jsonrpc": "2.0", "id": "fast", "method": "tools/call",
                 "params": {"name": "command", "arguments": {"program": "echo", "args": ["fast"]}}})
    assert legacy.request("ping", request_id="ping")["result"] == {}
    legacy.wait_response("slow")
    order = [m["id"] for m in wire(legacy) if "id" in m and m["id"] in ("slow", "fast", "ping")]
    assert order.index("fast") < order.index("slow")
    assert order.index("ping") < order.index("slow")


# -- L: the legacy lifecycle ---------------------------------------------------


@pytest.mark.parametrize("asked, answered", [(v, v) for v in LEGACY_VERSIONS] + [
    ("1999-01-01", LEGACY), ("2024-10-07", LEGACY), (MODERN, LEGACY), ("2099-12-31", LEGACY)])
def test_L1_initialize_echoes_a_supported_version_and_answers_its_latest_otherwise(serve, asked, answered):
    server = serve()
    assert server.initialize(asked)["protocolVersion"] == answered


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_L2_the_initialize_result_declares_tools_only_with_no_nulls(serve, version):
    server = serve()
    result = server.initialize(version)
    conforms(spec_legacy.InitializeResult, result)
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    info = result["serverInfo"]
    conforms(spec_legacy.Implementation, info)
    assert info["name"] == "lnk-link-run" and info["version"]
    assert ("title" in info) == (version >= "2025-06-18")
    assert ("description" in info) == (version >= "2025-11-25")
    assert isinstance(result["instructions"], str)
    assert nulls(result) == []


def test_L3_unknown_client_capabilities_and_fields_are_ignored(serve):
    server = serve()
    response = server.request("initialize", {
        "protocolVersion": LEGACY,
        "capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}, "io.modelcontextprotocol/ui": {}},
                         "experimental": {"x": {}}, "roots": {"listChanged": True}, "sampling": {},
                         "elicitation": {"form": {}}, "tasks": {}, "somethingNew": 1},
        "clientInfo": {"name": "odd", "version": "9", "title": "Odd", "icons": [], "extra": True},
        "unknownParam": [1, 2],
    })
    assert response["result"]["protocolVersion"] == LEGACY
    server.notify("notifications/initialized")
    assert server.request("tools/list")["result"]["tools"]


def test_L4_requests_pipelined_before_initialized_are_served(serve):
    server = serve()
    server.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    server.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    server.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                 "params": {"name": "command", "arguments": {"program": "echo", "args": ["early"]}}})
    server.notify("notifications/initialized")
    assert server.wait_response(1)["result"]["protocolVersion"] == LEGACY
    assert server.wait_response(2)["result"]["tools"]
    assert "early" in text_of(server.wait_response(3)["result"])


def test_L5_ping_is_answered_empty_in_every_state(serve):
    server = serve()
    assert server.request("ping", request_id=0) == {"jsonrpc": "2.0", "id": 0, "result": {}}
    server.initialize()
    assert server.request("ping", request_id=1) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert server.request("ping", {}, request_id=2)["result"] == {}


@pytest.mark.parametrize("method, params", [
    ("tools/list", None), ("tools/list", {}),
    ("tools/call", {"name": "command", "arguments": {"program": "echo"}}),
    ("subscriptions/listen", {"notifications": {}}),
])
def test_L6_M9_a_request_with_neither_initialize_nor_the_envelope_is_invalid_params(serve, method, params):
    server = serve()
    assert error_of(server.request(method, params))["code"] == -32602
    assert server.initialize()["protocolVersion"] == LEGACY  # nothing was spoilt


def test_L6_server_discover_without_the_envelope_is_refused_at_once(serve):
    server = serve()
    started = time.monotonic()
    response = server.request("server/discover", {}, request_id="server-discover-probe-1")
    assert time.monotonic() - started < 1.0
    assert error_of(response)["code"] in (-32601, -32602)


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_L7_tools_list_shows_only_the_fields_of_the_negotiated_version(serve, version):
    server = serve()
    server.initialize(version)
    (tool,) = server.request("tools/list")["result"]["tools"]
    expected = {"name", "description", "inputSchema"}
    if version >= "2025-03-26":
        expected |= {"annotations"}
    if version >= "2025-06-18":
        expected |= {"title", "outputSchema"}
    assert set(tool) == expected


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_L7_structured_content_only_from_2025_06_18(serve, version):
    server = serve()
    server.initialize(version)
    result = server.call("command", {"program": "echo", "args": ["shape"]})
    assert ("structuredContent" in result) == (version >= "2025-06-18")
    assert ENDING.match(text_of(result))
    assert set(result) <= {"content", "structuredContent"}


# -- M: the 2026-07-28 envelope ------------------------------------------------


def test_M1_an_unsupported_envelope_version_is_32022_naming_the_supported_ones(serve):
    server = serve()

    def check(asked):
        error = error_of(modern(server, "tools/list", **{VERSION_KEY: asked}))
        assert error["code"] == -32022
        assert MODERN in error["data"]["supported"] and LEGACY in error["data"]["supported"]
        assert error["data"]["requested"] == asked
        assert "resultType" in modern(server, "tools/list")["result"]  # no state was kept

    every(["1999-01-01", "2025-11-25", "2024-11-05", "2026-01-01", 20260728], check)


def test_M1_an_envelope_without_client_capabilities_is_invalid_params(serve):
    server = serve()

    def check(capabilities):
        meta = {VERSION_KEY: MODERN}
        if capabilities != "missing":
            meta[CAPABILITIES_KEY] = capabilities
        assert error_of(server.request("tools/list", {"_meta": meta}))["code"] == -32602
        assert modern(server, "tools/list")["result"]["tools"]

    every(["missing", None, [], "all"], check)


def test_M1_each_request_is_judged_on_its_own_envelope(serve):
    server = serve()
    assert modern(server, "ping")["result"]["resultType"] == "complete"
    assert error_of(server.request("ping", {"_meta": {VERSION_KEY: "2099-01-01", CAPABILITIES_KEY: {}}}))["code"] == -32022
    assert modern(server, "tools/list")["result"]["tools"]
    assert error_of(server.request("tools/list"))["code"] == -32602  # modern before does not make a session


def test_M2_server_discover_answers_the_spec_shape(serve):
    server = serve()
    result = modern(server, "server/discover")["result"]
    conforms(spec_modern.DiscoverResult, result)
    assert result["resultType"] == "complete"
    assert MODERN in result["supportedVersions"]
    assert set(LEGACY_VERSIONS) <= set(result["supportedVersions"])
    assert result["capabilities"] == {"tools": {}}
    assert isinstance(result["instructions"], str) and result["instructions"]
    assert isinstance(result["ttlMs"], int) and result["ttlMs"] >= 0
    assert result["cacheScope"] in ("public", "private")
    info = result["_meta"][SERVER_INFO_KEY]
    assert info["name"] == "lnk-link-run" and info["version"]
    assert nulls(result) == []


def test_M2_server_discover_is_answered_fast_on_a_fresh_process(serve):
    server = serve()
    started = time.monotonic()
    modern(server, "server/discover", request_id="server-discover-probe-1")
    assert time.monotonic() - started < 1.0  # the process's start included


def test_M3_every_modern_result_is_complete_and_carries_server_info(serve):
    server = serve()
    results = [
        modern(server, "server/discover")["result"],
        modern(server, "ping")["result"],
        modern(server, "tools/list")["result"],
        modern(server, "tools/call", {"name": "command", "arguments": {"program": "echo", "args": ["m3"]}})["result"],
        modern(server, "tools/call", {"name": "command", "arguments": {"program": "rm"}})["result"],
    ]
    for result in results:
        assert result["resultType"] == "complete", result
        assert result["_meta"][SERVER_INFO_KEY]["name"] == "lnk-link-run", result
    assert results[4]["isError"] is True
    conforms(spec_modern.CallToolResult, results[3])
    conforms(spec_modern.CallToolResult, results[4])


def test_M4_tools_list_carries_caching_and_does_not_vary(serve):
    first = serve()
    listing = modern(first, "tools/list")["result"]
    conforms(spec_modern.ListToolsResult, listing)
    assert isinstance(listing["ttlMs"], int) and listing["ttlMs"] >= 0
    assert listing["cacheScope"] in ("public", "private")
    assert "nextCursor" not in listing
    first.call("command", {"program": "echo"}, meta=envelope())
    assert modern(first, "tools/list")["result"] == listing
    # Nor with the connection, nor with a legacy session on the same process.
    second = serve()
    second.initialize("2024-11-05")
    assert modern(second, "tools/list")["result"] == listing


def test_M5_ping_in_the_envelope_is_answered_empty_and_complete(serve):
    server = serve()
    result = modern(server, "ping")["result"]
    assert {k: v for k, v in result.items() if k != "_meta"} == {"resultType": "complete"}


def test_M7_no_log_notification_even_when_the_client_asks_for_debug(serve):
    server = serve()
    meta = {"io.modelcontextprotocol/logLevel": "debug"}
    modern(server, "tools/list", **meta)
    modern(server, "tools/call", {"name": "command", "arguments": {"program": "rm"}}, **meta)
    modern(server, "tools/call", {"name": "command", "arguments": sh("echo out; echo err >&2")}, **meta)
    assert [m for m in messages(server) if m.get("method") == "notifications/message"] == []


def test_M8_subscriptions_listen_is_acknowledged_and_held_open_until_cancelled(serve):
    server = serve()
    server.send({"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen",
                 "params": {"notifications": {"toolsListChanged": True}, "_meta": envelope()}})
    ack = wait_for(lambda: [m for m in messages(server) if m.get("method") == "notifications/subscriptions/acknowledged"],
                   what="the acknowledgement")
    assert len(ack) == 1
    params = ack[0]["params"]
    assert same_id(params["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub-1")
    assert params["notifications"] == {}
    assert modern(server, "ping")["result"]["resultType"] == "complete"
    server.notify("notifications/cancelled", {"requestId": "sub-1", "_meta": envelope()})
    assert modern(server, "ping")["result"]["resultType"] == "complete"
    assert server.close() == 0
    server.kill()
    assert responses_to(server, "sub-1") == []


def test_M8_an_open_subscription_does_not_hold_the_server_at_eof(serve):
    server = serve()
    server.send({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
                 "params": {"notifications": {}, "_meta": envelope()}})
    wait_for(lambda: any(m.get("method") == "notifications/subscriptions/acknowledged" for m in messages(server)),
             what="the acknowledgement")
    closed = time.monotonic()
    assert server.close() == 0
    assert time.monotonic() - closed < EOF_GRACE + 0.5


def test_M9_modern_requests_are_served_before_and_after_a_legacy_initialize(serve):
    server = serve()
    assert modern(server, "tools/call", {"name": "command", "arguments": {"program": "echo"}})["result"]["resultType"]
    server.initialize("2025-06-18")
    assert "resultType" not in server.call("command", {"program": "echo"})
    assert modern(server, "tools/list")["result"]["resultType"] == "complete"
    assert "resultType" not in server.request("tools/list")["result"]


# -- T: tools/list -------------------------------------------------------------


def test_T1_tools_list_takes_no_params_or_empty_ones_and_has_no_next_cursor(legacy):
    def check(params):
        result = legacy.request("tools/list", params)["result"]
        assert set(result) == {"tools"}
        assert [tool["name"] for tool in result["tools"]] == ["command"]

    every([None, {}, {"_meta": {"progressToken": 1}}, {"_meta": {"link.local/thread": "t"}}], check)


def test_T2_a_cursor_the_server_did_not_issue_is_invalid_params(legacy):
    def check(cursor):
        assert error_of(legacy.request("tools/list", {"cursor": cursor}))["code"] == -32602

    every(["abc", "", "0", 0, None], check)


def test_T4_the_tool_objects_are_what_strict_clients_accept(legacy):
    for tool in legacy.request("tools/list")["result"]["tools"]:
        conforms(spec_legacy.Tool, tool)
        assert re.fullmatch(r"[A-Za-z0-9_.-]{1,50}", tool["name"])
        assert tool["description"] and tool["title"]
        schema = tool["inputSchema"]
        assert schema["type"] == "object" and isinstance(schema["properties"], dict)
        assert isinstance(schema.get("required", []), list)
        assert schema["required"] == ["program"]
        assert tool["outputSchema"]["type"] == "object"
        for each in (schema, tool["outputSchema"]):
            jsonschema.Draft202012Validator.check_schema(each)
            assert "strict" not in keys_of(each) and "$schema" not in each
        conforms(spec_legacy.ToolAnnotations, tool["annotations"])
        assert all(isinstance(value, bool) for key, value in tool["annotations"].items() if key != "title")
        assert nulls(tool) == []


def test_T4_the_input_schema_describes_the_command_arguments(legacy):
    (tool,) = legacy.request("tools/list")["result"]["tools"]
    properties = tool["inputSchema"]["properties"]
    assert set(properties) == {"program", "args", "input", "folder", "timeout"}
    assert properties["args"] == {**properties["args"], "type": "array", "items": {"type": "string"}}
    assert properties["timeout"]["type"] == "number"
    assert properties["timeout"]["maximum"] == 120  # --timeout 2m
    assert set(tool["outputSchema"]["required"]) == RUN_FIELDS


def test_T_a_server_with_no_program_offers_no_command(serve, files):
    argv = serve_argv(files, programs=())
    server = serve(argv=argv)
    result = server.initialize()
    assert "run nothing" in result["instructions"]
    assert server.request("tools/list")["result"]["tools"] == []
    assert error_of(server.request("tools/call", {"name": "command", "arguments": {}}))["code"] == -32602


# -- C: tools/call -------------------------------------------------------------


def test_C1_absent_arguments_are_taken_as_empty_and_refused_as_a_tool_error(legacy):
    response = legacy.request("tools/call", {"name": "command"})
    assert response["result"]["isError"] is True
    assert "program" in text_of(response["result"])


def test_C2_C3_a_successful_result_is_content_and_structured_content_and_nothing_null(legacy):
    result = legacy.call("command", {"program": "echo", "args": ["plain"]})
    assert set(result) == {"content", "structuredContent"}
    assert result["content"] == [{"type": "text", "text": result["content"][0]["text"]}]
    conforms(spec_legacy.CallToolResult, result)
    assert set(result["structuredContent"]) >= RUN_FIELDS
    first = text_of(result).split("\n")[0]
    assert ENDING.match(first) and ENDING.match(first).group(1) == "0"


@pytest.mark.parametrize("arguments, expect", [
    (sh("exit 7"), {"exit": 7, "signal": None, "timed_out": False}),
    (sh("kill -KILL $$"), {"exit": None, "signal": "SIGKILL", "timed_out": False}),
    (sh("sleep 5", timeout=0.3), {"timed_out": True, "signal": "SIGKILL"}),
    (sh("head -c 100000 /dev/zero; head -c 50 /dev/zero >&2"), {"output_bytes": 100000, "errors_bytes": 50}),
    (sh("printf '\\377\\376\\375'"), {"output_bytes": 3}),
    ({"program": "cat", "input": "fed through stdin ☃"}, {"output_bytes": len("fed through stdin ☃".encode())}),
    ({"program": "true", "folder": "work"}, {"exit": 0, "output_bytes": 0}),
], ids=["exit", "signal", "timeout", "big", "binary", "input", "folder"])
def test_C5_every_answer_fits_the_output_schema(legacy, output_schema, arguments, expect):
    result = legacy.call("command", arguments)
    assert "isError" not in result
    jsonschema.validate(result["structuredContent"], output_schema)
    assert {key: result["structuredContent"][key] for key in expect} == expect
    assert text_of(result).strip()


def test_C5_a_timeout_says_so_in_its_first_line(legacy):
    result = legacy.call("command", sh("sleep 5", timeout=1))
    assert text_of(result).startswith("killed by SIGKILL: timed out after 1s")


BAD_ARGUMENTS = [
    {},
    {"program": 5},
    {"program": ["sh"]},
    {"program": "echo", "args": "a b"},
    {"program": "echo", "args": [1, 2]},
    {"program": "echo", "args": ["a\0b"]},
    {"program": "echo", "input": 5},
    {"program": "echo", "folder": 1},
    {"program": "echo", "folder": "/tmp"},
    {"program": "echo", "folder": "../.."},
    {"program": "echo", "folder": "work/../.."},
    {"program": "echo", "folder": "missing"},
    {"program": "echo", "timeout": 0},
    {"program": "echo", "timeout": -1},
    {"program": "echo", "timeout": 121},
    {"program": "echo", "timeout": True},
    {"program": "echo", "timeout": "10"},
    {"program": "rm"},
    {"program": "../bin/echo"},
    {"program": "bin/echo"},
    {"program": "A=1"},
    {"program": "/bin/rm"},
    {"program": "no-such-program-anywhere"},
    {"program": ""},
]


def test_C6_input_that_fails_the_schema_or_the_rules_is_a_tool_error_not_a_protocol_error(legacy):
    def check(arguments):
        response = legacy.request("tools/call", {"name": "command", "arguments": arguments})
        assert "result" in response, response
        result = response["result"]
        assert result["isError"] is True
        assert "structuredContent" not in result
        assert text_of(result).strip()

    every(BAD_ARGUMENTS, check)


def test_C6_unknown_arguments_are_ignored_and_named_and_null_is_absent(legacy):
    arguments = {"program": "echo", "args": ["c6"], "colour": "red", "wait_for_previous": True,
                 "input": None, "folder": None, "timeout": None}
    result = legacy.call("command", arguments)
    assert "isError" not in result
    assert result["structuredContent"]["ignored"] == ["colour", "wait_for_previous"]
    assert result["structuredContent"]["output"] == "c6"
    assert text_of(result).splitlines()[-1].startswith("[ignored colour, wait_for_previous: ")


def test_C6_a_folder_with_a_link_on_its_path_is_refused(legacy, files, tmp_path):
    (files / "work" / "out").symlink_to(tmp_path)
    (files / "inside").mkdir()
    (files / "work" / "up").symlink_to(files / "inside")
    for folder in ("work/out", "work/up"):
        result = legacy.request("tools/call", {"name": "command",
                                               "arguments": {"program": "echo", "folder": folder}})["result"]
        assert result["isError"] is True, folder


def test_C6_an_unknown_tool_is_invalid_params_in_either_era(legacy):
    def check(name):
        assert error_of(legacy.request("tools/call", {"name": name, "arguments": {}}))["code"] == -32602
        assert error_of(modern(legacy, "tools/call", {"name": name, "arguments": {}}))["code"] == -32602

    every(["no_such_tool", "Command", "run__command", "", "start", "command "], check)


def test_C7_request_meta_with_custom_and_reserved_keys_is_accepted(legacy):
    meta = {
        "link.local/thread": "thread-1", "link.local/hops": 2, "progressToken": "c7",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "x=1",
        "baggage": "k=v", "io.modelcontextprotocol/related-task": {"taskId": "t"}, "example.com/odd": [None, 1.5],
    }
    result = legacy.call("command", {"program": "echo", "args": ["meta"]}, meta=meta)
    assert "meta" in text_of(result)
    result = legacy.call("command", {"program": "echo", "args": ["meta"]}, meta=envelope(**meta))
    assert result["resultType"] == "complete"


def test_C8_fields_the_server_does_not_know_in_params_are_ignored(legacy):
    params = {"name": "command", "arguments": {"program": "echo", "args": ["c8"]},
              "task": {"ttl": 60000}, "inputResponses": {}, "requestState": "opaque", "somethingNew": [1]}
    assert "c8" in text_of(legacy.request("tools/call", params)["result"])
    message = {"jsonrpc": "2.0", "id": "c8", "method": "tools/call", "params": {**params, "_meta": envelope()},
               "extra": True}
    legacy.send(message)
    assert "c8" in text_of(legacy.wait_response("c8")["result"])


# -- X: cancellation -----------------------------------------------------------


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_X1_a_cancelled_call_is_never_answered_its_group_dies_and_its_progress_stops(serve, files, era):
    server = serve()
    meta = {"progressToken": "x1"}
    if era == "legacy":
        server.initialize()
    else:
        meta = envelope(**meta)
    script = "sleep 30 & echo $$ $! > x1.tmp; mv x1.tmp x1.pid; while :; do echo tick; sleep 0.05; done"
    server.send({"jsonrpc": "2.0", "id": 41, "method": "tools/call",
                 "params": {"name": "command", "arguments": sh(script, folder="work"), "_meta": meta}})
    pids = wait_pid_file(files / "work" / "x1.pid")
    wait_for(lambda: progress_for(server, "x1"), what="progress before the cancel")
    cancel = {"requestId": 41, "reason": "user pressed stop"}
    if era == "modern":
        cancel["_meta"] = envelope()
    server.notify("notifications/cancelled", cancel)
    # The ping is read after the cancel: from its answer on, nothing more for call 41.
    server.request("ping", {"_meta": envelope()} if era == "modern" else None, request_id="mark")
    mark = next(i for i, m in enumerate(messages(server)) if m.get("id") == "mark")
    wait_gone(pids)
    after = server.call("command", sh("sleep 0.6; echo after"), meta=envelope() if era == "modern" else None)
    assert "after" in text_of(after)
    assert server.close() == 0
    server.kill()
    assert responses_to(server, 41) == []
    late = [m for m in messages(server)[mark:] if m.get("method") == "notifications/progress"
            and m["params"]["progressToken"] == "x1"]
    assert late == [], "progress after the cancel"


def test_X1_a_cancellation_matches_the_id_by_type_too(legacy):
    legacy.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                 "params": {"name": "command", "arguments": sh("sleep 0.5; echo kept")}})
    legacy.notify("notifications/cancelled", {"requestId": "7"})
    assert "kept" in text_of(legacy.wait_response(7)["result"])


def test_X2_unknown_or_malformed_cancellations_are_ignored_silently(legacy):
    legacy.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "command", "arguments": sh("sleep 0.5; echo untouched")}})

    def check(params):
        before = len(legacy.raw)
        legacy.notify("notifications/cancelled", params)
        assert legacy.request("ping", request_id="after")["result"] == {}
        assert len(legacy.raw) == before + 1

    every([{"requestId": 999}, {"requestId": "1"}, {}, {"requestId": None}, {"requestId": 1.0},
           {"requestId": True}, {"requestId": {"id": 1}}, {"requestId": [1]}, {"reason": "no id"},
           "not an object", None], check)
    assert "untouched" in text_of(legacy.wait_response(1)["result"])


def test_X3_a_cancellation_of_initialize_is_ignored(serve):
    server = serve()
    server.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    server.notify("notifications/cancelled", {"requestId": 1, "reason": "changed my mind"})
    assert server.wait_response(1)["result"]["protocolVersion"] == LEGACY
    server.notify("notifications/initialized")
    assert server.request("tools/list")["result"]["tools"]


def test_X4_a_cancellation_after_the_answer_is_harmless(legacy):
    result = legacy.call("command", {"program": "echo", "args": ["done"]}, request_id=77)
    assert "done" in text_of(result)
    before = len(legacy.raw)
    legacy.notify("notifications/cancelled", {"requestId": 77})
    assert "again" in text_of(legacy.call("command", {"program": "echo", "args": ["again"]}, request_id=77))
    assert len(legacy.raw) == before + 1


# -- P: progress ---------------------------------------------------------------

TICKING = sh("for i in 1 2 3; do echo tick $i; sleep 0.3; done")
TICKED = len("tick 1\ntick 2\ntick 3\n")


def test_P1_the_progress_token_is_echoed_exactly_with_its_type(legacy):
    tokens = ["tok-1", "7", 0, 7, -5, 2**40, "", 1.5]  # a number may be fractional
    for request_id, token in enumerate(tokens, start=500):
        legacy.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                     "params": {"name": "command", "arguments": TICKING, "_meta": {"progressToken": token}}})
    for request_id, token in enumerate(tokens, start=500):
        result = legacy.wait_response(request_id)["result"]
        notes = progress_for(legacy, token)
        assert len(notes) >= 2, (token, notes)
        assert all(same_id(note["progressToken"], token) for note in notes)
        assert notes[-1]["progress"] <= result["structuredContent"]["seconds"]  # the call's seconds so far
    # "7" and 7 were two tokens of two calls: each got its own, none got both.
    assert len([m for m in messages(legacy) if m.get("method") == "notifications/progress"]) == sum(
        len(progress_for(legacy, token)) for token in tokens)


def test_P1_no_progress_without_a_token_and_none_invented_for_a_bad_one(legacy):
    bad_tokens = [None, True, {"t": 1}, ["t"]]
    for request_id, token in enumerate(bad_tokens, start=600):
        meta = {} if token is None else {"_meta": {"progressToken": token}}
        legacy.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                     "params": {"name": "command", "arguments": TICKING, **meta}})
    for request_id in range(600, 600 + len(bad_tokens)):
        assert "tick 3" in text_of(legacy.wait_response(request_id)["result"])
    assert [m for m in messages(legacy) if m.get("method") == "notifications/progress"] == []


@pytest.mark.parametrize("version", LEGACY_VERSIONS + [MODERN])
def test_P2_progress_rises_and_has_only_the_fields_of_its_version(serve, version):
    server = serve()
    meta = {"progressToken": "p2"}
    if version == MODERN:
        meta = envelope(**meta)
    else:
        server.initialize(version)
    result = server.call("command", TICKING, meta=meta)
    notes = progress_for(server, "p2")
    assert len(notes) >= 2
    values = [note["progress"] for note in notes]
    assert values == sorted(set(values)), values
    for note in notes:
        conforms(spec_legacy.ProgressNotificationParams, note)
        assert isinstance(note["progress"], (int, float)) and not isinstance(note["progress"], bool)
        if "total" in note:
            assert note["total"] >= note["progress"]
        assert ("message" in note) == (version >= "2025-03-26"), note
    assert values[-1] <= float(text_of(result).split(" · ")[1].split()[0])  # its seconds so far
    for note in notes:  # and its message, the bytes so far
        assert "message" not in note or int(note["message"].removesuffix(" bytes of output so far")) <= TICKED, note
    assert "tick 3" in text_of(result)


def test_P3_no_progress_comes_after_the_answer(legacy):
    request_id = 300
    legacy.call("command", sh("for i in $(seq 40); do echo $i; sleep 0.02; done"),
                meta={"progressToken": "p3"}, request_id=request_id)
    assert legacy.close() == 0
    legacy.kill()
    everything = messages(legacy)
    answered = next(i for i, m in enumerate(everything) if "method" not in m and same_id(m.get("id"), request_id))
    after = [m for m in everything[answered:] if m.get("method") == "notifications/progress"]
    assert progress_for(legacy, "p3")
    assert after == []


def test_P4_progress_is_rate_limited_under_a_flood(legacy):
    flood = {"program": "python3", "args": ["-c", (
        "import sys, time\nend = time.monotonic() + 1.5\n"
        "while time.monotonic() < end:\n    sys.stdout.write('x' * 512); sys.stdout.flush()\n")]}
    started = time.monotonic()
    result = legacy.call("command", flood, meta={"progressToken": "p4"})
    elapsed = time.monotonic() - started
    notes = progress_for(legacy, "p4")
    assert result["structuredContent"]["output_bytes"] > 100_000
    assert 2 <= len(notes) <= elapsed * 10 + 2, (len(notes), elapsed)


# -- I: instructions and serverInfo ----------------------------------------------


def test_I1_I2_instructions_and_server_info_are_the_same_in_both_eras(serve):
    server = serve()
    discovered = modern(server, "server/discover")["result"]
    initialized = server.initialize()
    assert initialized["instructions"] == discovered["instructions"]
    for program in ("sh", "cat", "python3"):
        assert program in initialized["instructions"]
    assert "2m" in initialized["instructions"]
    modern_info = discovered["_meta"][SERVER_INFO_KEY]
    assert modern_info["name"] == initialized["serverInfo"]["name"] == "lnk-link-run"
    assert modern_info["version"] == initialized["serverInfo"]["version"]
    conforms(spec_modern.Implementation, modern_info)
