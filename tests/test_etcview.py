"""The sandbox's /etc view (etcview.py): one prepared folder per agent,
holding exactly the allow list's entries, refreshed when the host's change.

The host's /etc is never modified: a stand-in folder plays it where a test
changes a file, as the view takes its source folder as a parameter.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import secrets
import shlex
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import clean_env, host_etc, serve_argv, require_sandbox, spare_ready, text_of, wait_for
from up_harness import Up

from linkrun import agent
from linkrun.state import filing, layout
from linkrun.sandboxing import etcrule, etcview, sandbox, sandboxfile


def stand_in(tmp_path: Path) -> Path:
    """An /etc with allowed entries, entries the list leaves out, and a mask."""
    etc = tmp_path / "etc"
    (etc / "ssl" / "private").mkdir(parents=True)
    (etc / "ssl" / "certs").mkdir()
    (etc / "ssl" / "private" / "host.key").write_text("private key\n")
    (etc / "ssl" / "certs" / "ca.pem").write_text("a certificate\n")
    (etc / "ssl" / "certs" / "hash.0").symlink_to("ca.pem")
    (etc / "ssl" / "openssl.cnf").write_text("[openssl]\n")
    (etc / "pki" / "tls" / "private").mkdir(parents=True)  # where Fedora keeps the host's private keys
    (etc / "pki" / "tls" / "private" / "localhost.key").write_text("private key\n")
    (etc / "pki" / "tls" / "cert.pem").write_text("a certificate\n")
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (etc / "hostname").write_text("one\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "hosts").chmod(0o604)  # an odd mode, readable by everyone: kept as it is
    (etc / "localtime").symlink_to("/usr/share/zoneinfo/Etc/UTC")
    (etc / "python3.11").mkdir()  # allowed by a pattern
    (etc / "python3.11" / "sitecustomize.py").write_text("")
    (etc / "python3.11").chmod(0o555)
    (etc / "shadow").write_text("root:secret-hash:19000::::::\n")
    (etc / "ssh").mkdir()
    (etc / "ssh" / "ssh_host_ed25519_key").write_text("host key\n")
    os.mkfifo(etc / "initctl")
    if os.path.exists("/etc/ld.so.cache"):  # so the stand-in's programs start as fast as the host's
        shutil.copyfile("/etc/ld.so.cache", etc / "ld.so.cache")
    return etc


def tree(top: Path) -> dict[str, tuple[int, str | None]]:
    """Each entry below `top`: its mode (type included), and a link's target or a file's text."""
    found = {}
    for folder, folders, names in os.walk(top):
        for name in folders + names:
            path = Path(folder, name)
            mode = path.lstat().st_mode
            what = (os.readlink(path) if stat.S_ISLNK(mode) else
                    path.read_bytes().hex()[:64] if stat.S_ISREG(mode) else None)
            found[str(path.relative_to(top))] = (mode, what)
    return found


def view_of(state: Path) -> Path:
    return Path(os.path.realpath(etcview.link_of(str(state))))


def settled(state: Path, etc: Path) -> Path:
    """The view once made again no more: a view made right after a change is
    made once more at the next look (a second change in the same clock tick
    would not show in the entries' times)."""
    def same_twice() -> bool:
        before = view_of(state)
        etcview.ensure(str(state), str(etc))
        return view_of(state) == before
    etcview.ensure(str(state), str(etc))
    wait_for(same_twice, timeout=10, interval=0.01, what="the view to settle")
    return view_of(state)


def test_the_view_holds_exactly_the_allowed_entries_with_their_modes(tmp_path):
    etc, state = stand_in(tmp_path), tmp_path / "state"
    state.mkdir()
    etcview.ensure(str(state), str(etc))
    shown = tree(view_of(state))
    host = tree(etc)
    allowed = {"ssl", "ssl/certs", "ssl/certs/ca.pem", "ssl/certs/hash.0", "ssl/openssl.cnf", "passwd", "hostname",
               "hosts", "localtime", "python3.11", "python3.11/sitecustomize.py", "pki", "pki/tls", "pki/tls/cert.pem"}
    allowed |= {"ld.so.cache"} if (etc / "ld.so.cache").exists() else set()
    assert set(shown) == allowed  # not ssl/private, pki/tls/private, shadow, ssh/ nor the fifo
    for name in allowed:
        assert shown[name] == host[name], name  # the same type, mode, text, or link target
    assert stat.S_IMODE(view_of(state).stat().st_mode) == stat.S_IMODE(etc.stat().st_mode)


PRIVATE_KEY = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIAn0tAkey/base64==\n-----END PRIVATE KEY-----\n"
CERTIFICATE = "-----BEGIN CERTIFICATE-----\nMIIBdDCCARmgAwIBAgIU/base64==\n-----END CERTIFICATE-----\n"
# Where RHEL and Fedora keep private keys under /etc/pki, and public files beside them: (path, mode, text).
# Modes as those systems give them; the folders' modes follow.
PKI = [
    ("CA/private/cakey.pem", 0o600, PRIVATE_KEY),
    ("CA/private/notes.txt", 0o644, "readable, in a folder kept from the others\n"),
    ("CA/cacert.pem", 0o644, CERTIFICATE),
    ("entitlement/4711-key.pem", 0o640, PRIVATE_KEY),
    ("entitlement/4711.pem", 0o644, CERTIFICATE),
    ("consumer/key.pem", 0o640, PRIVATE_KEY),
    ("consumer/cert.pem", 0o644, CERTIFICATE),
    ("libvirt/private/serverkey.pem", 0o600, PRIVATE_KEY),
    ("libvirt/servercert.pem", 0o644, CERTIFICATE),
    ("tls/certs/localhost.crt", 0o644, CERTIFICATE + "-----BEGIN RSA PRIVATE KEY-----\nkey\n"),  # bundled by mistake
    ("tls/certs/ca-bundle.crt", 0o644, CERTIFICATE * 3),
    ("tls/misc/lone.key", 0o644, "-----BEGIN EC PRIVATE KEY-----\nkey\n-----END EC PRIVATE KEY-----\n"),
    ("tls/misc/ssh_host_ed25519_key", 0o644, "-----BEGIN OPENSSH PRIVATE KEY-----\nkey\n"),
    ("tls/misc/encrypted.pem", 0o644, "-----BEGIN ENCRYPTED PRIVATE KEY-----\nkey\n"),
    ("tls/misc/pgp.asc", 0o644, "-----BEGIN PGP PRIVATE KEY BLOCK-----\nkey\n"),
    ("rpm-gpg/RPM-GPG-KEY-fedora", 0o644, "-----BEGIN PGP PUBLIC KEY BLOCK-----\nkey\n"),
    ("ca-trust/extracted/pem/tls-ca-bundle.pem", 0o644, CERTIFICATE),
    ("java/cacerts", 0o644, "a trust store\n"),
    ("hidden/unlisted.pem", 0o644, CERTIFICATE),  # in a folder others may enter but not list
    ("group-only/shared.pem", 0o644, CERTIFICATE),  # in a folder its group alone may enter
]
FOLDER_MODES = {"CA/private": 0o700, "libvirt/private": 0o750, "hidden": 0o711, "group-only": 0o750}
# A world-readable file whose key marker is cut across the copy's reads (1 MiB each).
LONG_KEY = "tls/certs/long.pem"
PKI_SHOWN = {"pki", "pki/CA", "pki/CA/cacert.pem", "pki/entitlement", "pki/entitlement/4711.pem", "pki/consumer",
             "pki/consumer/cert.pem", "pki/libvirt", "pki/libvirt/servercert.pem", "pki/tls", "pki/tls/certs",
             "pki/tls/certs/ca-bundle.crt", "pki/tls/misc", "pki/rpm-gpg", "pki/rpm-gpg/RPM-GPG-KEY-fedora",
             "pki/ca-trust", "pki/ca-trust/extracted", "pki/ca-trust/extracted/pem",
             "pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "pki/java", "pki/java/cacerts", "pki/tls/private-link"}


def plant_pki(pki: Path) -> None:
    """PKI's files and folders below `pki`, with their modes; a link to a private key beside them."""
    for rel, mode, text in PKI:
        path = pki / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    with open(pki / LONG_KEY, "w") as f:
        f.write("x" * ((1 << 20) - 10) + PRIVATE_KEY)
    (pki / "tls" / "private-link").symlink_to("../CA/private/cakey.pem")
    for rel, mode in FOLDER_MODES.items():
        (pki / rel).chmod(mode)


def test_the_view_shows_no_private_key_by_the_modes_and_the_content_of_what_it_copies(tmp_path):
    """Only what everyone on the host may read, in folders everyone may list and enter, and no
    file holding a PEM private key: as root the view's files would be root's to read, whatever their mode."""
    etc, state = stand_in(tmp_path), tmp_path / "state"
    state.mkdir()
    shutil.rmtree(etc / "pki")
    plant_pki(etc / "pki")
    etcview.ensure(str(state), str(etc))
    view = view_of(state)
    shown = {name for name in tree(view) if name.startswith("pki")}
    assert shown == PKI_SHOWN
    assert os.readlink(view / "pki" / "tls" / "private-link") == "../CA/private/cakey.pem"  # to nothing inside
    assert not (view / "pki" / "tls" / "private-link").exists()
    for name in shown:
        if not os.path.islink(view / name):
            assert stat.S_IMODE((view / name).stat().st_mode) == stat.S_IMODE((etc / name).stat().st_mode), name
    assert all(b"PRIVATE KEY" not in path.read_bytes() for path in view.rglob("*") if path.is_file())


def test_a_view_made_by_an_earlier_rule_is_made_again(tmp_path):
    """An agent's view made before the rule (which may hold private keys) is not kept for want of a change."""
    etc, state = stand_in(tmp_path), tmp_path / "state"
    state.mkdir()
    first = settled(state, etc)
    printed = Path(f"{first}.print")
    printed.write_bytes(printed.read_bytes().replace(b"\0" + etcrule.RULE.encode(), b"", 1))  # as before the rule
    etcview._prints.clear()  # as a new serve reads the print
    etcview.ensure(str(state), str(etc))
    assert view_of(state) != first


def test_a_view_is_made_again_only_when_an_entry_changed(tmp_path):
    etc, state = stand_in(tmp_path), tmp_path / "state"
    state.mkdir()
    first = settled(state, etc)
    (etc / "shadow").write_text("changed, and not shown\n")
    (etc / "ssh" / "moved").write_text("")
    (etc / "ssh" / "moved").rename(etc / "ssh" / "sshd_config")
    etcview.ensure(str(state), str(etc))
    assert view_of(state) == first
    with open(etc / "ssl" / "certs" / "ca.pem", "a") as f:  # in place: the same inode
        f.write("another certificate\n")
    etcview.ensure(str(state), str(etc))
    assert view_of(state) != first
    (etc / "ssl" / "certs" / "hash.0").unlink()  # a link below the top: seen through its folder
    (etc / "ssl" / "certs" / "hash.0").symlink_to("elsewhere.pem")
    second = settled(state, etc)
    assert os.readlink(second / "ssl" / "certs" / "hash.0") == "elsewhere.pem"
    assert (view_of(state) / "ssl" / "certs" / "ca.pem").read_text() == "a certificate\nanother certificate\n"
    assert sorted(os.listdir(state / "etc")) == sorted([view_of(state).name, f"{view_of(state).name}.print"])


def test_a_view_a_sandbox_holds_is_kept_until_it_ends(tmp_path):
    etc, state = stand_in(tmp_path), tmp_path / "state"
    state.mkdir()
    etcview.ensure(str(state), str(etc))
    old = view_of(state)
    held = etcview.pin(etcview.link_of(str(state)))
    try:
        (etc / "hostname").write_text("two\n")
        etcview.ensure(str(state), str(etc))
        assert view_of(state) != old
        assert (old / "hostname").read_text() == "one\n"  # still whole under the sandbox showing it
    finally:
        os.close(held)
    etcview.ensure(str(state), str(etc))
    assert not old.exists() and sorted(os.listdir(state / "etc")) == sorted(
        [view_of(state).name, f"{view_of(state).name}.print"])


def serve_with_view(folder: agent.AgentFolder) -> list[str]:
    """serve as `up` execs it, its fixed argv binding the agent's /etc view."""
    fixed = sandbox.fixed_argv(folder, sandboxfile.load(None), sandbox.host_facts(), [], [])
    return serve_argv(Path(folder.files), "--write", "work", programs=("cat",), sandbox=fixed)


def cat(server, path: str) -> str:
    result = server.call("command", {"program": "cat", "args": [path]})
    assert not result.get("isError"), text_of(result)
    return text_of(result)


def serving_a_stand_in(tmp_path: Path, servers, wrapper: tuple[str, ...] = ()) -> tuple[Path, Path, object]:
    """A stand-in /etc, an agent whose view shows it, and serve, after a first call (its watch started)."""
    etc = stand_in(tmp_path)
    folder = agent.create(str(tmp_path / "agent"))
    etcview.ensure(folder.state, str(etc))
    server = servers([*wrapper, *serve_with_view(folder)], env=clean_env())
    server.initialize()
    assert "one" in cat(server, "/etc/hostname")
    return etc, Path(folder.state), server


def test_a_change_of_a_host_file_reaches_the_next_call(tmp_path, servers):
    require_sandbox()
    etc, _, server = serving_a_stand_in(tmp_path, servers)
    (etc / "hostname").write_text("two\n")
    # The watch reads its events on a thread of its own: a call after that shows the change.
    wait_for(lambda: "two" in cat(server, "/etc/hostname"), timeout=30, interval=0.2, what="the changed hostname inside")
    assert "two" in cat(server, "/etc/hostname")
    assert "private key" not in cat(server, "/etc/ssl/private/host.key")
    assert server.close() == 0


def lock_waiters(path: Path) -> int:
    """How many flocks of `path` are waited for now (the kernel's lock table, /proc/locks)."""
    inode = path.stat().st_ino
    with open("/proc/locks") as f:
        return sum(1 for line in f if " -> " in f" {line}" and line.split()[-3].endswith(f":{inode}"))


def answer(server, request_id: str, got: dict[str, dict]) -> dict | None:
    """The call's answer if it came (kept in `got`), else None at once."""
    if request_id not in got:
        with contextlib.suppress(queue.Empty):
            got[request_id] = server.wait_response(request_id, timeout=0.01)
    return got.get(request_id)


def send_cat(server, request_id: str) -> None:
    server.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                 "params": {"name": "command", "arguments": {"program": "cat", "args": ["/etc/hostname"]}}})


