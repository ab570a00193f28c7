"""A call's output kept past its answer: real servers, real programs (a
pass-through sandbox), the kept files in a real state folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from background_helpers import META, OTHER, background_argv, payload
from conftest import serve_argv, text_of
from kept_helpers import NUMBERS, keep_argv, numbers

def kept_files(state: Path) -> list[str]:
    folder = state / "kept"
    return sorted(os.listdir(folder)) if folder.exists() else []


@pytest.fixture
def keep(servers, files, state):
    server = servers(keep_argv(files, state))
    server.initialize()
    return server


def read_kept(server, kept_id: str, meta: dict = META, **arguments: object) -> tuple[dict, str]:
    result = server.call("read", {"id": kept_id, **arguments}, meta=meta)
    assert "isError" not in result, text_of(result)
    return result["structuredContent"], text_of(result)


def read_whole(server, kept_id: str, meta: dict = META) -> bytes:
    data, offset = b"", 0
    while True:
        value, text = read_kept(server, kept_id, meta, offset=offset)
        data += payload(value, text)
        if value["next"] == value["total"]:
            return data
        offset = value["next"]


def test_a_cut_stream_is_kept_whole_and_read_by_the_id_its_answer_gives(keep, state):
    result = keep.call("command", {"program": "python3", "args": NUMBERS}, meta=META)
    value = result["structuredContent"]
    kept_id = value["output_id"]
    assert "errors_id" not in value  # nothing was cut there
    # A fourth new user's trial: how long it is kept was said nowhere but in a refusal once it was gone.
    assert f"bytes left out: read id={kept_id} has the whole stream for 1d …]" in text_of(result)
    assert f"read id={kept_id}" in value["output"]  # structured-first clients see it too
    # The answer's head and tail are as without keeping (the tail read back from where it was kept).
    head, tail = value["output"].split(" …]\n")[0], value["output"].split(" …]\n")[1]
    last = numbers(300000)[-8192:].decode()
    whole_lines = last[last.index("\n") + 1:]  # a tail that begins mid-line begins at its first whole line
    assert head.startswith(numbers(8192 // 7).decode()) and tail == whole_lines.removesuffix("\n")
    assert read_whole(keep, kept_id) == numbers(300000)
    assert kept_files(state) == sorted([f"{kept_id}.json", f"{kept_id}.out"])


def test_a_stream_that_fits_in_the_answer_keeps_nothing(keep, state):
    result = keep.call("command", {"program": "sh", "args": ["-c", "echo short; echo also >&2"]}, meta=META)
    assert "output_id" not in result["structuredContent"]
    assert "left out" not in text_of(result)
    assert kept_files(state) == []


def test_both_streams_are_kept_each_by_its_own_id(keep):
    script = "import sys\nfor i in range(20000):\n    print(f'o{i:05d}')\n    print(f'e{i:05d}', file=sys.stderr)"
    value = keep.call("command", {"program": "python3", "args": ["-c", script]}, meta=META)["structuredContent"]
    output = read_whole(keep, value["output_id"])
    errors = read_whole(keep, value["errors_id"])
    assert value["errors"].endswith("e19998\ne19999") and value["output"].endswith("o19998\no19999")
    assert output == b"".join(b"o%05d\n" % i for i in range(20000))
    assert errors == b"".join(b"e%05d\n" % i for i in range(20000))


def test_another_conversations_kept_output_is_an_unknown_id(keep):
    kept_id = keep.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
    for meta in (OTHER, {}):  # another thread; a plain client's default conversation
        answer = keep.call("read", {"id": kept_id}, meta=meta)
        assert answer.get("isError") is True
        assert text_of(answer) == (f"Refused: no kept output of this conversation's has id '{kept_id}'; give the "
                                   "id that one of its command answers named, within 1d of that call")
    # Of a plain client (no thread named): its own default conversation reads its own.
    mine = keep.call("command", {"program": "python3", "args": NUMBERS})["structuredContent"]["output_id"]
    assert read_kept(keep, mine, {})[0]["total"] == 2100000
    assert keep.call("read", {"id": mine}, meta=META).get("isError") is True


def test_without_background_commands_a_missing_or_unknown_id_points_to_a_commands_answer(keep):
    missing = keep.call("read", {})
    assert missing["isError"] is True
    assert text_of(missing) == "Refused: id is missing; give the id that a command's answer named for its output"
    unknown = keep.call("read", {"id": "zzz"})
    assert "list" not in text_of(unknown) and "no kept output of this conversation's has id 'zzz'" in text_of(unknown)


def test_past_its_cap_the_last_bytes_are_kept_and_the_dropped_ones_counted(servers, files, state):
    server = servers(keep_argv(files, state, output="1M"))
    server.initialize()
    result = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)
    kept_id = result["structuredContent"]["output_id"]
    assert f"read id={kept_id} has the stream's last 1M" in text_of(result)
    value, text = read_kept(server, kept_id, offset=0)
    dropped = 2100000 - 1024 * 1024
    assert (value["kept_from"], value["total"], value["offset"]) == (dropped, 2100000, dropped)
    assert f"bytes 0–{dropped} dropped (only the last {1024 * 1024} bytes are kept)" in text.splitlines()[0]
    assert read_whole(server, kept_id) == numbers(300000)[dropped:]
    assert os.path.getsize(state / "kept" / f"{kept_id}.out") == 1024 * 1024


def test_the_oldest_kept_output_goes_first_past_the_agents_total(servers, files, state):
    server = servers(keep_argv(files, state, output="1M", total="3M"))
    server.initialize()
    ids = [server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
           for _ in range(4)]
    kept = {name.split(".")[0] for name in kept_files(state)}
    assert kept == set(ids[1:])  # 4 × 1M past a total of 3M: the first went
    assert server.call("read", {"id": ids[0]}, meta=META).get("isError") is True
    assert read_kept(server, ids[3])[0]["total"] == 2100000


def test_kept_output_expires_after_its_time(servers, files, state):
    server = servers(keep_argv(files, state, keep_for="2s"))
    server.initialize()
    kept_id = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
    assert read_kept(server, kept_id)[0]["total"] == 2100000
    about = state / "kept" / f"{kept_id}.json"
    # Its time is the one its record holds: moved two seconds back rather than waited for.
    import orjson

    value = orjson.loads(about.read_bytes())
    value["at"] -= 2
    about.write_bytes(orjson.dumps(value))
    answer = server.call("read", {"id": kept_id}, meta=META)
    assert answer.get("isError") is True
    assert kept_files(state) == []  # removed by the read that found it expired
    # And the next call that keeps something removes every expired one.
    first = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
    value = orjson.loads((state / "kept" / f"{first}.json").read_bytes())
    value["at"] = time.time() - 3
    (state / "kept" / f"{first}.json").write_bytes(orjson.dumps(value))
    second = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
    assert {name.split(".")[0] for name in kept_files(state)} == {second}


def test_a_cancelled_call_keeps_nothing(keep, state):
    keep.send({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {
        "name": "command", "arguments": {"program": "sh", "args": ["-c", "yes | head -c 100000; echo done >&2; sleep 60"]},
        "_meta": META}})
    from conftest import wait_for

    wait_for(lambda: any(name.endswith(".out") for name in kept_files(state)), what="the call's kept file")
    keep.notify("notifications/cancelled", {"requestId": 77})
    wait_for(lambda: kept_files(state) == [], what="the cancelled call's file to go")


def test_read_is_offered_for_kept_output_without_background_commands(keep):
    tools = {tool["name"]: tool for tool in keep.request("tools/list")["result"]["tools"]}
    assert set(tools) == {"command", "read"}
    assert "kept output" in tools["read"]["description"]
    assert tools["command"]["outputSchema"]["properties"]["output_id"]["type"] == "string"


def test_with_background_commands_read_reads_both(servers, files, state):
    server = servers(background_argv(files, state, extra=("--keep-output", "16M", "--keep-for", "1d",
                                                          "--keep-total", "256M")))
    server.initialize()
    kept_id = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
    assert read_whole(server, kept_id) == numbers(300000)
    value, _ = read_kept(server, kept_id, wait=5)  # ended: a wait returns at once
    assert value["state"] == "kept"


def test_a_client_that_reads_resources_gets_a_link_and_reads_it(keep):
    result = keep.call("command", {"program": "python3", "args": NUMBERS}, meta=META)
    kept_id = result["structuredContent"]["output_id"]
    links = [block for block in result["content"] if block["type"] == "resource_link"]
    assert [link["uri"] for link in links] == [f"linkrun://kept/{kept_id}"]
    contents = keep.request("resources/read", {"uri": links[0]["uri"], "_meta": META})["result"]["contents"]
    assert contents[0]["text"].encode() == numbers(300000)
    unknown = keep.request("resources/read", {"uri": links[0]["uri"], "_meta": OTHER})
    assert unknown["error"]["code"] == -32002
    assert unknown["error"]["message"].endswith("(read it with the _meta of the call that linked it, its "
                                                "conversation's)"), unknown


def test_resources_are_declared_only_with_kept_output(servers, files, state):
    server = servers(keep_argv(files, state))
    assert server.initialize()["capabilities"]["resources"] == {}
    plain = servers(serve_argv(files))
    assert "resources" not in plain.initialize()["capabilities"]
    refused = plain.request("resources/read", {"uri": "linkrun://kept/x"})["error"]
    assert refused["code"] == -32601 and refused["message"].endswith("this server offers tools only"), refused
    # A third new user's trial: an unknown method was answered "tools only" where resources are served too.
    unknown = server.request("no/such", {})["error"]
    assert unknown["message"] == "unknown method 'no/such'; this server offers tools, and the resources of its kept output"


def test_no_resource_link_for_a_client_before_2025_06_18(servers, files, state):
    server = servers(keep_argv(files, state))
    server.initialize(version="2025-03-26")
    result = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)
    assert [block["type"] for block in result["content"]] == ["text"]
    assert "read id=" in text_of(result)


def test_under_up_the_kept_output_is_the_users_and_out_of_every_sandboxs_reach(up_as):
    """Real bubblewrap, as root and as an ordinary user: kept in State/kept, 0700 and the user's, never
    visible inside a call, and read back whole."""
    from up_harness import META as UP_META

    result = up_as.command("python3", *NUMBERS)
    kept_id = result["structuredContent"]["output_id"]
    folder = up_as.state / "kept"
    info = os.stat(folder)
    assert oct(info.st_mode & 0o777) == "0o700"
    assert info.st_uid == os.stat(up_as.state).st_uid  # the user's own, as the state folder
    assert oct(os.stat(folder / f"{kept_id}.out").st_mode & 0o777) == "0o600"
    inside = up_as.python("import os, sys\nfor p in sys.argv[1:]:\n    print(p, os.path.exists(p))",
                          str(folder), str(folder / f"{kept_id}.out"))
    assert f"{folder} False" in inside and f"{kept_id}.out False" in inside
    assert read_whole(up_as.server, kept_id, UP_META) == numbers(300000)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_python_sdk_follows_the_link_with_resources_read(files, state, mode):
    """The official Python SDK, in both eras: the link in the content, its structured value checked against
    the output schema by the SDK itself, and resources/read of the link."""
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp_types import Implementation

    argv = keep_argv(files, state)

    async def main() -> tuple[str, str, str]:
        params = StdioServerParameters(command=argv[0], args=argv[1:])
        async with Client(params, mode=mode, client_info=Implementation(name="linkrun-test-py", version="0")) as client:
            result = await client.call_tool("command", {"program": "python3", "args": NUMBERS}, meta=META)
            links = [block for block in result.content if block.type == "resource_link"]
            read = await client.read_resource(str(links[0].uri), meta=META)
            return result.structured_content["output_id"], str(links[0].uri), read.contents[0].text

    kept_id, uri, text = anyio.run(main)
    assert uri == f"linkrun://kept/{kept_id}"
    assert text.encode() == numbers(300000)


def test_with_a_way_in_a_call_without_a_conversation_keeps_nothing(servers, files, state, tmp_path):
    server = servers(keep_argv(files, state, "--way-in", "http://127.0.0.1:9/in", "--as", "agent", "--keyring",
                               str(tmp_path), "--background", "4", "--background-timeout", "1h",
                               "--background-output", "16M", "--background-keep", "1d", "--background-per-day", "100",
                               "--hops", "4"))
    server.initialize()
    result = server.call("command", {"program": "python3", "args": NUMBERS})
    assert "output_id" not in result["structuredContent"]
    assert "bytes left out …]" in text_of(result)  # the plain cut: no conversation could read it
    # A fourth new user's trial: nothing said that nothing was kept, where README says nothing printed is lost.
    said = "[nothing of what was left out is kept: this call named no conversation (_meta link.local/thread)"
    assert said in text_of(result) and any(said in note for note in result["structuredContent"]["notes"]), result
    assert kept_files(state) == []
    kept = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)
    assert "output_id" in kept["structuredContent"] and said not in text_of(kept)


def test_a_disk_that_refuses_the_kept_output_never_fails_the_call(servers, files, state):
    """serve with a file size limit of 1 MiB (EFBIG past it; Python ignores SIGXFSZ): the ring fails
    half-way, the call answers as without keeping, and nothing half-kept stays."""
    server = servers(["prlimit", f"--fsize={1024 * 1024}", "--"] + keep_argv(files, state))
    server.initialize()
    result = server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)
    value = result["structuredContent"]
    assert "output_id" not in value
    assert (value["exit"], value["output_bytes"]) == (0, 2100000)
    assert value["output"].endswith("299999") and "bytes left out …]" in value["output"]
    assert kept_files(state) == []
    assert server.close() == 0
    server.kill()
    assert b"a call's output is not kept past its answer: [Errno 27] File too large" in server.stderr


def test_a_total_that_cannot_hold_one_calls_two_streams_is_refused_at_start(files, state):
    import subprocess

    done = subprocess.run(keep_argv(files, state, output="16M", total="16M"), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    assert done.returncode == 2
    assert "--keep-total 16M cannot hold one call's two streams of --keep-output 16M" in done.stderr


def test_kept_output_outlives_its_serve_and_is_read_by_the_next(servers, files, state):
    first = servers(keep_argv(files, state))
    first.initialize()
    kept_id = first.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
    assert first.close() == 0
    second = servers(keep_argv(files, state))
    second.initialize()
    assert read_whole(second, kept_id) == numbers(300000)
    assert second.call("read", {"id": kept_id}, meta=OTHER).get("isError") is True


def test_without_background_commands_a_commands_id_says_they_are_off_and_how_to_turn_them_on(keep):
    # A new user's trial: a read of a background command's id, where none run, was answered as a kept one's.
    answer = keep.call("read", {"id": "abcdefghijklmnop"})
    assert answer["isError"] is True
    assert text_of(answer).startswith("Refused: 'abcdefghijklmnop' is a background command's id, and this serve "
                                      "runs none (a kept output's id ends in -output or -errors); background "
                                      "commands are off: "), text_of(answer)
    assert "up --no-way-in" in text_of(answer)
    lines = keep.call("read", {"id": "abcdefghijklmnop", "pattern": "x"})
    assert lines["isError"] is True and text_of(lines) == text_of(answer)


def test_a_read_without_offset_gives_its_last_bytes_from_a_line_start(keep, state):
    # A new user's trial: the last bytes of seq 1 300000 began "70", the end of 97270.
    kept_id = keep.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]
    value, _ = read_kept(keep, kept_id)
    assert value["offset"] % 7 == 0 and value["next"] == 2100000 and 16384 - 7 < len(value["text"]) <= 16384, value
    assert value["text"] == numbers(len(value["text"]) // 7, value["offset"] // 7).decode()


def test_the_instructions_say_how_long_a_cut_stream_is_kept(servers, files, state):
    # A fourth new user's trial: "kept a while", where the answer's id is read for --keep-for alone.
    instructions = servers(keep_argv(files, state, keep_for="2h")).initialize()["instructions"]
    assert "where a stream was cut, its whole (its last 16M) is kept for 2h, and read reads it" in instructions
