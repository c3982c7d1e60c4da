"""Every expected failure of ``rlrobot deploy`` / ``rlrobot serve`` ends in the CLI's one-line ``error: ...`` (exit 2)
naming the cause and what to check, never a traceback. Real sockets on 127.0.0.1, each case bounded."""

import socket
import ssl
import threading
import time

import pytest

from rlrobot.cli import main
from rlrobot.real_robot import protocol

from .conftest import TOKEN, ServerProcess, self_signed_certificate


@pytest.fixture(scope="module")
def token_server(expert_checkpoint):
    srv = ServerProcess(expert_checkpoint)
    yield srv
    srv.stop()


def one_line_error(capsys, argv, monkeypatch, within_s=15.0):
    """Run the CLI; assert exit code 2 and exactly one output line, ``error: ...``; return that line."""
    monkeypatch.delenv("RLROBOT_TOKEN", raising=False)
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert time.monotonic() - start < within_s
    assert exit_info.value.code == 2
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.out + out.err, lines
    return lines[0]


def deploy_argv(url, *extra):
    return ["deploy", "--robot", "twin", "--server", url, "--episodes", "1", "--timeout-s", "1", *extra]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """A loopback TCP listener that answers each connection with ``respond(conn)`` (raw bytes, TLS, nothing)."""

    def __init__(self, respond, tls: ssl.SSLContext | None = None):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.respond, self.tls, self.stopped = respond, tls, False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(3.0)
            try:
                if self.tls is not None:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                self.respond(conn)
            except OSError:
                pass
            finally:
                conn.close()

    def close(self):
        self.stopped = True
        self.thread.join(5)
        self.sock.close()


def test_wrong_or_missing_token(token_server, capsys, monkeypatch):
    line = one_line_error(capsys, deploy_argv(token_server.url, "--token", "wrong"), monkeypatch)
    assert "refused authentication" in line and "--token" in line and "RLROBOT_TOKEN" in line
    line = one_line_error(capsys, deploy_argv(token_server.url), monkeypatch)
    assert "no token was given" in line


def test_server_unreachable(capsys, monkeypatch):
    line = one_line_error(capsys, deploy_argv(f"ws://127.0.0.1:{free_port()}", "--token", TOKEN), monkeypatch)
    assert "cannot reach the policy server" in line and "rlrobot serve" in line and "port" in line


def test_server_that_never_answers_times_out(capsys, monkeypatch):
    silent = FakeServer(lambda conn: time.sleep(2.5))
    try:
        line = one_line_error(capsys, deploy_argv(f"ws://127.0.0.1:{silent.port}", "--token", TOKEN), monkeypatch)
    finally:
        silent.close()
    assert "did not complete the handshake" in line and "--timeout-s" in line


def test_tls_certificate_that_does_not_verify(tmp_path, capsys, monkeypatch):
    cert, key = self_signed_certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    tls = FakeServer(lambda conn: conn.recv(1024), tls=context)
    try:  # the system CAs do not know a self-signed certificate
        line = one_line_error(capsys, deploy_argv(f"wss://127.0.0.1:{tls.port}", "--token", TOKEN), monkeypatch)
    finally:
        tls.close()
    assert "cannot be verified" in line and "CERTIFICATE_VERIFY_FAILED" in line and "--tls-ca" in line


def test_protocol_version_mismatch(capsys, monkeypatch):
    """A server of another protocol version: its challenge says so, and the client says what to do."""
    from websockets.sync.server import serve

    def handler(ws):
        ws.send(protocol.encode({"type": "challenge", "version": 1, "seq": 0, "nonce": bytes(32)}, None))
        try:
            ws.recv(timeout=2)
        except Exception:
            pass

    with serve(handler, "127.0.0.1", 0) as ws_server:
        thread = threading.Thread(target=ws_server.serve_forever, daemon=True)
        thread.start()
        try:
            port = ws_server.socket.getsockname()[1]
            line = one_line_error(capsys, deploy_argv(f"ws://127.0.0.1:{port}", "--token", TOKEN), monkeypatch)
        finally:
            ws_server.shutdown()
            thread.join(5)
    assert "another protocol version" in line and f"protocol {protocol.PROTOCOL_VERSION}" in line


def test_not_a_websocket_server(capsys, monkeypatch):
    http = FakeServer(lambda conn: (conn.recv(4096), conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")))
    try:
        line = one_line_error(capsys, deploy_argv(f"ws://127.0.0.1:{http.port}", "--token", TOKEN), monkeypatch)
    finally:
        http.close()
    assert "did not complete the handshake" in line and "rlrobot serve" in line


def test_serve_on_a_port_in_use(expert_checkpoint, capsys, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = one_line_error(capsys, ["serve", "--checkpoint", str(expert_checkpoint), "--port", str(port),
                                       "--token", TOKEN], monkeypatch, within_s=60)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line
