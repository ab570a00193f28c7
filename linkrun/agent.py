"""The agent's folder (DESIGN.md §6): its layout, creating it, and the places
no sandbox may ever bind.

| path | what | in the sandbox |
|---|---|---|
| Config/ | sandbox.toml, spec.toml: the user's, kept for the agent | absent |
| Agent/  | its instructions, skills and conversations | read-only |
| Home/   | its Home (never the user's own) | read-only, HOME |
| Files/  | the files folder: work/, chats/, background/ ... | read-only, but the write folders |
| State/  | the state folder | absent |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from .errors import LinkRunError

SUBFOLDERS = ("Config", "Agent", "Home", "Files", "State")
# Folders of Files/ made with it: work/ is always writable; chats/ (the
# harness's) and background/ (the outputs) are never.
FILES_SUBFOLDERS = ("work", "chats", "background")


class AgentFolder(NamedTuple):
    root: str  # absolute, links resolved

    @property
    def config(self) -> str:
        return os.path.join(self.root, "Config")

    @property
    def agent(self) -> str:
        return os.path.join(self.root, "Agent")

    @property
    def home(self) -> str:
        return os.path.join(self.root, "Home")

    @property
    def files(self) -> str:
        return os.path.join(self.root, "Files")

    @property
    def state(self) -> str:
        return os.path.join(self.root, "State")

    @property
    def sandbox_file(self) -> str:
        return os.path.join(self.config, "sandbox.toml")

    @property
    def spec_file(self) -> str:
        return os.path.join(self.config, "spec.toml")


def default_root(environ: Mapping[str, str]) -> str:
    """`$XDG_DATA_HOME/linkrun/agents/main`, by default under ~/.local/share."""
    data = environ.get("XDG_DATA_HOME") or os.path.join(user_home(environ), ".local", "share")
    return os.path.join(data, "linkrun", "agents", "main")


def user_home(environ: Mapping[str, str]) -> str:
    return environ.get("HOME") or os.path.expanduser("~")


def default_keyring(environ: Mapping[str, str]) -> str:
    """Link's keyring: `$LINK_KEYRING`, else ~/.link/keyring (as serve reads it)."""
    return environ.get("LINK_KEYRING") or os.path.join(user_home(environ), ".link", "keyring")


def create(root: str) -> AgentFolder:
    """Create what is missing of the agent's folder; the layout, links resolved.

    The folder is private to the user (0700): it holds conversations and the
    state. Each part is resolved once here, so the paths handed to the
    sandbox and to serve are the same strings (the files folder is bound at
    its own path, and serve's working directory must be found inside).
    """
    root = os.path.realpath(os.path.abspath(root))
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        for name in SUBFOLDERS:
            os.makedirs(os.path.join(root, name), mode=0o700 if name in ("Config", "State") else 0o755, exist_ok=True)
        for name in FILES_SUBFOLDERS:
            os.makedirs(os.path.join(root, "Files", name), mode=0o755, exist_ok=True)
    except OSError as problem:  # not writable, below a file, a full disk: a person's fix, not a traceback
        raise LinkRunError(f"the agent's folder {root} cannot be made: {problem.strerror} ({problem.filename})",
                           "give --agent a folder you may write, such as one under your home") from None
    return AgentFolder(root)


def locate(root: str) -> AgentFolder:
    """The layout of an agent's folder, without creating anything."""
    return AgentFolder(os.path.realpath(os.path.abspath(root)))


def protected(folder: AgentFolder, keyring: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(path, what) of each place the sandbox builder refuses to bind, or to
    bind anything containing: the state folder, the agent's Config/, the
    keyring, the user's ~/.ssh and ~/.link, and every other agent's folder
    beside this one (a sibling holding Files/, State/ or Config/)."""
    home = user_home(environ)
    places = [
        (folder.state, "the agent's state folder"),
        (folder.config, "the agent's Config folder"),
        (keyring, "the keyring"),
        (os.path.join(home, ".ssh"), "your ~/.ssh"),
        (os.path.join(home, ".link"), "Link's own folder ~/.link"),
    ]
    parent = os.path.dirname(folder.root)
    try:
        siblings = os.scandir(parent)
    except OSError:
        siblings = None
    if siblings is not None:
        with siblings:
            for entry in siblings:
                path = os.path.join(parent, entry.name)
                if path != folder.root and entry.is_dir(follow_symlinks=False) and any(
                        os.path.isdir(os.path.join(path, name)) for name in ("Files", "State", "Config")):
                    places.append((path, f"another agent's folder ({entry.name})"))
    return [(os.path.realpath(path), what) for path, what in places]