def test_every_call_after_a_change_was_heard_shows_it_while_another_copies_the_new_view(tmp_path, servers):
    """A rebuild holds the view's lock while it copies (here the test holds
    it, as long as it wants): a call that comes meanwhile waits for the new
    view, and never gets the old one, nor a spare made from it."""
    require_sandbox()
    etc, state, server = serving_a_stand_in(tmp_path, servers)
    lock = state / layout.ETC_LOCK
    got: dict[str, dict] = {}
    with filing.hold(str(lock)):
        (etc / "hostname").write_text("two\n")
        for n in itertools.count():  # until a look at the change waits for the lock: the change was heard
            send_cat(server, f"before-{n}")
            wait_for(lambda n=n: lock_waiters(lock) or answer(server, f"before-{n}", got), what="a call's look or answer")
            if lock_waiters(lock):
                break
        send_cat(server, "after")
        wait_for(lambda: lock_waiters(lock) >= 2 or answer(server, "after", got), what="the call after to wait or answer")
        early = answer(server, "after", got)
    assert early is None, f"answered while the new view was being made: {text_of(early['result'])!r}"
    # Only the call sent after the change was heard is judged. The waiter seen
    # may be the spares' thread's look, not the last call's: a call launched
    # before the change was heard may show the old view, and answer at any
    # time (under load, after the lock was let go), so neither its view nor
    # when it answers tells whether it waited for the look.
    outputs = [(answer(server, request_id, got) or server.wait_response(request_id, timeout=30))
               ["result"]["structuredContent"]["output"] for request_id in (f"before-{n}", "after")]
    assert outputs[1] == "two", outputs
    assert outputs[0] in ("one", "two"), outputs
    spare_ready(server.process.pid)
    assert all("two" in cat(server, "/etc/hostname") for _ in range(3))  # spares included
    assert server.close() == 0


