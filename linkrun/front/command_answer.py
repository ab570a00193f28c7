"""The command tool's part of the tool layer: its answer. A call's outcome
becomes the text the agent reads and the structured value programs read;
and the per-call limits in words, for the answer, the instructions and
serve's log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..processes.capture import Capture
from ..processes.child import signal_name
from ..config import CONTROLLERS, Limits, Serve
from ..processes.runner import Outcome
from ..units import describe_size, format_duration, killed_by_note

if TYPE_CHECKING:
    from ..sandboxing.cgroups import Place


def command_text(outcome: Outcome, timeout: float, settings: Serve, can_start: bool) -> tuple[str, list[str]]:
    """How the call ended, the limit that bit, what it printed, and a refused
    write explained; and serve's notes among those lines (the limit, the
    write), for the structured value too."""
    lines = [_ending(outcome, timeout, can_start)]
    notes = []
    if outcome.limit is not None:
        notes.append(limit_text(outcome.limit, settings.limits))
        lines.append(notes[-1])
    lines += _stream_text("output", outcome.output)
    lines += _stream_text("errors", outcome.errors)
    if settings.write and _refused_write(outcome):
        writable = " and ".join(f"{w}/" for w in settings.write)
        notes.append(f"[the sandbox refused a write: only {writable} of the files folder "
                     f"{'is' if len(settings.write) == 1 else 'are'} writable; chats/ and background/ never]")
        lines.append(notes[-1])
    return "\n".join(lines), notes


def command_structured(outcome: Outcome) -> dict[str, object]:
    """The answer's structured value, as the command tool's outputSchema says."""
    return {
        "exit": outcome.exit,
        "signal": signal_name(outcome.signal) if outcome.signal is not None else None,
        "timed_out": outcome.timed_out,
        "output_bytes": outcome.output.total,
        "errors_bytes": outcome.errors.total,
        "seconds": outcome.seconds,
        "output": _shown(outcome.output),
        "errors": _shown(outcome.errors),
        "limit": outcome.limit,
    }


def _refused_write(outcome: Outcome) -> bool:
    # EROFS is what a write to a read-only bind fails with; programs print its
    # strerror. Only the kept bytes are looked at: cheap, and enough for a hint.
    needle = b"Read-only file system"
    return any(needle in part for capture in (outcome.errors, outcome.output) for part in (capture.head, capture.tail))


def _ending(outcome: Outcome, timeout: float, can_start: bool) -> str:
    seconds = f"{outcome.seconds:.2f} s"
    if outcome.timed_out:
        advice = "use start for long work" if can_start else "split the work into shorter calls"
        return f"killed by SIGKILL: timed out after {format_duration(timeout)} ({seconds}); {advice}"
    if outcome.signal is not None:
        return f"killed by {signal_name(outcome.signal)} · {seconds}"
    return f"exit {outcome.exit} · {seconds}" + killed_by_note(outcome.exit)


def _stream_text(label: str, capture: Capture) -> list[str]:
    if capture.total == 0:
        return [f"{label}: none"]
    return [f"{label} ({capture.total} bytes):", _shown(capture)]


def _shown(capture: Capture) -> str:
    """A stream's kept start and end as the text shows them, and the structured value too."""
    head, tail = capture.texts()
    parts = [head]
    if capture.left_out:
        parts += [f"[… {capture.left_out} bytes left out …]", tail]
    # One final newline is the stream's own ending, not a line of its own.
    parts[-1] = parts[-1].removesuffix("\n")
    return "\n".join(parts)


def limits_sentence(limits: Limits) -> str:
    """The agent's instructions on its per-call limits, as set (the machine may enforce fewer: serve's log
    and `doctor` say which)."""
    parts = []
    if limits.memory:
        parts.append(f"{describe_size(limits.memory)} of memory")
    if limits.tasks:
        parts.append(f"{limits.tasks} processes and threads")
    if limits.cpu:
        parts.append(f"{limits.cpu / 100:g} cores' worth of CPU")
    return ("Each call may use at most " + ", ".join(parts) + ": past its memory it is killed, past its "
            "processes a fork fails, and the answer says which limit bit.")


def limit_warnings(limits: Limits, place: Place) -> list[str]:
    """One line for each limit that this machine cannot hold, with why and what to do."""
    names = {controller: name for name, controller in CONTROLLERS.items()}
    return [f"the per-call {names[controller]} limit does not hold here ({place.missing.get(controller, 'no cgroup')}): "
            "run lnk-link-run doctor for the fix"
            for controller in limits.controllers() if controller not in place.holds(limits)]


def limit_text(limit: str, limits: Limits | None) -> str:
    """The limit that bit, in words, for a call's answer."""
    if limit == "memory":
        size = f" of {describe_size(limits.memory)}" if limits is not None and limits.memory else ""
        return f"[it reached its memory limit{size}: the out-of-memory killer killed it]"
    count = f" of {limits.tasks}" if limits is not None and limits.tasks else ""
    return f"[it reached its limit{count} tasks: a fork or a new thread was refused]"
