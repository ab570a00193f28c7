"""The way in's sender (§4): real POSTs to real stand-in way ins
(`lnk-link-run way-in`) over TCP and a Unix socket."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import socket
import subprocess
import time

import pytest
from conftest import SERVER, clean_env, REPO, wait_for
from standin_helpers import AGENT, ID, KEY, message, record, write_key

from linkrun.messages import told, wayin

# -- delivery ----------------------------------------------------------------

def test_a_signed_message_is_told_and_printed_with_its_agent(way_ins, keyring):
    way_in = way_ins()
    assert way_in.address.startswith("http://127.0.0.1:") and way_in.address.endswith("/in")
    assert not way_in.address.startswith("http://127.0.0.1:0/")
    data = message()
    delivery = wayin.send(way_in.address, AGENT, str(keyring), data)
    assert delivery.outcome == "told", delivery
    assert delivery.retry_after is None
    assert "200" in delivery.detail
    wait_for(lambda: way_in.out, what="the delivered line")
    assert way_in.messages() == [json.loads(data) | {"agent": AGENT}]


def test_a_unix_socket_way_in_is_told(way_ins, keyring, short_dir):
    socket_path = short_dir / "way-in.sock"
    way_in = way_ins(listen=f"unix:{socket_path}")
    assert way_in.address == f"unix:{socket_path}"
    assert (socket_path.stat().st_mode & 0o077) == 0  # only its user may connect
    delivery = wayin.send(way_in.address, AGENT, str(keyring), message())
    assert delivery.outcome == "told", delivery
    wait_for(lambda: way_in.out, what="the delivered line")
    assert way_in.messages()[0]["from"] == f"run:{ID}"
    assert way_in.stop() == 0
    assert not socket_path.exists()  # it removes its socket on the way out


def test_sigterm_while_messages_are_in_flight_ends_it_at_once_with_exit_0(way_ins, keyring):
    """The TERM may reach any of its threads; the handlers' last lines are written before it exits."""
    import threading

    for _ in range(8):
        way_in = way_ins()
        senders = [threading.Thread(target=wayin.send, args=(way_in.address, AGENT, str(keyring),
                                                             message(id=f"{n:016d}")))
                   for n in range(12)]
        for sender in senders:
            sender.start()
        wait_for(lambda w=way_in: w.out, what="a first message delivered", interval=0.001)
        assert way_in.stop() == 0, way_in.err[-5:]
        for sender in senders:
            sender.join()


def test_a_repeated_from_is_answered_but_delivered_once(way_ins, keyring):
    way_in = way_ins()
    first = message()
    assert wayin.send(way_in.address, AGENT, str(keyring), first).outcome == "told"
    assert wayin.send(way_in.address, AGENT, str(keyring), first).outcome == "told"
    # A third, different message: once it is printed, the repeat was handled before it.
    third = message(id="bbbbbbbbbbbbbbbb")
    assert wayin.send(way_in.address, AGENT, str(keyring), third).outcome == "told"
    wait_for(lambda: len(way_in.out) >= 2, what="the third message")
    assert [m["from"] for m in way_in.messages()] == [f"run:{ID}", "run:bbbbbbbbbbbbbbbb"]
    assert any("repeat of run:" in line for line in way_in.err)


def test_the_signature_is_hmac_sha256_over_agent_date_and_the_exact_body(way_ins, keyring):
    """Written here from §4 by hand, not with wayin's own function: both sides follow the spec."""
    way_in = way_ins()
    port = int(way_in.address.split(":")[2].split("/")[0])
    data = message()
    date = str(int(time.time()))
    sign = hmac.new(KEY, AGENT.encode() + b"\n" + date.encode() + b"\n" + data, hashlib.sha256).hexdigest()
    assert wayin.signature(KEY, AGENT, date, data) == sign
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/in", body=data, headers={
            "Content-Type": "application/json", "Link-Agent": AGENT, "Link-Date": date, "Link-Signature": sign})
        assert connection.getresponse().status == 200
        # One byte more than was signed: refused.
        connection.close()
        connection.request("POST", "/in", body=data + b" ", headers={
            "Content-Type": "application/json", "Link-Agent": AGENT, "Link-Date": date, "Link-Signature": sign})
        assert connection.getresponse().status == 401
    finally:
        connection.close()


def test_the_signature_matches_the_documented_test_vector():
    # docs/way-in.md gives this vector, computed there with openssl.
    assert wayin.signature(b"example key", "main", "1700000000", b'{"from":"run:abcdefghijkmnpq2"}') == (
        "122a4f6b3b60d00e9f7ac91df240028902cb7eed01190f4e2e18fbbc321058b4")