def test_with_nothing_changed_a_call_does_not_look_at_the_host_entries(tmp_path, servers):
    require_sandbox()
    _, state, server = serving_a_stand_in(tmp_path, servers)
    lock = state / layout.ETC_LOCK
    an_hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(lock, ns=(an_hour_ago, an_hour_ago))  # a look touches it
    assert "one" in cat(server, "/etc/hostname")
    assert lock.stat().st_mtime_ns == an_hour_ago
    assert server.close() == 0


def test_a_change_in_a_folder_made_after_the_start_reaches_a_call(tmp_path, servers):
    require_sandbox()
    etc, _, server = serving_a_stand_in(tmp_path, servers)
    (etc / "java-21" / "conf").mkdir(parents=True)  # a new top-level folder the list allows, a folder in it
    settings = etc / "java-21" / "conf" / "settings"
    settings.write_text("first\n")
    wait_for(lambda: "first" in cat(server, "/etc/java-21/conf/settings"), timeout=30, interval=0.2,
             what="the new folder's file inside")
    with open(settings, "r+") as f:  # in place: the folders' times stay, only a watch of the new folder sees it
        f.write("again\n")
    wait_for(lambda: "again" in cat(server, "/etc/java-21/conf/settings"), timeout=30, interval=0.2,
             what="the changed file inside")
    assert server.close() == 0


