"""The record's format across versions: a record an older serve wrote still
reads, lists and reads its output, and a key this version does not know (a
newer serve's) is kept when this version writes the record again."""

from __future__ import annotations

import ast
import os
import subprocess
import time
import typing
from pathlib import Path

import orjson
from background_helpers import background_argv, payload
from conftest import SERVER, text_of

from linkrun.messages import wayin
from linkrun.state import layout, records

FIXTURE = Path(__file__).parent / "data" / "record-v1.json"
ID = "nnfy7ok7joavl2do"  # the fixture's
THREAD = {"link.local/thread": "t1"}  # the fixture's conversation


def plant(state: Path, files: Path, changes: dict) -> dict:
    """The fixture, of this files folder, in the state folder with its lock (held by no supervisor)."""
    record = orjson.loads(FIXTURE.read_bytes()) | {"files": str(files)} | changes
    state.mkdir(exist_ok=True)
    (state / f"{ID}{layout.RECORD}").write_bytes(orjson.dumps(record))
    (state / f"{ID}{layout.LOCK}").touch()
    return record


def typed(module: object) -> dict[str, object]:
    """What a module declares under its `if TYPE_CHECKING:` (the type checker's alone), run for a test."""
    tree = ast.parse(Path(module.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    namespace: dict[str, object] = {}
    exec(compile(ast.Module(block.body, []), module.__file__, "exec"), namespace)
    return namespace


def constants(names: type) -> set[str]:
    return {value for key, value in vars(names).items() if key.isupper()}


def test_each_state_told_value_and_delivery_outcome_is_named_once_with_its_constant():
    # mypy checks each constant against its Literal (through the tuples); this, that each name has its constant.
    declared = typed(records)
    states, told = set(typing.get_args(declared["StateName"])), set(typing.get_args(declared["ToldName"]))
    assert states == constants(records.State) == set(records.RUNNING_STATES + records.ENDED_STATES)
    assert told == constants(records.Told) == set(records.TO_TELL + records.SETTLED)
    assert set(typing.get_args(typed(wayin)["OutcomeName"])) == constants(wayin.DeliveryOutcome)


def test_what_a_load_checks_is_what_the_record_type_declares():
    record = typed(records)["Record"]
    assert set(records._REQUIRED) <= record.__required_keys__
    assert set(records._OPTIONAL) <= record.__required_keys__ | record.__optional_keys__
    fields = set(records.new_record("a" * 16, argv=[], write=[], proxy=None, seccomp=None, files="/", folder="",
                                    program="true", args=[], program_argv=[], timeout=1, output=1,
                                    background_output=1, keep=1, way_in=None, agent=None, keyring=None, thread="t",
                                    hops=0, limits=None))
    assert fields <= record.__required_keys__ | record.__optional_keys__


def test_the_fixture_lacks_the_fields_added_since_so_it_stands_for_an_older_record():
    fixture = orjson.loads(FIXTURE.read_bytes())
    assert not {"seccomp", "init_pid", "limits", "cgroup", "tell_on", "dropped", "lines_sent"} & set(fixture)


def test_an_older_record_lists_and_reads_through_serve(servers, files, state):
    output = files / layout.BACKGROUND / layout.output_name(ID)
    output.parent.mkdir()
    output.write_bytes(b"line 1\nend\n")
    plant(state, files, {"ended": time.time(), "inode": os.stat(output).st_ino, "bytes": 11})
    server = servers(background_argv(files, state))
    server.initialize()

    listed = server.call("list", {}, meta=THREAD)
    assert "isError" not in listed, text_of(listed)
    [entry] = listed["structuredContent"]["commands"]
    assert (entry["id"], entry["state"], entry["exit"], entry["bytes"]) == (ID, "exited", 0, 11)

    result = server.call("read", {"id": ID}, meta=THREAD)
    assert "isError" not in result, text_of(result)
    assert payload(result["structuredContent"], text_of(result)) == b"line 1\nend\n"


def test_a_sweep_rewriting_a_record_keeps_the_keys_it_does_not_know(files, state):
    newer = {"from_a_newer_serve": {"kept": [1, "two", None]}, "another": 7}
    plant(state, files, {"state": "running", "ended": None, "exit": None, **newer})

    done = subprocess.run(SERVER + ["sweep", str(state)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr

    written = orjson.loads((state / f"{ID}{layout.RECORD}").read_bytes())
    assert written["state"] == "lost", written  # rewritten: its supervisor is gone
    assert {key: written.get(key) for key in newer} == newer
    assert records.load(str(state), ID) == written
