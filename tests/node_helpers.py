"""Node and the packages `tools/setup` installs in tests/node, for the tests
that drive the server from Node."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent / "node"


def need_node(installed: Path, not_installed: str, sandboxed: bool = False) -> str:
    """Node's path, once `installed` (a path below NODE_DIR) is there;
    `not_installed` says what is missing when it is not. Without them the
    test is skipped, or fails where CI is set (or, for a `sandboxed` test,
    LNK_REQUIRE_SANDBOX=1): there a missing Node is a broken setup."""
    missing = None
    node = shutil.which("node")
    if node is None:
        missing = "node is missing (install Node 20 or later)"
    elif not installed.exists():
        missing = f"{not_installed}: run tools/setup"
    if missing is None:
        assert node is not None
        return node
    switches = "CI or LNK_REQUIRE_SANDBOX=1" if sandboxed else "CI"
    if os.environ.get("CI") or (sandboxed and os.environ.get("LNK_REQUIRE_SANDBOX") == "1"):
        pytest.fail(f"{missing}; {switches} is set, so this is a failure")
    pytest.skip(f"{missing} (set {switches} to fail instead)")
