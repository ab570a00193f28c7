"""The command line: --help on every subcommand, and --version."""

from __future__ import annotations

import subprocess

import pytest
from conftest import SERVER, clean_env

from linkrun import __version__
from linkrun.cli import COMMANDS


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(SERVER + list(argv), capture_output=True, text=True, env=clean_env(), timeout=30)


@pytest.mark.parametrize("name", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_subcommand_answers_help_with_its_usage(name, flag):
    done = run(name, flag)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith(f"usage: lnk-link-run {name}"), done.stdout
    assert COMMANDS[name][2] in done.stdout or name == "way-in"  # way-in's own help says more


def test_help_after_other_flags_is_still_help():
    done = run("up", "--agent", "/nonexistent/agent", "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: lnk-link-run up")


def test_help_after_the_double_dash_belongs_to_the_program():
    done = run("up", "--", "--help")
    assert done.returncode == 2
    assert "up takes no program after --" in done.stderr and done.stdout == ""


def test_help_names_a_command_to_explain():
    done = run("help", "sweep")
    assert done.returncode == 0 and done.stdout.startswith("usage: lnk-link-run sweep")
    assert run("help").returncode == 0
    unknown = run("help", "nope")
    assert unknown.returncode == 2 and "unknown command 'nope'" in unknown.stderr


@pytest.mark.parametrize("argv", [["--version"], ["-V"], ["serve", "--version"], ["up", "--version"]])
def test_version(argv):
    done = run(*argv)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"lnk-link-run {__version__}\n", "")


def test_no_command_is_a_usage_error_listing_them():
    done = run()
    assert done.returncode == 2
    assert all(name in done.stdout for name in COMMANDS)
