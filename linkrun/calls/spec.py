"""The agent's spec file: its `[tool.run]` over the embedded defaults →
serve's flag values, read by `up` (which serves with them), `doctor`
(which checks a call's longest run) and serve's checks (setup.py: a kept
spec that cannot be followed refuses the calls), so that none imports
another's reading of it."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping

from ..config import parse_duration, parse_size
from ..errors import LinkRunError, UsageError
from ..sandboxing import sandboxfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# [tool.run] key → (serve's flag, kind)
RUN_KEYS = {
    "timeout": ("--timeout", "duration"),
    "output": ("--output", "size"),
    "background": ("--background", "count"),
    "background_timeout": ("--background-timeout", "duration"),
    "background_output": ("--background-output", "size"),
    "background_keep": ("--background-keep", "duration"),
    "background_per_day": ("--background-per-day", "count"),
    "keep_output": ("--keep-output", "size"),
    "keep_for": ("--keep-for", "duration"),
    "keep_total": ("--keep-total", "size"),
}


def run_settings(spec: Mapping[str, Any], source: str) -> dict[str, str]:
    """The spec's `[tool.run]` over the embedded defaults → serve's flag values.

    A duration or size may be a number (seconds, bytes) or text (`2m`, `16K`);
    an unknown key is refused (a typo would silently keep a default)."""
    run = spec.get("tool", {}).get("run", {}) if isinstance(spec.get("tool", {}), Mapping) else {}
    if not isinstance(run, Mapping):
        raise LinkRunError(f"{source}: [tool.run] is not a table")
    unknown = sorted(set(run) - set(RUN_KEYS))
    if unknown:
        raise LinkRunError(f"{source}: [tool.run] has unknown key {unknown[0]!r}",
                           f"[tool.run] takes {', '.join(RUN_KEYS)}")
    base = sandboxfile.defaults()["run"]
    values = {}
    for key, (flag, kind) in RUN_KEYS.items():
        value = run.get(key, base[key])
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise LinkRunError(f"{source}: [tool.run] {key} = {value!r} is neither a number nor text")
        text = str(value)
        try:
            if kind == "duration":
                parse_duration(key, text)
            elif kind == "size":
                parse_size(key, text)
            elif not text.isdigit():
                raise UsageError(f"{key} {text!r} is not a whole number of at least 0")
        except UsageError as error:
            raise LinkRunError(f"{source}: [tool.run] {error.message}", error.hint) from None
        values[flag] = text
    values["--hops"] = str(base["hops"])
    return values


def no_run_table(spec: Mapping[str, Any], source: str) -> LinkRunError | None:
    """A spec without `[tool.run]` (`[run]`, say): its numbers are all the defaults', which is worth saying."""
    tool = spec.get("tool")
    if isinstance(tool, Mapping) and "run" in tool:
        return None
    return LinkRunError(f"the spec {source} has no [tool.run] table: its numbers are the embedded defaults",
                        f"put them under [tool.run] ({', '.join(RUN_KEYS)})")


def read_toml(path: str, what: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as error:
        raise LinkRunError(f"cannot read the {what} {path}: {error.strerror}", "give a readable file") from None
    except tomllib.TOMLDecodeError as error:
        raise LinkRunError(f"the {what} {path} is not valid TOML: {error}", "fix it") from None
