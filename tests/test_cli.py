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
    assert COMMANDS[name][2] in done.stdout or name in ("way-in", "up")  # their own help says more


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


SERVE_BACKGROUND = ["--files", "/tmp", "--programs-path", "/bin", "--timeout", "2m", "--output", "16K",
                    "--background", "1", "--background-timeout", "1h", "--background-output", "16M",
                    "--background-keep", "1d", "--background-per-day", "9", "--hops", "2"]


def way_in_commands(tmp_path, flags: list[str]) -> dict[str, list[str]]:
    """serve, up and sweep, each given the same way-in flags."""
    return {"serve": ["serve", *SERVE_BACKGROUND, "--state", str(tmp_path / "serve-state"), *flags, "--", "env"],
            "up": ["up", "--agent", str(tmp_path / "agent"), *flags],
            "sweep": ["sweep", str(tmp_path / "sweep-state"), *flags]}


@pytest.mark.parametrize("flags, words", [
    (["--way-in", "http://127.0.0.1:9/x", "--as", "agent\n"], "--as 'agent\\n' is not an agent id"),
    (["--way-in", "http://127.0.0.1:9/x"], "--way-in needs --as <agent id>"),
    (["--way-in", "http://example.org/x", "--as", "agent"], "--way-in: the way in 'http://example.org/x' is not a local address"),
])
def test_serve_up_and_sweep_refuse_the_same_way_in_flags_with_the_same_words(tmp_path, flags, words):
    for name, argv in way_in_commands(tmp_path, flags).items():
        done = run(*argv)
        assert (done.returncode, done.stdout) == (2, ""), (name, done.stdout, done.stderr)
        assert words in done.stderr, (name, done.stderr)
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


@pytest.mark.parametrize("name", ["up", "sweep"])
def test_an_agent_id_or_keyring_without_a_way_in_is_refused(tmp_path, name):
    done = run(*way_in_commands(tmp_path, ["--as", "agent", "--keyring", "/k"])[name])
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert "--as and --keyring need --way-in <address>" in done.stderr