def q(path: Path) -> str:
    """`path` quoted for a shell line."""
    return shlex.quote(str(path))


def in_namespaces(*setup: str, mount: bool = False) -> tuple[str, ...]:
    """serve in a user namespace of its own (with inotify limits of its own, since Linux 5.11), and a
    mount namespace with `mount`, after the shell lines of `setup`."""
    if not shutil.which("unshare"):
        pytest.skip("unshare is missing")
    script = " && ".join([*setup, 'exec "$@"'])
    return ("unshare", "--user", "--map-root-user", *(["--mount"] if mount else []), "sh", "-c", script, "sh")


def watched_in(etc: Path) -> int:
    """How many watches a watch of `etc` takes: its top, and each folder and file the view shows (not links)."""
    return 1 + sum(1 for _, info in etcview.entries(str(etc)) if info is not None and not stat.S_ISLNK(info.st_mode))


@pytest.mark.parametrize("name, below, said, limit", [
    ("max_inotify_instances", None, "cannot watch", "fs.inotify.max_user_instances"),
    ("max_inotify_watches", 1, "cannot watch", "fs.inotify.max_user_watches"),
    ("max_inotify_watches", 0, "stopped watching", "fs.inotify.max_user_watches"),
])
def test_without_a_watch_calls_look_once_a_second_and_serve_says_why_once(tmp_path, servers, name, below, said,
                                                                          limit):
    """No inotify instance, one watch too few, or just enough until a folder appears."""
    require_sandbox()
    if not os.path.exists(f"/proc/sys/user/{name}"):
        pytest.skip("inotify limits per user namespace need Linux 5.11")
    value = 0 if below is None else watched_in(stand_in(tmp_path / "count")) - below
    etc, _, server = serving_a_stand_in(tmp_path, servers, in_namespaces(f"echo {value} > /proc/sys/user/{name}"))
    (etc / "ssl" / "more").mkdir()  # at the watches' limit: one more is refused, and the watch stops
    (etc / "hostname").write_text("two\n")
    wait_for(lambda: "two" in cat(server, "/etc/hostname"), timeout=30, interval=0.2, what="the changed hostname inside")
    assert server.close() == 0
    said_lines = [line for line in server.stderr.decode().splitlines() if "for changes" in line]
    assert len(said_lines) == 1 and said in said_lines[0] and limit in said_lines[0], server.stderr.decode()