def test_the_key_is_its_raw_bytes_with_trailing_white_space_stripped(way_ins, tmp_path, keyring):
    sender = tmp_path / "sender-keyring"
    write_key(sender, key=KEY + b" \t\r\n\n")
    way_in = way_ins()
    assert wayin.send(way_in.address, AGENT, str(sender), message()).outcome == "told"


def test_a_forged_signature_is_refused_and_given_up_after_one_more_try(way_ins, tmp_path):
    forger = tmp_path / "forger-keyring"
    write_key(forger, key=b"not the agent's key")
    way_in = way_ins()
    delivery = wayin.send(way_in.address, AGENT, str(forger), message())
    assert delivery.outcome == "given up", delivery
    assert "401" in delivery.detail and "twice" in delivery.detail
    wait_for(lambda: sum("refused 401" in line and "Signature" in line for line in way_in.err) == 2,
             what="two refusals")
    assert way_in.out == []


def test_an_unknown_agent_is_refused(way_ins, tmp_path):
    stranger = tmp_path / "stranger-keyring"
    write_key(stranger, agent="stranger")
    way_in = way_ins()
    delivery = wayin.send(way_in.address, "stranger", str(stranger), message())
    assert delivery.outcome == "given up", delivery
    wait_for(lambda: any("unknown agent" in line for line in way_in.err), what="the refusal")


def test_a_stale_date_is_refused_and_given_up(way_ins, keyring):
    way_in = way_ins()
    delivery = wayin.send(way_in.address, AGENT, str(keyring), message(), now=lambda: time.time() - 1000)
    assert delivery.outcome == "given up", delivery
    assert "401" in delivery.detail
    wait_for(lambda: any("Link-Date" in line for line in way_in.err), what="the refusal")
    # Within 300 s either way is accepted.
    early = wayin.send(way_in.address, AGENT, str(keyring), message(), now=lambda: time.time() + 200)
    assert early.outcome == "told", early


# A key's problem is the user's to mend, as serve says: not reached (tried again, then by the sweeps), not final.
def test_a_key_that_others_may_read_is_not_reached_saying_what_to_fix(tmp_path):
    path = write_key(tmp_path / "keyring", mode=0o644)
    # No way in is needed: the key is refused before anything is sent.
    delivery = wayin.send("http://127.0.0.1:9/in", AGENT, str(tmp_path / "keyring"), message())
    assert delivery.outcome == "not reached", delivery
    assert str(path) in delivery.detail and "chmod 600" in delivery.detail and "0644" in delivery.detail


def test_a_key_that_is_a_symbolic_link_is_never_followed(way_ins, tmp_path):
    real = write_key(tmp_path / "elsewhere")
    links = tmp_path / "links"
    links.mkdir(mode=0o700)
    (links / f"{AGENT}.key").symlink_to(real)
    delivery = wayin.send("http://127.0.0.1:9/in", AGENT, str(links), message())
    assert delivery.outcome == "not reached", delivery
    assert "symbolic link" in delivery.detail
    # The stand-in holds its keyring to the same rule.
    way_in = way_ins(keys=links)
    delivery = wayin.send(way_in.address, AGENT, str(tmp_path / "elsewhere"), message())
    assert delivery.outcome == "given up", delivery
    wait_for(lambda: any("symbolic link" in line for line in way_in.err), what="the refusal")


def test_a_missing_key_is_not_reached_saying_where_it_belongs(tmp_path):
    (tmp_path / "empty").mkdir()
    delivery = wayin.send("http://127.0.0.1:9/in", AGENT, str(tmp_path / "empty"), message())
    assert delivery.outcome == "not reached", delivery
    assert f"{AGENT}.key is missing" in delivery.detail and "0600" in delivery.detail


@pytest.mark.parametrize("status", [503, 429])
def test_a_busy_way_in_is_not_reached_and_its_retry_after_is_kept(way_ins, keyring, status):
    way_in = way_ins("--status", str(status), "--retry-after", "7")
    delivery = wayin.send(way_in.address, AGENT, str(keyring), message())
    assert delivery.outcome == "not reached", delivery
    assert delivery.retry_after == 7
    assert str(status) in delivery.detail


@pytest.mark.parametrize("status", [500, 408])
def test_a_server_error_or_request_timeout_is_not_reached(way_ins, keyring, status):
    way_in = way_ins("--status", str(status))
    delivery = wayin.send(way_in.address, AGENT, str(keyring), message())
    assert (delivery.outcome, delivery.retry_after) == ("not reached", None), delivery


def test_a_401_is_tried_once_more_then_given_up(way_ins, keyring):
    way_in = way_ins("--status", "401")
    delivery = wayin.send(way_in.address, AGENT, str(keyring), message())
    assert delivery.outcome == "given up", delivery
    wait_for(lambda: sum("answered 401" in line for line in way_in.err) == 2, what="two tries")


