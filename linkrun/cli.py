"""The subcommands. A command's module is imported only when it runs, and this
is the one place where errors become exit codes."""

from __future__ import annotations

import gc
import importlib
import sys

from . import __version__
from . import logger
from .errors import LinkRunError

# subcommand → (module, function, one line of help). Each function takes the
# remaining argv and returns an exit code.
COMMANDS = {
    "serve": ("linkrun.front.server", "main", "the MCP server over stdio (what `up` execs)"),
    "up": ("linkrun.up", "main", "start an agent's server the way Link does, on embedded defaults"),
    "sandbox": ("linkrun.sandbox_command", "main", "build the bubblewrap argv from a sandbox file, and run or print it"),
    "doctor": ("linkrun.doctor", "main", "check that the sandbox can run here, and say what to fix"),
    "supervise": ("linkrun.detached.supervise", "main", "(internal) the detached supervisor of one background command"),
    "sweep": ("linkrun.detached.sweep", "main_sweep", "recover background commands after a crash, tell, clean up"),
    "stop": ("linkrun.detached.sweep", "main_stop", "stop an agent's background commands (the agent stopping)"),
    "remove": ("linkrun.detached.sweep", "main_remove", "stop and remove an agent's background commands and state"),
    "way-in": ("linkrun.messages.standin", "main_listen", "a stand-in way in that checks and prints told messages"),
    "proxy": ("linkrun.network.proxy", "main", "(internal) the agent's internet proxy"),
}


# subcommand → its usage: where its module keeps one, (module, name), read
# only when asked; else the text.
USAGES: dict[str, tuple[str, str] | str] = {
    "serve": ("linkrun.config", "SERVE_USAGE"),
    "up": ("linkrun.up", "HELP"),
    "sandbox": ("linkrun.sandbox_command", "USAGE"),
    "doctor": "lnk-link-run doctor [--agent DIR] [--sandbox FILE]",
    "supervise": ("linkrun.detached.supervise", "USAGE"),
    "sweep": "lnk-link-run sweep <state> [--way-in ADDR --as ID [--keyring DIR]]",
    "stop": "lnk-link-run stop [--agent <folder> | --state <dir>]   (default: the agent up starts by default)",
    "remove": "lnk-link-run remove (--agent <folder> | --state <dir>)",
    "way-in": ("linkrun.messages.standin", "LISTEN_HELP"),
    "proxy": "lnk-link-run proxy --state <dir>",
}
# The MCP server's commands: their start runs without the cyclic garbage
# collector, which its imports' new objects woke twenty times for nothing to
# free (2 ms of about 40 to the first answer); serve turns it back on once
# that answer is out.
SERVERS = ("up", "serve")
HELP = ("-h", "--help")
VERSION = ("-V", "--version")


def usage() -> str:
    lines = ["usage: lnk-link-run <command> [flags]   (lnk-link-run <command> --help for its flags)", ""]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def command_help(name: str) -> str:
    """One command's usage, and what it does."""
    text = USAGES[name]
    if isinstance(text, tuple):
        text = getattr(importlib.import_module(text[0]), text[1])
    text = "usage: " + text.strip().removeprefix("usage: ")
    return text if "\n" in text else f"{text}\n\n{COMMANDS[name][2]}"


def flags_of(argv: list[str]) -> list[str]:
    """The command's own words: what comes before `--` (after it, the program's)."""
    return argv[:argv.index("--")] if "--" in argv else argv


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["help"] and len(argv) > 1:
        argv = [argv[1], "--help"]
    if not argv or argv[0] in (*HELP, "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if any(word in VERSION for word in flags_of(argv)):
        print(f"lnk-link-run {__version__}")
        return 0
    if name not in COMMANDS:
        logger.error(f"unknown command {name!r}")
        print(usage(), file=sys.stderr)
        return 2
    if any(word in HELP for word in flags_of(rest)):
        print(command_help(name))
        return 0
    module_name, function, _ = COMMANDS[name]
    if name in SERVERS:
        gc.disable()
    logger.start(name)
    try:
        module = importlib.import_module(module_name)
        return getattr(module, function)(rest) or 0
    except LinkRunError as error:
        logger.error(str(error))
        return error.exit_code
    except KeyboardInterrupt:
        return 130
