"""The command tool's part of the tool layer: its answer. A call's outcome
becomes the text the agent reads and the structured value programs read;
and the per-call limits in words, for the answer, the instructions and
serve's log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import Serve
from ..state.records import killed_by_limit
from ..units import cores, describe_size, format_duration, killed_by_note, signal_name

if TYPE_CHECKING:  # the runner's types only: the instructions (offer.py) use this module before serve loads the runner
    from ..processes.capture import Capture
    from ..processes.runner import Outcome
    from .kept import KeptStreams
    from ..calls.setup import Holding

PER_CALL, PER_PROCESS, NOT_HELD = "per call", "per process", "no"  # as fallback.py says them
LIMITS_SCHEMA = {
    "type": "object",
    "description": ('Each per-call limit set, with how it holds on this machine: {"memory": {"at_most": bytes, '
                    '"holds": "per call" | "per process" | "no"}, "tasks": {...processes and threads}, "cpu": '
                    '{...percent of one core}}. "per process": no cgroup here, an rlimit holds it for each process '
                    'alone.'),
    "additionalProperties": {
        "type": "object",
        "properties": {"at_most": {"type": "integer"}, "holds": {"type": "string", "enum": [PER_CALL, PER_PROCESS, NOT_HELD]}},
        "required": ["at_most", "holds"],
    },
}


def command_text(outcome: Outcome, timeout: float, settings: Serve, can_start: bool,
                 held: Holding | None = None, kept: KeptStreams | None = None) -> tuple[str, list[str]]:
    """How the call ended, the limit that bit, what it printed, and a refused
    write explained; and serve's notes among those lines (the limit, the
    write), for the structured value too. `kept`: the id of each stream kept
    past the answer."""
    lines = [_ending(outcome, timeout, can_start, settings.timeout)]
    notes = []
    if outcome.limit is not None:
        notes.append(limit_text(outcome.limit, held, settings.sandbox))
        lines.append(notes[-1])
    lines += _stream_text("output", outcome.output, kept)
    lines += _stream_text("errors", outcome.errors, kept)
    if settings.write and _refused_write(outcome):
        writable = " and ".join(f"{w}/" for w in settings.write)
        notes.append(f"[the sandbox refused a write: only {writable} of the files folder "
                     f"{'is' if len(settings.write) == 1 else 'are'} writable; chats/ and background/ never]")
        lines.append(notes[-1])
    return "\n".join(lines), notes


def git_note(notes: list[str]) -> str:
    """What the git check set aside after the call (gitcheck.py), for the agent to know; "" when nothing."""
    if not notes:
        return ""
    return ("[the user's git would have run what this call wrote into a repository; set aside: "
            + "; ".join(notes) + "]")


def command_structured(outcome: Outcome, held: Holding | None = None,
                       kept: KeptStreams | None = None) -> dict[str, object]:
    """The answer's structured value, as the command tool's outputSchema says (`limits` only with limits,
    `output_id` and `errors_id` only for a stream kept past the answer)."""
    ids = kept.ids if kept is not None else {}
    value: dict[str, object] = {
        "exit": outcome.exit,
        "signal": signal_name(outcome.signal) if outcome.signal is not None else None,
        "timed_out": outcome.timed_out,
        "output_bytes": outcome.output.total,
        "errors_bytes": outcome.errors.total,
        "seconds": outcome.seconds,
        "output": _shown(outcome.output, "output", kept),
        "errors": _shown(outcome.errors, "errors", kept),
        "limit": outcome.limit,
    }
    for stream, kept_id in ids.items():
        value[f"{stream}_id"] = kept_id
    if held is not None:  # with limits: each one, and how it holds here
        value["limits"] = held.structured()
    return value


def lookup_note(outcome: Outcome, through_proxy: bool, sandbox_file: str) -> str | None:
    """Why a host's name could not be looked up, when a failed call's output says it could not; else None
    (a call that succeeded may well print the words: a grep of a log)."""
    if not outcome.failed or outcome.no_internet or not _captured_says(outcome, LOOKUP_FAILED):
        return None
    if through_proxy:
        return ("[this call reaches the internet only through the agent's proxy, which its HTTPS_PROXY and "
                "HTTP_PROXY variables name: a program that does not use them cannot look up a host's name]")
    return ("[this call has no internet: no host's name can be looked up in its sandbox, nor any host reached. "
            f"The user may allow hosts in [internet] hosts of {sandbox_file}, then start the agent again]")


def unreached_server_note(outcome: Outcome, running: list[str]) -> str | None:
    """Why a server that `start` runs is not reached, when a failed call's output shows a connection
    refused while this conversation's background commands run; else None."""
    if not running or not outcome.failed or not _captured_says(outcome, REFUSED):
        return None
    return (f"[a server that start runs ({', '.join(running[:3])}{' …' if len(running) > 3 else ''}) is in a "
            "sandbox of its own, with a network of its own: no other call reaches it. Run the server and what "
            "talks to it in one command: sh -c 'server & sleep 1; tests']")


# A connection refused, as the C library, Node, curl and Python say it.
REFUSED = (b"Connection refused", b"ECONNREFUSED", b"Couldn't connect to server", b"Failed to connect")
# What resolvers print when a name cannot be looked up: glibc's strerror, curl and git's, Node's code, Go's.
LOOKUP_FAILED = (b"Temporary failure in name resolution", b"Could not resolve host", b"EAI_AGAIN",
                 b"Name or service not known", b": no such host")