def test_a_file_bound_over_an_entry_and_written_elsewhere_reaches_a_call(tmp_path, servers):
    """As container runtimes bind /etc/hosts from a file of their own, and write that one."""
    require_sandbox()
    bound = tmp_path / "runtime" / "hostname"
    bound.parent.mkdir()
    bound.write_text("one\n")
    over = tmp_path / "etc" / "hostname"  # the stand-in's, once made
    _, _, server = serving_a_stand_in(tmp_path, servers, in_namespaces(f"mount --bind {q(bound)} {q(over)}", mount=True))
    with open(bound, "r+") as f:  # in place, not through the stand-in: its folder hears nothing
        f.write("two\n")
    wait_for(lambda: "two" in cat(server, "/etc/hostname"), timeout=30, interval=0.2, what="the changed hostname inside")
    assert server.close() == 0


def test_a_rebuild_that_failed_is_tried_again_at_the_next_call(tmp_path, servers):
    require_sandbox()
    views = tmp_path / "agent" / "State" / layout.ETC_VIEWS  # on a small filesystem of serve's own, filled below
    kept = tmp_path / "views"
    etc, _, server = serving_a_stand_in(tmp_path, servers, in_namespaces(
        f"cp -a {q(views)} {q(kept)}", f"mount -t tmpfs -o size=1m tmpfs {q(views)}", f"cp -a {q(kept)}/. {q(views)}",
        mount=True))
    seen = Path(f"/proc/{server.process.pid}/root{views}")  # serve's views, as its mounts show them
    filler = os.open(seen / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):  # until it is full
        while True:
            os.write(filler, b"x" * 65536)
    os.close(filler)
    (etc / "hostname").write_text("two\n")

    def a_rebuild_failed() -> bool:
        assert "one" in cat(server, "/etc/hostname")
        return sum(1 for entry in os.scandir(seen) if entry.is_dir()) > 1  # the current view, and one cut short
    wait_for(a_rebuild_failed, timeout=30, interval=0.2, what="a rebuild on a full disk")
    (seen / "filler").unlink()
    wait_for(lambda: "two" in cat(server, "/etc/hostname"), timeout=30, interval=0.2, what="the changed hostname inside")
    assert server.close() == 0
    assert "cannot refresh the sandbox's /etc view" in server.stderr.decode()


