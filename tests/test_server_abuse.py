"""A flood of slow or half-sent requests must not take the server down: a real `gradfuse serve` process on
loopback, a bounded number of misbehaving clients, and a keyed request served meanwhile."""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from urllib.parse import urlparse

import httpx

from live_server import gradfuse_serve

from gradfuse.server import API_KEY_ENV

KEY = "abuse-test-key"
MAX_CONNECTIONS = 24


def _config(tmp_path, workspace) -> str:
    path = tmp_path / "gradfuse.toml"
    path.write_text(f'workspace = "{workspace.root}"\n[server]\nmax_connections = {MAX_CONNECTIONS}\n'
                    f'max_client_connections = {MAX_CONNECTIONS}\n'  # every test client is 127.0.0.1 here
                    'header_timeout_s = 3.0\nbody_timeout_s = 4.0\nkeep_alive_s = 600.0\n')
    return str(path)


def _open(url: str, source: str | None = None) -> socket.socket:
    """A connection to the server, from `source` (another loopback address, as another client) if given."""
    parsed = urlparse(url)
    return socket.create_connection((parsed.hostname, parsed.port), timeout=30,
                                    source_address=(source, 0) if source else None)


def _closed_by_server(sock: socket.socket, within_s: float) -> bytes | None:
    """What the server sent before it closed the connection, or None if it is still open after `within_s`."""
    sock.settimeout(within_s)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


def _search(url: str) -> httpx.Response:
    return httpx.post(url + "/search", json={"query": "moons of Mars", "method": "rrf", "k": 2},
                      headers={"X-API-Key": KEY}, timeout=30)


def test_slow_and_surplus_clients_are_cut_off_while_keyed_requests_are_served(workspace, tmp_path):
    with ExitStack() as stack:
        log = tmp_path / "server.log"
        url = stack.enter_context(gradfuse_serve(workspace.root, "--config", _config(tmp_path, workspace),
                                                 env={API_KEY_ENV: KEY}, log=log))
        sockets = []
        for _ in range(14):  # never finish their headers
            sock = stack.enter_context(_open(url))
            sock.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            sockets.append(sock)
        bodies = []
        for _ in range(4):  # finish their headers, never their body
            sock = stack.enter_context(_open(url))
            sock.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"X-API-Key: " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"query\": ")
            bodies.append(sock)
        time.sleep(0.5)
        assert _search(url).status_code == 200  # served while 18 slow clients hold connections

        surplus = [stack.enter_context(_open(url)) for _ in range(40)]  # 18 + 40 is beyond the cap of 24
        closed_unread = [s for s in surplus if _closed_by_server(s, 2.0) is not None]
        assert len(closed_unread) >= 40 - (MAX_CONNECTIONS - 18)

        # The slow ones are cut off at their deadlines: headers at 3 s (closed), bodies at 4 s (408).
        assert all(_closed_by_server(s, 10.0) is not None for s in sockets)
        for sock in bodies:
            answer = _closed_by_server(sock, 10.0)
            assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        for sock in surplus:
            sock.close()
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
        assert _search(url).status_code == 200
    refused = [line for line in log.read_text().splitlines() if "refused a connection" in line]
    assert 1 <= len(refused) <= 10  # each refusal is logged, and a flood of them at most 10 times a minute


def test_a_kept_alive_connection_that_stalls_its_next_request_is_closed_by_the_header_deadline(workspace,
                                                                                            tmp_path):
    with gradfuse_serve(workspace.root, "--config", _config(tmp_path, workspace), env={API_KEY_ENV: ""}) as url:
        with _open(url) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.settimeout(10)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request, stalled mid-headers
            started = time.monotonic()
            assert _closed_by_server(sock, 30.0) is not None
            # keep_alive_s is 600 here: what closed it is the 3 s header deadline
            assert time.monotonic() - started < 20


def _ask_and_leave(url: str, wait_s: float) -> None:
    """A streamed /ask whose client leaves `wait_s` after sending it (0: at once), before any answer."""
    body = b'{"query": "Which planet has two moons?", "method": "rrf", "k": 2, "stream": true}'
    with _open(url) as sock:
        sock.sendall(b"POST /ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(wait_s)


def test_streamed_asks_whose_clients_leave_early_give_their_place_in_the_lm_line_back(workspace, tmp_path):
    config = tmp_path / "lm-line.toml"
    config.write_text(f'workspace = "{workspace.root}"\n[generator]\nanswer = "generate"\n[server]\nlm_queue = 2\n')
    with gradfuse_serve(workspace.root, "--config", str(config), env={API_KEY_ENV: ""}) as url:
        for wait_s in (0.0, 0.0, 0.0, 0.05, 0.2, 0.3):  # three times the line, each gone before its answer
            _ask_and_leave(url, wait_s)
        deadline, status = time.monotonic() + 60, None
        while time.monotonic() < deadline:  # the abandoned ones may still be finishing: they must end
            status = httpx.post(url + "/ask", json={"query": "Which planet has two moons?", "method": "rrf",
                                                    "k": 2, "max_new_tokens": 4}, timeout=60).status_code
            if status == 200:
                break
            time.sleep(1)
        assert status == 200, "the LM line stayed full after its clients left"
        searched = httpx.post(url + "/search", json={"query": "moons", "method": "upr", "k": 2, "n": 2}, timeout=120)
        assert searched.status_code == 200


def test_the_access_log_is_written_and_capped_per_line_not_per_template(workspace, tmp_path):
    """Access lines differ by client port: keyed on the formatted line, no cap merges them (keyed on the template,
    all of them and every traceback shared one cap of 10 a minute)."""
    log = tmp_path / "access.log"
    with gradfuse_serve(workspace.root, "--log-level", "info", env={API_KEY_ENV: ""}, log=log) as url:
        for _ in range(15):
            httpx.get(url + "/healthz", timeout=10)
        for _ in range(2):
            assert httpx.get(url + "/options", timeout=10).status_code == 200
        huge = httpx.post(url + "/search", json={"query": "moons", "k": 10**400}, timeout=10)
        assert huge.status_code == 422 and "less than or equal" in huge.json()["detail"]
        time.sleep(0.5)
    text = log.read_text()
    assert "Logging error" not in text, text[:2000]
    health = [line for line in text.splitlines() if '"GET /healthz HTTP/1.1" 200' in line]
    options = [line for line in text.splitlines() if '"GET /options HTTP/1.1" 200' in line]
    assert len(health) >= 15 and len(options) == 2, text[-2000:]


def test_one_client_address_cannot_hold_every_connection(workspace, tmp_path):
    config = tmp_path / "per-client.toml"
    config.write_text(f'workspace = "{workspace.root}"\n[server]\nmax_connections = 12\n'
                      'max_client_connections = 4\nheader_timeout_s = 30.0\n')
    with ExitStack() as stack:
        url = stack.enter_context(gradfuse_serve(workspace.root, "--config", str(config), env={API_KEY_ENV: ""}))
        greedy = [stack.enter_context(_open(url, "127.0.0.2")) for _ in range(12)]  # never send a byte
        for sock in greedy:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # half a request: held until the header deadline
        held = [s for s in greedy if _closed_by_server(s, 1.0) is None]
        assert len(held) == 4  # the rest were closed unread
        answer = httpx.post(url + "/search", json={"query": "moons of Mars", "method": "rrf", "k": 2}, timeout=30)
        assert answer.status_code == 200  # another client still gets in