@pytest.mark.parametrize("status", [403, 404, 302])
def test_any_other_answer_is_final(way_ins, keyring, status):
    way_in = way_ins("--status", str(status))
    delivery = wayin.send(way_in.address, AGENT, str(keyring), message())
    assert delivery.outcome == "given up", delivery
    assert str(status) in delivery.detail
    wait_for(lambda: sum("answered" in line for line in way_in.err) == 1, what="one try")


def test_a_body_that_is_not_a_told_message_is_refused_with_400(way_ins, keyring):
    way_in = way_ins()
    not_json = wayin.send(way_in.address, AGENT, str(keyring), b"not json")
    assert not_json.outcome == "given up" and "400" in not_json.detail, not_json
    lacking = json.loads(message())
    del lacking["thread"]
    delivery = wayin.send(way_in.address, AGENT, str(keyring), json.dumps(lacking).encode())
    assert delivery.outcome == "given up" and "400" in delivery.detail, delivery
    assert "thread" in delivery.detail  # the way in's reason reaches the log
    assert way_in.out == []


def test_a_wrong_path_is_given_up(way_ins, keyring):
    way_in = way_ins()
    delivery = wayin.send(way_in.address.replace("/in", "/elsewhere"), AGENT, str(keyring), message())
    assert delivery.outcome == "given up" and "404" in delivery.detail, delivery


def test_a_slow_way_in_is_not_reached_at_the_request_timeout(way_ins, keyring, monkeypatch):
    monkeypatch.setattr(wayin, "REQUEST_TIMEOUT", 0.5)
    way_in = way_ins("--delay", "30")
    started = time.monotonic()
    delivery = wayin.send(way_in.address, AGENT, str(keyring), message())
    assert time.monotonic() - started < 5
    assert delivery.outcome == "not reached", delivery
    assert "no answer within 0.5 s" in delivery.detail


def test_a_port_with_no_listener_is_not_reached(keyring, short_dir):
    # Bound but not listening: the port is ours, and a connection to it is refused.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        delivery = wayin.send(f"http://127.0.0.1:{port}/in", AGENT, str(keyring), message())
    assert delivery.outcome == "not reached", delivery
    assert "refused" in delivery.detail
    missing = wayin.send(f"unix:{short_dir}/none.sock", AGENT, str(keyring), message())
    assert missing.outcome == "not reached", missing


def test_a_connection_that_hangs_is_not_reached_at_the_connect_timeout(keyring, monkeypatch):
    monkeypatch.setattr(wayin, "CONNECT_TIMEOUT", 0.3)
    # A listener that never accepts, with its backlog full: the kernel drops
    # further SYNs, so a connect hangs as it would to a stalled host.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):
                filler = socket.socket()
                fillers.append(filler)
                filler.settimeout(0.2)
                try:
                    filler.connect(("127.0.0.1", port))
                except TimeoutError:
                    break
            else:
                pytest.skip("this kernel does not let a listen backlog fill")
            started = time.monotonic()
            delivery = wayin.send(f"http://127.0.0.1:{port}/in", AGENT, str(keyring), message())
            assert time.monotonic() - started < 2
        finally:
            for filler in fillers:
                filler.close()
    assert delivery.outcome == "not reached", delivery
    assert "could not connect within 0.3 s" in delivery.detail


def test_an_address_that_is_not_local_is_given_up(keyring):
    for address in ("http://example.org/in", "https://127.0.0.1:1/in", "unix:relative.sock", "http://127.0.0.1:0/in"):
        delivery = wayin.send(address, AGENT, str(keyring), message())
        assert delivery.outcome == "given up", (address, delivery)


def test_a_relative_or_missing_keyring_is_given_up(keyring):
    for folder in ("", "keyring"):
        delivery = wayin.send("http://127.0.0.1:9/in", AGENT, folder, message())
        assert delivery.outcome == "given up" and "absolute" in delivery.detail, delivery


def test_importing_the_sender_and_the_message_loads_nothing_the_supervisor_does_not_need():
    done = subprocess.run(
        SERVER[:2] + ["-c", "import sys, linkrun.messages.told, linkrun.messages.wayin; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, env=clean_env(), cwd=str(REPO), timeout=30, check=True)
    loaded = set(done.stdout.decode().split())
    for heavy in ("http", "http.client", "http.server", "email", "json", "datetime", "orjson",
                  "watchdog", "linkrun.config", "linkrun.front.server", "linkrun.front.tools"):
        assert heavy not in loaded, heavy


def test_the_delivered_text_arrives_as_it_was_written(way_ins, keyring):
    way_in = way_ins()
    r = record(bytes=20)
    text = told.told_text(r, "résumé ✓\n".encode())
    assert wayin.send(way_in.address, AGENT, str(keyring), told.body(r, text)).outcome == "told"
    wait_for(lambda: way_in.out, what="the delivered line")
    assert way_in.messages()[0]["text"] == text
