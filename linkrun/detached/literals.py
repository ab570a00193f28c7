"""The literals one of which every match of a pattern holds: a prefilter, so
that a supervisor's `tell_on` search skips lines that cannot match at the
speed of a substring search (memmem: many GB/s), and runs RE2 only on a line
that holds one. RE2 alone runs at about 0.8 GB/s on a pattern that starts
with no literal (`^FATAL|listening on [0-9]+`), which would slow the pump.

The pattern is read with Python's own parser (`re._parser`): RE2's syntax is
Python's for what both take, and what only one of them takes (`\\pN`, `\\Q`,
`\\z`) fails to parse here and goes without a prefilter. Conservative: any
flag but m and s, any case folding, or a pattern where some match need hold
no literal of at least MIN_LITERAL characters gives None (RE2 alone, which
is always right).
"""

from __future__ import annotations

from typing import Any

MIN_LITERAL = 3  # shorter literals are found too often to be worth it
MAX_LITERALS = 8


class _NoPrefilter(Exception):
    pass


def required_literals(pattern: str) -> list[bytes] | None:
    """UTF-8 literals one of which every match of `pattern` holds, or None when none can be told."""
    import re
    from re import _constants as c, _parser as p  # type: ignore[attr-defined]

    try:
        parsed = p.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    if parsed.state.flags & ~(c.SRE_FLAG_UNICODE | c.SRE_FLAG_MULTILINE | c.SRE_FLAG_DOTALL):
        return None
    try:
        found = _required(list(parsed), c)
    except _NoPrefilter:
        return None
    if not found or len(found) > MAX_LITERALS or min(map(len, found)) < MIN_LITERAL:
        return None
    return sorted({literal.encode("utf-8") for literal in found})


def _required(items: list[Any], c: Any) -> list[str] | None:
    """For a sequence of parsed items: the best set of literals that each match of it holds."""
    best: list[str] | None = None
    run: list[str] = []

    def consider(candidates: list[str] | None) -> None:
        nonlocal best
        if candidates and (best is None or min(map(len, candidates)) > min(map(len, best))):
            best = candidates

    for op, value in items:
        if op is c.LITERAL:
            run.append(chr(value))
            continue
        consider(["".join(run)] if run else None)
        run = []
        if op is c.SUBPATTERN:
            _, add_flags, del_flags, sub = value
            if add_flags or del_flags:
                raise _NoPrefilter  # (?i:…) and the like
            consider(_required(list(sub), c))
        elif op is c.BRANCH:
            alternatives = [_required(list(alternative), c) for alternative in value[1]]
            if all(alternatives):
                consider(sorted({literal for each in alternatives if each for literal in each}))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and value[0] >= 1:
            consider(_required(list(value[2]), c))
    consider(["".join(run)] if run else None)
    return best
