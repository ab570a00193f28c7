"""One voice per process (linkrun/logger.py): one line format, quiet where a
client shows stderr, a time only where stderr is a file that keeps lines."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import clean_env
from linkrun import logger


@pytest.fixture
def voice(monkeypatch):
    """The logger's process-wide state, given back after the test."""
    kept = (logger._name, logger._shown, logger._timed)
    monkeypatch.delenv("LNK_LOG", raising=False)
    yield logger
    logger._name, logger._shown, logger._timed = kept


def test_a_line_names_the_process_and_a_warning_says_so(voice, capsys):
    voice.start("proxy")
    voice.warning("keeps 1024 descriptors")
    voice.info("serving proxy/proxy.sock")
    assert capsys.readouterr().err == ("lnk-link-run proxy: warning: keeps 1024 descriptors\n"
                                       "lnk-link-run proxy: serving proxy/proxy.sock\n")


def test_serve_says_only_warnings_and_errors_where_a_client_reads_its_stderr(voice, capsys):
    voice.start("serve", quiet_for_a_client=True)  # capsys' stderr is no terminal, as a client's pipe
    voice.info("ended 2 sandbox process(es)")
    voice.warning("cannot watch /etc for changes")
    voice.error("internal error in a call")
    assert capsys.readouterr().err == ("lnk-link-run serve: warning: cannot watch /etc for changes\n"
                                       "lnk-link-run serve: error: internal error in a call\n")


def test_lnk_log_sets_the_level_over_the_default(voice, capsys, monkeypatch):
    monkeypatch.setenv("LNK_LOG", "info")
    voice.start("serve", quiet_for_a_client=True)
    voice.info("ended 2 sandbox process(es)")
    monkeypatch.setenv("LNK_LOG", "error")
    voice.start("proxy")
    voice.warning("not said")
    assert capsys.readouterr().err == "lnk-link-run serve: ended 2 sandbox process(es)\n"


def test_a_log_file_gets_the_time_of_each_line(tmp_path):
    log = tmp_path / "x.log"
    with open(log, "wb") as stderr:
        subprocess.run([sys.executable, "-c", "from linkrun import logger; logger.start('supervise abc'); "
                        "logger.info('ended: exited')"], stderr=stderr, env=clean_env(), check=True, timeout=30)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d{4} lnk-link-run supervise abc: ended: exited\n",
                        log.read_text())