def test_inside_etc_is_the_allow_list_as_root_and_as_a_user(up_as: Up):
    text = up_as.python("import os; print('listed:', *sorted(os.listdir('/etc'))); "
                        "print('found:', *[p for p in ('/etc/shadow', '/etc/ssl/private', '/etc/ssh') "
                        "if os.path.lexists(p)])")
    lines = {line.split(":")[0]: line.split()[1:] for line in text.splitlines() if line.startswith(("listed:", "found:"))}
    assert lines["listed"] == sorted(name for name in os.listdir("/etc") if etcview.wanted(name)), text
    assert lines["found"] == [], text


@pytest.fixture
def planted_pki() -> Iterator[Path]:
    """PKI's layout planted in the host's /etc/pki, in a folder of its own, and
    removed after the test (with /etc/pki, when the test made it)."""
    if os.geteuid() != 0:
        pytest.skip("planting files in the host's /etc needs root")
    pki = Path("/etc/pki")
    with host_etc(change=True):
        made = not pki.exists()
        top = pki / f"lnk-test-{secrets.token_hex(4)}"
        try:
            top.mkdir(parents=True)
            if made:
                pki.chmod(0o755)
            plant_pki(top)
            yield top
        finally:
            shutil.rmtree(top, ignore_errors=True)
            if made:
                with contextlib.suppress(OSError):  # another run's plant is still there: its test removes it
                    pki.rmdir()


# Reads each file named in argv[2:] below argv[1]; prints each name and "read", "absent" or the error.
READ_EACH = r"""
import sys
for name in sys.argv[2:]:
    try:
        with open(f"{sys.argv[1]}/{name}", "rb") as f:
            f.read()
        print(name, "read")
    except FileNotFoundError:
        print(name, "absent")
    except OSError as error:
        print(name, error.strerror)
"""


def test_no_private_key_planted_in_the_hosts_etc_pki_is_read_inside(planted_pki: Path, up_as: Up):
    """The host's own /etc, as RHEL's and Fedora's hold keys, through a real `up` as root and as a user."""
    names = [rel for rel, _, _ in PKI] + [LONG_KEY, "tls/private-link"]
    text = up_as.python(READ_EACH, f"/etc/pki/{planted_pki.name}", *names)
    seen = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.split(" ", 1)[0] in names)
    assert seen == {name: "read" if f"pki/{name}" in PKI_SHOWN and name != "tls/private-link" else "absent"
                    for name in names}, text
