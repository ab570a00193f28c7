"""Kept output as the tests drive it: serve's argv with the --keep flags, and a call that prints numbered lines."""

from __future__ import annotations

from pathlib import Path

from conftest import serve_argv

# 300000 numbered lines of 7 bytes: "000000\n" … "299999\n", 2100000 bytes.
NUMBERS = ["-c", "for i in range(300000): print(f'{i:06d}')"]


def keep_argv(files: Path, state: Path, *extra: str, output: str = "16M", keep_for: str = "1d",
              total: str = "256M") -> list[str]:
    return serve_argv(files, "--state", str(state), "--keep-output", output, "--keep-for", keep_for,
                      "--keep-total", total, *extra)


def numbers(count: int, start: int = 0) -> bytes:
    return b"".join(b"%06d\n" % i for i in range(start, start + count))