def _captured_says(outcome: Outcome, needles: tuple[bytes, ...]) -> bool:
    # Only the start and end the answer holds are looked at: cheap, and enough for a hint.
    return any(needle in part for capture in (outcome.errors, outcome.output) for part in (capture.head, capture.tail)
               for needle in needles)


def _refused_write(outcome: Outcome) -> bool:
    # EROFS is what a write to a read-only bind fails with; programs print its strerror.
    return _captured_says(outcome, (b"Read-only file system",))


def _ending(outcome: Outcome, timeout: float, can_start: bool, longest: float) -> str:
    seconds = f"{outcome.seconds:.2f} s"
    if outcome.timed_out:
        advice = "use start for long work" if can_start else "split the work into shorter calls"
        if timeout < longest:  # the call's own, shorter than it may be
            advice = f"give a longer timeout (at most {format_duration(longest)}), or {advice}"
        return f"killed by SIGKILL: timed out after {format_duration(timeout)} ({seconds}); {advice}"
    if outcome.signal is not None:
        return f"killed by {signal_name(outcome.signal)} · {seconds}"
    return f"exit {outcome.exit} · {seconds}" + killed_by_note(outcome.exit, sure=killed_by_limit(outcome.limit, outcome.exit))


def _stream_text(label: str, capture: Capture, kept: KeptStreams | None) -> list[str]:
    if capture.total == 0:
        return [f"{label}: none"]
    return [f"{label} ({capture.total} bytes):", _shown(capture, label, kept)]


def _shown(capture: Capture, stream: str, kept: KeptStreams | None) -> str:
    """A stream's kept start and end as the text shows them, and the structured value too;
    where it was cut, the id of the stream kept past the answer, and for how long."""
    head, tail, left_out = capture.texts()
    parts = [head]
    kept_id = kept.ids.get(stream) if kept is not None else None
    if left_out:
        if kept is None or kept_id is None:
            parts += [f"[… {left_out} bytes left out …]", tail]
        else:
            which = "the whole stream" if capture.total <= kept.cap else f"the stream's last {describe_size(kept.cap)}"
            parts += [f"[… {left_out} bytes left out: read id={kept_id} has {which} for "
                      f"{format_duration(kept.keep_for)} …]", tail]
    # One final newline is the stream's own ending, not a line of its own.
    parts[-1] = parts[-1].removesuffix("\n")
    return "\n".join(parts)


def limits_sentence(held: Holding, background_timeout: int | None = None) -> str:
    """The agent's instructions on its per-call limits: exactly those that hold here, and how
    (`background_timeout`: with background commands, whose CPU time spans their longest run)."""
    limits, parts = held.limits, []
    if limits.memory is not None and "memory" not in held.not_held:
        size = describe_size(held.at_most("memory"))
        parts.append(f"{size} of memory (past it the call is killed)" if held.holds("memory") == PER_CALL else
                     f"{size} of memory in each process (past it an allocation fails; its processes together may "
                     "use more)")
    if limits.tasks is not None and "tasks" not in held.not_held:
        parts.append(f"{held.at_most('tasks')} processes and threads at once (past them a fork fails)")
    if limits.cpu is not None and "cpu" not in held.not_held:
        background = (f", {held._replace(longest=background_timeout).cpu_seconds} s in a background "
                      "command" if background_timeout else "")
        parts.append(f"{cores(limits.cpu)} of CPU (past it the call is slowed)" if "cpu" in held.by_cgroup else
                     f"{held.cpu_seconds} s of CPU time in each process{background} ({cores(limits.cpu)} over the "
                     "longest run; past it the process is killed)")
    words = {"memory": "memory", "tasks": "processes", "cpu": "CPU"}
    sentence = ("Each call may use at most " + "; ".join(parts) + ". ") if parts else ""
    if held.not_held:
        sentence += "No limit holds here on its " + " or ".join(words[name] for name in held.not_held) + ". "
    return sentence + "The answer says which limit bit."


def limit_text(limit: str, held: Holding | None, fixed: tuple[str, ...] = ()) -> str:
    """The limit that bit, in words, for a call's answer; `fixed`: the sandbox's command, which sets the largest file."""
    if limit == "file":
        # The size the sandbox's prlimit sets: [limits] file, or this machine's own hard limit where lower.
        size = next((f"{describe_size(int(flag[8:]))}, " for flag in fixed
                     if flag.startswith("--fsize=") and flag[8:].isdigit()), "")
        return (f"[it reached the largest file it may write ({size}the sandbox file's [limits] file): the kernel "
                "refused a write past it, or ended the program with SIGXFSZ]")
    by_rlimit = held is not None and limit in held.by_rlimit
    if limit == "cpu":
        seconds = f" of {held.cpu_seconds} s" if held is not None and "cpu" in held.by_rlimit else ""
        return f"[it reached its CPU time{seconds} a process: the kernel killed it with SIGXCPU]"
    if limit == "memory":
        size = f" of {describe_size(held.at_most('memory'))}" if held is not None and held.limits.memory else ""
        if by_rlimit:
            return (f"[it likely reached its memory limit{size} a process: an allocation failed (no cgroup here: "
                    "the limit holds for each process alone)]")
        return f"[it reached its memory limit{size}: the out-of-memory killer killed it]"
    count = f" of {held.at_most('tasks')}" if held is not None and held.limits.tasks else ""
    return f"[it {'likely ' if by_rlimit else ''}reached its limit{count} tasks: a fork or a new thread was refused]"
