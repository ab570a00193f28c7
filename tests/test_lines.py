"""`read` finds lines (`lines`, `pattern`) in a call's kept output and in a
background command's output alike: real servers, real programs, real
supervisors (a pass-through sandbox), and `up` as root and as a user."""

from __future__ import annotations

import time

import pytest
from background_helpers import META, OTHER, background_argv, start, wait_ended
from conftest import text_of
from kept_helpers import NUMBERS, keep_argv

from linkrun.messages.told import shown_word

KEEP = ("--keep-output", "16M", "--keep-for", "1d", "--keep-total", "256M")


@pytest.fixture
def both(servers, files, state):
    """A serve with kept output and background commands."""
    server = servers(background_argv(files, state, extra=KEEP))
    server.initialize()
    return server


def find(server, item_id: str, meta: dict = META, **arguments: object) -> tuple[dict, str]:
    result = server.call("read", {"id": item_id, **arguments}, meta=meta)
    assert "isError" not in result, text_of(result)
    return result["structuredContent"], text_of(result)


def kept_numbers(server) -> str:
    return server.call("command", {"program": "python3", "args": NUMBERS}, meta=META)["structuredContent"]["output_id"]


def background_numbers(server, state) -> str:
    command_id = start(server, program="python3", args=NUMBERS)
    wait_ended(state, command_id)
    return command_id


@pytest.mark.parametrize("kind", ["kept", "background"])
def test_a_range_of_lines_with_their_numbers_and_offsets(both, state, kind):
    item = kept_numbers(both) if kind == "kept" else background_numbers(both, state)
    value, text = find(both, item, lines="120-180")
    assert [(line["line"], line["offset"], line["text"]) for line in value["lines"][:2]] == [
        (120, 119 * 7, "000119"), (121, 120 * 7, "000120")]
    assert (len(value["lines"]), value["more"]) == (50, 11)  # a screenful, and the count of the rest
    assert text.splitlines()[1] == "120 @833: 000119"
    assert "50 shown, 11 more" in text.splitlines()[0] and f"offset={value['next']}" in text.splitlines()[0]
    # The next page from where the first stopped.
    value, _ = find(both, item, lines="120-180", offset=value["next"])
    assert [line["line"] for line in value["lines"]] == list(range(170, 181))
    assert value["more"] == 0


@pytest.mark.parametrize("kind", ["kept", "background"])
def test_the_last_lines_and_a_pattern(both, state, kind):
    item = kept_numbers(both) if kind == "kept" else background_numbers(both, state)
    value, _ = find(both, item, lines="-3")
    assert [(line["line"], line["text"]) for line in value["lines"]] == [
        (299998, "299997"), (299999, "299998"), (300000, "299999")]
    value, text = find(both, item, pattern="^1234[0-4]7$")
    assert [(line["line"], line["offset"], line["text"]) for line in value["lines"]] == [
        (n + 1, n * 7, f"{n:06d}") for n in (123407, 123417, 123427, 123437, 123447)]
    assert value["more"] == 0
    value, _ = find(both, item, pattern="99$", lines="1-1000")
    assert [line["line"] for line in value["lines"]] == [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]


def test_a_pattern_that_would_backtrack_for_ever_answers_at_once(both):
    # 30000 a's and no b: Python's re takes exponential time on (a+)+b here.
    script = "print('a' * 30000); print('x' * 20000)"
    kept_id = both.call("command", {"program": "python3", "args": ["-c", script]}, meta=META)["structuredContent"]["output_id"]
    started = time.monotonic()
    value, text = find(both, kept_id, pattern="(a+)+b")
    assert time.monotonic() - started < 2
    assert value["lines"] == [] and "none found" in text
    value, _ = find(both, kept_id, pattern="^(a|aa)+$")
    assert [(line["line"], line["bytes"], len(line["text"])) for line in value["lines"]] == [(1, 30000, 512)]


@pytest.mark.parametrize("pattern,why", [("(a)\\1", "invalid escape sequence"), ("(?=a)b", "invalid perl operator"),
                                         ("[", "missing ]"), ("a{2000}", "invalid repetition size")])
def test_a_pattern_it_cannot_take_is_refused_saying_why(both, pattern, why):
    kept_id = kept_numbers(both)
    answer = both.call("read", {"id": kept_id, "pattern": pattern}, meta=META)
    assert answer.get("isError") is True
    assert f"pattern {shown_word(pattern)} cannot be taken: {why}" in text_of(answer)
    assert "RE2 syntax" in text_of(answer)


@pytest.mark.parametrize("lines", ["0-5", "9-3", "1-2-3", "x", "-0", ""])
def test_a_range_it_cannot_read_is_refused(both, lines):
    answer = both.call("read", {"id": kept_numbers(both), "lines": lines}, meta=META)
    assert answer.get("isError") is True and "lines" in text_of(answer)


