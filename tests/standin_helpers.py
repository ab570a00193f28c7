"""The stand-in way in (`lnk-link-run way-in`) as tests drive it, the keyring
fixtures around it, a told record to send, and a harness's reading of the
output block. conftest.py loads it as a plugin, so its fixtures serve every test module."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import REPO, SERVER, clean_env, wait_for

from linkrun.messages import told

AGENT = "agent-1.main"
KEY = b"\xffs3cret\x00key bytes, never decoded"
ID = "abcdefghijkmnpq2"


class WayIn:
    """A stand-in way in process; its stdout and stderr lines are collected as they come."""

    def __init__(self, keyring: Path, listen: str, *flags: str):
        self.process = subprocess.Popen(
            SERVER + ["way-in", "--listen", listen, "--keyring", str(keyring), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), cwd=str(REPO))
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self._readers:
            reader.start()
        line = wait_for(lambda: next((x for x in self.err if "listening on " in x), None)
                        or self.process.poll() is not None, what="the way in to listen")
        assert line is not True, f"the way in exited: {self.err}"
        self.address = line.split("listening on ", 1)[1]

    @staticmethod
    def _read(stream, lines):
        for raw in stream:
            lines.append(raw.decode().rstrip("\n"))

    def messages(self) -> list[dict]:
        return [json.loads(line) for line in list(self.out)]

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=10)
        finally:
            self.kill()

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        self.process.stdout.close()
        self.process.stderr.close()


def write_key(keyring: Path, agent: str = AGENT, key: bytes = KEY, mode: int = 0o600) -> Path:
    keyring.mkdir(mode=0o700, exist_ok=True)
    path = keyring / f"{agent}.key"
    path.write_bytes(key)
    path.chmod(mode)
    return path


@pytest.fixture
def keyring(tmp_path: Path) -> Path:
    folder = tmp_path / "keyring"
    write_key(folder)
    return folder


@pytest.fixture
def short_dir():
    """A folder with a short path: a socket's path is limited to 107 bytes."""
    folder = tempfile.mkdtemp(prefix="wayin-")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def way_ins(keyring):
    """Start stand-in way ins with `way_ins(*flags, listen=...)`; each is stopped at the end."""
    started: list[WayIn] = []

    def start(*flags, listen="http://127.0.0.1:0/in", keys=None) -> WayIn:
        way_in = WayIn(keys or keyring, listen, *flags)
        started.append(way_in)
        return way_in

    yield start
    for way_in in started:
        way_in.stop()


def record(**changes) -> dict:
    base = {
        "id": ID, "program": "sh", "args": ["-c", "make test"], "started": 1_700_000_000.0,
        "timeout": 3600, "output": 16384, "thread": "conversation-7", "hops": 2,
        "state": "exited", "exit": 0, "signal": None, "ended": 1_700_000_004.25, "bytes": 6, "kept_from": 0,
    }
    return base | changes


def message(**changes) -> bytes:
    r = record(**changes)
    return told.body(r, told.told_text(r, b"hello\n"))


BEGIN = re.compile(r"-----BEGIN OUTPUT (\S+)-----")


def output_block(text: str) -> tuple[str, str]:
    """(nonce, output) of a told text, found as docs/way-in.md tells a harness: the
    first line that is a begin marker gives the nonce, and the output runs to the
    last line that is exactly the end marker with that nonce."""
    lines = text.split("\n")
    begin = next(i for i, line in enumerate(lines) if BEGIN.fullmatch(line))
    nonce = BEGIN.fullmatch(lines[begin]).group(1)
    end = max(i for i, line in enumerate(lines) if line == f"-----END OUTPUT {nonce}-----")
    return nonce, "\n".join(lines[begin + 1:end]) + "\n"


def between(text: str) -> str:
    return output_block(text)[1].removesuffix("\n")
