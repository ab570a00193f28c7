"""An agent's folder for sandbox tests, and a sandbox around the machine for
tests that take something away from it (bubblewrap, a program, namespaces)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import SERVER, clean_env

from linkrun import agent


class Agent:
    """An agent's folder under tmp_path, with a user's home (holding ~/.ssh
    and a keyring) and another agent beside it, each with a secret to look for."""

    def __init__(self, tmp_path: Path, sandbox_text: str = "") -> None:
        self.tmp = tmp_path
        self.user_home = tmp_path / "user"
        (self.user_home / ".ssh").mkdir(parents=True)
        (self.user_home / ".ssh" / "id_ed25519").write_text("ssh secret\n")
        self.keyring = self.user_home / ".link" / "keyring"
        self.keyring.mkdir(parents=True)
        (self.keyring / "main.key").write_text("key secret\n")
        self.root = tmp_path / "agents" / "main"
        self.folder = agent.create(str(self.root))
        (self.root / "State" / "record.json").write_text("state secret\n")
        (self.root / "Home" / "note").write_text("home note\n")
        (self.root / "Agent" / "instructions.md").write_text("be kind\n")
        other = agent.create(str(tmp_path / "agents" / "other"))
        Path(other.files, "work", "theirs").write_text("other agent secret\n")
        self.files = self.root / "Files"
        self.file = tmp_path / "sandbox.toml"
        self.file.write_text(sandbox_text)
        self.env = clean_env(HOME=str(self.user_home), XDG_DATA_HOME=str(tmp_path / "xdg"))

    def argv(self, *command: str) -> list[str]:
        return SERVER + ["sandbox", "--file", str(self.file), "--agent", str(self.root), "--", *command]

    def run(self, *command: str, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        """Run a command in the agent's sandbox, as a call runs it."""
        return subprocess.run(self.argv(*command), env=kwargs.pop("env", self.env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)

    def sh(self, script: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run("sh", "-c", script, **kwargs)


def outer_sandbox(*extra: str) -> list[str]:
    """The machine as it is, in a user namespace of its own, with `extra`."""
    return ["bwrap", "--unshare-user", "--bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *extra, "--"]
