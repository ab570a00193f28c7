"""How a background command ended, in the words of the answers' header lines
and as the fields of their structured values (`read`, `write`, `list`,
`stop`): structured-first clients give the model the value alone."""

from __future__ import annotations

from typing import Any

from ..state.records import ENDED_STATES, State, limit_words
from .results import nullable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import Shown

LIMIT_ENDINGS = {"memory": ", killed at its memory limit", "allocation": ", an allocation refused at its memory limit",
                 "tasks": ", a fork refused at its task limit", "cpu": ", killed at its CPU time (SIGXCPU)",
                 "file": ", a write refused past the largest file it may write ([limits] file)"}


# The exits a sandboxed program stopped by `stop` gets: its SIGTERM, then its SIGKILL after the grace.
STOPS_SIGNALS = {128 + 15: "SIGTERM", 128 + 9: "SIGKILL"}


def how_it_ended(record: Shown | dict[str, Any]) -> str:
    """Its state, and once it ended its exit status or signal and the limit that bit (of a record, or of list's entry):
    "exited (exit 137), killed at its memory limit"."""
    how = str(record["state"])
    exit_code = record.get("exit")
    if exit_code is not None:
        # A sandbox's init passes a death by a signal on as 128 and its number: a stop's own, said so.
        by_stop = STOPS_SIGNALS.get(exit_code) if record["state"] == State.STOPPED else None
        how += f" (exit {exit_code}: {by_stop}, its stop's)" if by_stop else f" (exit {exit_code})"
    elif record.get("signal"):
        how += f" ({record['signal']})"
    return how + LIMIT_ENDINGS.get(limit_words(record), "")


# A read's or a write's value, once its command ended: how, as list has it.
ENDING_SCHEMA = {
    "exit": nullable("integer", "A background command's, once it ended: its exit status, or null when a signal "
                     "ended it."),
    "signal": nullable("string", "A background command's, once it ended: the signal that ended it, or null."),
    "limit": nullable("string", 'A background command\'s, once it ended: the limit that bit ("memory", "tasks", '
                      '"cpu", "file"), or null.'),
}


def ended_fields(record: Shown | dict[str, Any]) -> dict[str, Any]:
    """`exit`, `signal` and `limit` of a background command that ended; none for one that runs, or kept output."""
    if record["state"] not in ENDED_STATES:
        return {}
    return {"exit": record.get("exit"), "signal": record.get("signal"), "limit": record.get("limit")}