def test_a_match_in_a_dropped_part_is_reported_as_dropped(servers, files, state):
    server = servers(background_argv(files, state, output="16K", extra=("--keep-output", "64K", "--keep-for", "1d",
                                                                        "--keep-total", "256M")))
    server.initialize()
    script = "print('NEEDLE at the start'); [print(f'{i:06d}') for i in range(40000)]; print('NEEDLE at the end')"
    command_id = start(server, program="python3", args=["-c", script])
    wait_ended(state, command_id)
    kept_id = server.call("command", {"program": "python3", "args": ["-c", script]}, meta=META)["structuredContent"]["output_id"]
    for item in (command_id, kept_id):  # the background output rotated; the call's ring wrapped
        value, text = find(server, item, pattern="NEEDLE")
        assert [line["text"] for line in value["lines"]] == ["NEEDLE at the end"]
        assert value["kept_from"] > 0
        assert f"bytes 0–{value['kept_from']} were dropped" in text.splitlines()[0]
        assert "not searched" in text.splitlines()[0]


def test_another_conversations_output_is_unknown_to_a_search(both, state):
    for item, unknown in ((kept_numbers(both), "no kept output of this conversation's"),
                          (background_numbers(both, state), "no command of this conversation's")):
        answer = both.call("read", {"id": item, "pattern": "1"}, meta=OTHER)
        assert answer.get("isError") is True
        assert unknown in text_of(answer)
        missing = both.call("read", {"pattern": "1"})
        assert text_of(missing).endswith("or the one a command's answer named for its output")


def test_lines_of_kept_output_without_background_commands(servers, files, state):
    server = servers(keep_argv(files, state))
    server.initialize()
    value, _ = find(server, kept_numbers(server), lines="2")
    assert [(line["line"], line["offset"], line["text"]) for line in value["lines"]] == [(2, 7, "000001")]


def test_under_up_a_pattern_is_found_as_root_and_as_a_user(up_as):
    from up_harness import META as UP_META

    kept_id = up_as.command("python3", *NUMBERS)["structuredContent"]["output_id"]
    result = up_as.server.call("read", {"id": kept_id, "pattern": "^29999[0-9]$"}, meta=UP_META)
    assert "isError" not in result, text_of(result)
    assert [line["line"] for line in result["structuredContent"]["lines"]] == list(range(299991, 300001))


def test_fed_in_pieces_split_anywhere_the_scanner_finds_the_same_lines():
    """What a watch of a running command's new bytes will feed it: writes that split lines and matches."""
    from linkrun.detached.lines import Scanner, compile_pattern

    data = b"".join(b"line %d: %s\n" % (i, b"listening on :80" if i % 7 == 3 else b"busy") for i in range(500))
    data += b"last line without end listening on"
    pattern = compile_pattern("listening on")

    def lines(pieces: list[bytes]) -> list[tuple[int, int, bytes]]:
        scanner = Scanner(pattern, 1, None, 1, 1000)
        found = [line for piece in pieces for line in scanner.feed(piece)]
        found += scanner.feed(b"", final=True)
        return [(line.number, line.offset, line.data) for line in found]

    whole = lines([data])
    assert len(whole) == 72 and whole[0] == (4, 1000 + data.index(b"line 3:"), b"line 3: listening on :80")
    assert whole[-1] == (501, 1000 + data.index(b"last line"), b"last line without end listening on")
    for size in (1, 2, 3, 5, 11, 64, 4096):
        assert lines([data[at:at + size] for at in range(0, len(data), size)]) == whole


def test_a_pattern_that_matches_empty_counts_each_line_once(both):
    script = "print('x\\n' * 20000, end='')"  # 20000 lines, each "x"
    kept_id = both.call("command", {"program": "python3", "args": ["-c", script]}, meta=META)["structuredContent"]["output_id"]
    value, _ = find(both, kept_id, pattern="y*")
    assert len(value["lines"]) + value["more"] == 20000
    value, _ = find(both, kept_id, pattern="^$")
    assert value["lines"] == [] and value["more"] == 0


def test_a_pattern_is_shown_as_it_was_given_and_the_last_line_as_one(both):
    # A new user's trial: '^12345\d$' was shown '^12345\\d$', as if escaped twice; "the last 1 lines".
    kept_id = kept_numbers(both)
    _, text = find(both, kept_id, pattern=r"^01234\d$")
    assert text.splitlines()[0].endswith(r"lines matching '^01234\d$' · 10 shown"), text.splitlines()[0]
    refused = both.call("read", {"id": kept_id, "pattern": r"(1)\1"}, meta=META)
    assert r"pattern '(1)\1' cannot be taken" in text_of(refused), text_of(refused)
    _, last = find(both, kept_id, lines="-1")
    assert "the last line" in last.splitlines()[0], last.splitlines()[0]
