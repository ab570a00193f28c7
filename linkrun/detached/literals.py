"""The literals one of which every match of a pattern holds: a prefilter, so
that a supervisor's `tell_on` search skips lines that cannot match at the
speed of a substring search (memmem: many GB/s), and runs RE2 only on a line
that holds one. RE2 alone runs at about 0.8 GB/s on a pattern that starts
with no literal (`^FATAL|listening on [0-9]+`), which would slow the pump.

The pattern is read with Python's own parser (`re._parser`): RE2's syntax is
Python's for what both take, and what only one of them takes (`\\pN`, `\\Q`,
`\\z`) fails to parse here and goes without a prefilter. A literal may run
through a group of a few exact strings (`[0-9]+ (ok|failed)$`: ` ok` or
` failed`). Conservative: any flag but m and s, any case folding, or a
pattern where some match need hold no literal of at least MIN_LITERAL
characters gives None (RE2 alone, which is always right).

A pattern whose every match starts a line (`^[0-9]+ (ok|failed)$`: each
branch begins with `^`) has another prefilter, taken before its literals:
RE2 looks for a newline followed by the pattern, which it skips to with
memchr (lines.LineFinder), at about ten times its speed on the pattern
alone, and whatever the lines hold (a short literal such as ` ok` is on
every other line of prose).
"""

from __future__ import annotations

from typing import Any

MIN_LITERAL = 3  # shorter literals are found too often to be worth it
MAX_LITERALS = 8


class _NoPrefilter(Exception):
    pass


def required_literals(pattern: str) -> list[bytes] | None:
    """UTF-8 literals one of which every match of `pattern` holds, or None when none can be told."""
    from re import _constants as c  # type: ignore[attr-defined]

    parsed = _parse(pattern)
    if parsed is None or parsed.state.flags & ~(c.SRE_FLAG_UNICODE | c.SRE_FLAG_MULTILINE | c.SRE_FLAG_DOTALL):
        return None
    try:
        found = _required(list(parsed), c)
    except _NoPrefilter:
        return None
    if not found or len(found) > MAX_LITERALS or min(map(len, found)) < MIN_LITERAL:
        return None
    return sorted({literal.encode("utf-8") for literal in found})


def starts_lines(pattern: str) -> bool:
    """Whether every match of `pattern` starts at a line's start (RE2 reads `^` at each line's start, as
    tell_on compiles it). Conservative: a branch or group that does not begin with `^`, a repeated one, a
    group that takes a flag away (`(?-m:^x)`, where `^` is the text's start) or a flag but i, m, s give
    False."""
    from re import _constants as c  # type: ignore[attr-defined]

    allowed = c.SRE_FLAG_UNICODE | c.SRE_FLAG_MULTILINE | c.SRE_FLAG_DOTALL | c.SRE_FLAG_IGNORECASE
    parsed = _parse(pattern)
    return parsed is not None and not parsed.state.flags & ~allowed and _starts_lines(list(parsed), c)


def _starts_lines(items: list[Any], c: Any) -> bool:
    if not items:
        return False
    op, value = items[0]
    if op is c.AT:
        return value is c.AT_BEGINNING
    if op is c.SUBPATTERN:
        _, _, del_flags, sub = value
        return not del_flags and _starts_lines(list(sub), c)
    if op is c.BRANCH:
        return all(_starts_lines(list(alternative), c) for alternative in value[1])
    return False


def _parse(pattern: str) -> Any:
    """Python's parse of the pattern, or None when Python cannot parse it."""
    import re
    from re import _parser as p  # type: ignore[attr-defined]

    try:
        return p.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


def _required(items: list[Any], c: Any) -> list[str] | None:
    """For a sequence of parsed items: the best set of literals that each match of it holds."""
    best: list[str] | None = None
    run: list[str] | None = None  # the strings matched since the last item that is not exact: one of them

    def consider(candidates: list[str] | None) -> None:
        nonlocal best
        if candidates and min(map(len, candidates)) and (best is None or
                                                        min(map(len, candidates)) > min(map(len, best))):
            best = candidates

    for op, value in items:
        exact = _exact(op, value, c)
        if exact is not None:
            joined = _product(run or [""], exact)
            if joined is None:  # too many: the run starts again here
                consider(run)
            run = joined or exact
            continue
        consider(run)
        run = None
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
    consider(run)
    return best


def _exact(op: Any, value: Any, c: Any) -> list[str] | None:
    """The few strings an item matches (a literal, a class of literals, `^` and the like as "", or a
    group or branch of such: ` (ok|failed)` is ` ok` or ` failed`), or None."""
    if op is c.LITERAL:
        return [chr(value)]
    if op is c.AT:
        return [""]  # it matches no character
    if op is c.IN and all(member is c.LITERAL for member, _ in value):
        return sorted({chr(code) for _, code in value}) if len(value) <= MAX_LITERALS else None
    if op is c.SUBPATTERN and not value[1] and not value[2]:
        return _exact_sequence(list(value[3]), c)
    if op is c.BRANCH:
        strings: set[str] = set()
        for alternative in value[1]:
            exact = _exact_sequence(list(alternative), c)
            if exact is None:
                return None
            strings.update(exact)
        return sorted(strings) if len(strings) <= MAX_LITERALS else None
    return None


def _exact_sequence(items: list[Any], c: Any) -> list[str] | None:
    strings: list[str] | None = [""]
    for op, value in items:
        exact = _exact(op, value, c)
        if exact is None or strings is None:
            return None
        strings = _product(strings, exact)
    return strings


def _product(left: list[str], right: list[str]) -> list[str] | None:
    """Each of `left` followed by each of `right`, when they are at most MAX_LITERALS."""
    joined = sorted({first + second for first in left for second in right})
    return joined if len(joined) <= MAX_LITERALS else None
