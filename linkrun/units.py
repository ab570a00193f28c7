"""Durations, sizes, times and exit statuses in words, for the tools' texts
and the told message alike. It imports nothing of ours; datetime only when a
time is written (the supervisor's budget)."""

from __future__ import annotations

import signal


def signal_name(number: int) -> str:
    """SIGKILL for 9; "signal 99" for a number no signal has."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def format_duration(seconds: float) -> str:
    """The inverse of config.parse_duration, for texts: 120 → "2m", 90 → "90s"."""
    if seconds == int(seconds):
        whole = int(seconds)
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if whole and whole % size == 0:
                return f"{whole // size}{unit}"
        return f"{whole}s"
    return f"{seconds:.1f}s"


def elapsed(seconds: float) -> str:
    """How long something ran: 0.42 → "0.42 s"; 125 → "2m 5s"; 3600 → "1h 0m 0s"."""
    if seconds < 60:
        return f"{seconds:.2f} s"
    whole = int(round(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    return " ".join([*parts, f"{minutes}m", f"{secs}s"])


def local_time(unix: float) -> str:
    """A moment as the user's clock shows it, to the second: 2026-12-03T14:05:09+01:00."""
    from datetime import datetime

    return datetime.fromtimestamp(float(unix)).astimezone().isoformat(timespec="seconds")


def describe_size(size: int) -> str:
    """Bytes for a text, as people write them: 16384 → "16K", 1048576 → "1M",
    6319017984 → "5.9G" (one decimal past a megabyte), 1000 → "1000 bytes"."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
        if size >= scale and unit != "K":
            return f"{size / scale:.1f}{unit}"
    return f"{size} bytes"


def cores(cpu: int) -> str:
    """A CPU cap in percent of one core, in words: 100 → "1 core's worth", 150 → "1.5 cores' worth"."""
    return "1 core's worth" if cpu == 100 else f"{cpu / 100:g} cores' worth"


def killed_by_note(status: object, sure: bool = False) -> str:
    """For an exit status of 128+N where N names a signal, what a shell's status means:
    " (128+9: the program may have been killed by SIGKILL)", "was killed" when the
    limit that bit ended it so (`sure`: records.killed_by_limit); else ""."""
    if not isinstance(status, int) or not 128 < status < 128 + 65:
        return ""
    name = signal_name(status - 128)
    if not name.startswith("SIG"):
        return ""
    return f" (128+{status - 128}: the program {'was' if sure else 'may have been'} killed by {name})"
