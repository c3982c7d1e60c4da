"""Issue 14, items 1-5: the attacks of the adversarial review, reproduced with a raw client written from the wire
format (wire.py: websockets + msgpack + hmac, not our client class), real server processes, 127.0.0.1 only; every
loop is bounded in count and time."""

import os
import resource
import socket
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from rlrobot.real_robot.client import PolicyClient

from . import wire
from .conftest import TOKEN, ServerProcess, self_signed_certificate

RNG = np.random.default_rng(0)
OBS = [RNG.normal(0, 0.01, (1, 27)).astype(np.float32) for _ in range(8)]  # distinct answers per observation


@pytest.fixture(scope="module")
def srv(expert_checkpoint):
    s = ServerProcess(expert_checkpoint, extra=("--max-connections", "48", "--max-unauthenticated", "8",
                                                "--hello-timeout-s", "1.0"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(srv):
    """The true answer to each of OBS, from a direct authenticated raw session."""
    s = wire.RawSession(srv.url, TOKEN)
    answers = [s.infer(o) for o in OBS]
    s.close()
    assert len({a.tobytes() for a in answers}) == len(OBS)
    return answers


def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Paced:
    """A good client at 20 Hz in a thread: every answer compared with the reference, latency recorded."""

    def __init__(self, url, reference, hz=20.0):
        self.client = PolicyClient(url, token=TOKEN, timeout_s=2.0)
        self.client.connect()
        self.reference, self.period = reference, 1.0 / hz
        self.latencies, self.mismatches, self.errors = [], 0, []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        k, next_t = 0, time.perf_counter()
        while not self._stop.is_set() and k < 2000:
            i = k % len(OBS)
            start = time.perf_counter()
            try:
                answer = self.client.infer({"state": OBS[i]})
                self.latencies.append(time.perf_counter() - start)
                self.mismatches += not np.array_equal(answer, self.reference[i])
            except Exception as e:
                self.errors.append(repr(e))
            k += 1
            next_t += self.period
            time.sleep(max(0.0, next_t - time.perf_counter()))

    def stop(self) -> dict:
        self._stop.set()
        self.thread.join(10)
        self.client.close()
        lat = np.asarray(self.latencies) * 1e3
        return {"n": len(lat), "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
                "max_ms": float(lat.max()), "mismatches": self.mismatches, "errors": self.errors}


# ---------------------------------------------------------------------------------------------- item 1: replay
def test_client_frames_replayed_on_a_new_connection_are_refused(srv, reference):
    """A captured hello + infer sent verbatim on a new connection without the token: refused, never answered."""
    victim = wire.RawSession(srv.url, TOKEN)
    assert np.array_equal(victim.infer(OBS[0]), reference[0])
    captured_hello, captured_infer = victim.sent
    victim.close()
    attacker = wire.RawSession(srv.url, None, hello=False)
    attacker.send({}, raw=captured_hello)
    reply, unsigned = attacker.recv(unsigned=True)
    assert unsigned and reply["type"] == "error" and reply["code"] == "unauthenticated"
    with pytest.raises(ConnectionClosed):  # refused before authentication: the connection is closed
        attacker.ws.send(captured_infer)
        attacker.ws.recv(timeout=5)
    # on a fresh connection the captured infer alone is refused just the same
    attacker = wire.RawSession(srv.url, None, hello=False)
    attacker.send({}, raw=captured_infer)
    reply, _ = attacker.recv(unsigned=True)
    assert reply["type"] == "error" and reply["code"] in ("unauthenticated", "bad_request")


def test_a_frame_is_valid_in_one_direction_only(srv):
    """The server's own signed hello reply reflected back to it is refused (another key per direction)."""
    s = wire.RawSession(srv.url, TOKEN)
    s.send({}, raw=s.received[-1])  # the server's hello reply, s2c-signed
    reply, unsigned = s.recv(unsigned=True)
    assert unsigned and reply["code"] == "unauthenticated"
    s.seq -= 1
    assert s.infer(OBS[0]).shape == (1, 5)  # the session itself goes on
    s.close()


def test_replayed_answers_are_never_executed(srv, reference):
    """A man in the middle without the token replays one old answer 130 times before every real answer (same
    connection) and injects an answer captured on another connection: the client drops and counts them all and
    every answer it returns is the true answer to its own request."""
    stash = {}

    def hook(conn, i, f):
        if conn == 0 and i == 3:
            stash["old"] = f  # the answer to the client's second infer
        if conn == 0 and i >= 4 and "old" in stash:
            return [stash["old"]] * 130 + [f]
        if conn == 1 and i >= 2 and "old" in stash:
            return [stash["old"], f]  # from connection 0: another connection's keys
        return [f]

    mitm = wire.Mitm(srv.url, hook)
    try:
        client = PolicyClient(mitm.url, token=TOKEN, timeout_s=5.0)
        client.connect()
        for k in range(5):
            assert np.array_equal(client.infer({"state": OBS[k]}), reference[k])
        assert client.dropped["seq"] == 3 * 130
        client.close()
        client.connect()  # a new connection through the same relay
        for k in range(3):
            assert np.array_equal(client.infer({"state": OBS[k]}), reference[k])
        assert client.dropped["unauthenticated"] == 3
    finally:
        mitm.close()


# ---------------------------------------------------------------------------------------------- item 2: pairing
@pytest.mark.parametrize("insecure", [False, True])
def test_one_injected_frame_does_not_shift_later_answers(expert_checkpoint, srv, reference, insecure):
    """One junk frame injected before an answer (a duplicate of the previous answer, then junk bytes): the client
    drops it, and every later answer still belongs to its own request (without a token too: request / seq pairing)."""
    server = ServerProcess(expert_checkpoint, token=None) if insecure else srv

    def hook(conn, i, f):
        if i == 3:
            return [mitm.server_frames[conn][2], f]  # the previous answer, valid on this connection
        if i == 5:
            return [bytes(32) + msgpack.packb({"type": "action"}), f]  # unsigned junk
        return [f]

    mitm = wire.Mitm(server.url, hook)
    try:
        client = PolicyClient(mitm.url, token=None if insecure else TOKEN, timeout_s=5.0)
        client.connect()
        for k in range(len(OBS)):
            assert np.array_equal(client.infer({"state": OBS[k]}), reference[k]), k
        assert sum(client.dropped.values()) == 2
        client.close()
    finally:
        mitm.close()
        if insecure:
            server.stop()


# ---------------------------------------------------------------------------------------------- item 3: bombs
def bombs():
    n = 8 * 1024 * 1024 - 4096
    head = b"\x84" + b"".join(msgpack.packb(x) for x in ("type", "infer", "version", 2, "seq"))
    yield "8M empty maps", lambda seq: head + msgpack.packb(seq) + msgpack.packb("obs") + b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    yield "8M empty arrays", lambda seq: head + msgpack.packb(seq) + msgpack.packb("obs") + b"\xdd" + n.to_bytes(4, "big") \
        + b"\x90" * n
    # 64-wide trees of empty maps: within every length limit, but 2^20 containers
    tree = b"\xdc\x00\x40" + (b"\xdc\x00\x40" + b"\xdc\x00\x40" + (b"\xdc\x00\x40" + b"\x80" * 64) * 64) * 4
    yield "wide tree", lambda seq: head + msgpack.packb(seq) + msgpack.packb("obs") + b"\xdc\x00\x40" + tree * 64
    yield "deep nesting", lambda seq: head + msgpack.packb(seq) + msgpack.packb("obs") + b"\x91" * 100_000 + b"\xc0"
    yield "512k-key map", lambda seq: head + msgpack.packb(seq) + msgpack.packb("obs") + b"\xdf" + (1 << 19).to_bytes(4, "big") \
        + b"".join(msgpack.packb(f"k{i}") + b"\xc0" for i in range(1 << 19))
    yield "huge shape", lambda seq: msgpack.packb({"type": "infer", "version": 2, "seq": seq, "obs": {"state": {
        "__ndarray__": True, "dtype": "<f4", "shape": [2**62, 4, 0], "data": b""}}})


def test_bomb_frames_are_refused_fast_while_a_good_client_keeps_its_pace(srv, reference):
    """Signed bomb frames (authenticated peer) are refused as malformed within a bounded time and memory, while a
    good client at 20 Hz keeps getting identical answers and is never stalled (the old server blocked its event loop
    2-11 s per bomb). The latency figure itself (p99 < 50 ms on an idle machine) is measured by the benchmark
    ``python -m rlrobot.real_robot.loadtest --attack bomb``, not asserted here: a loaded CI machine moves it."""
    paced = Paced(srv.url, reference)
    try:
        time.sleep(0.5)
        rss_before = rss_kb(srv.proc.pid)
        s = wire.RawSession(srv.url, TOKEN)
        for name, make in bombs():
            s.seq += 1
            body = make(s.seq)
            start = time.perf_counter()
            s.ws.send(wire.mac(s.c2s, body) + body)
            reply, ok = s.recv()
            took = time.perf_counter() - start
            assert ok and reply["type"] == "error" and reply["code"] == "malformed", (name, reply)
            assert took < 1.0, (name, took)
            # a signed frame the server cannot decode still counts in the sequence: the next one is its seq + 1
        assert np.array_equal(s.infer(OBS[1]), reference[1])
        s.close()
        time.sleep(0.5)
        grew_mb = (rss_kb(srv.proc.pid) - rss_before) / 1024
    finally:
        result = paced.stop()
    assert grew_mb < 150, grew_mb
    assert result["mismatches"] == 0 and not result["errors"] and result["n"] >= 20, result
    assert result["max_ms"] < 1000, result  # no stall: every answer within a second, bombs in flight


def test_insecure_server_refuses_big_frames_before_the_hello(expert_checkpoint):
    srv = ServerProcess(expert_checkpoint, token=None)
    try:
        s = wire.RawSession(srv.url, None, hello=False)
        start = time.perf_counter()
        with pytest.raises(ConnectionClosed, match="1009"):
            s.ws.send(bytes(32) + b"\xdd" + (4 << 20).to_bytes(4, "big") + b"\x80" * (4 << 20))
            s.ws.recv(timeout=5)
        assert time.perf_counter() - start < 1.0
        s = wire.RawSession(srv.url, None)
        assert s.infer(OBS[0]).shape == (1, 5)
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------- item 4: floods
def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_connection_flood_is_capped_and_timed_out(srv, reference):
    """300 idle TCP connections: the server keeps at most --max-connections open, closes those without a hello
    after --hello-timeout-s, a connected client keeps its 20 Hz pace and a new client still gets in."""
    paced = Paced(srv.url, reference)
    fds_before = open_fds(srv.proc.pid)
    socks = []
    try:
        for _ in range(300):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=2))
        time.sleep(0.3)
        assert open_fds(srv.proc.pid) <= fds_before + 48 + 4
        late = PolicyClient(srv.url, token=TOKEN, timeout_s=2.0)  # evicts the oldest unauthenticated connection
        late.connect()
        assert np.array_equal(late.infer({"state": OBS[2]}), reference[2])
        late.close()
        time.sleep(1.6)  # past the hello deadline: every idle connection the server kept is closed
        for s in socks:
            s.settimeout(0.5)
            try:
                assert s.recv(4096) is not None  # EOF (b"") or the HTTP 4xx / close bytes, then EOF
            except (ConnectionResetError, TimeoutError):
                pass
        assert open_fds(srv.proc.pid) <= fds_before + 2
    finally:
        for s in socks:
            s.close()
        result = paced.stop()
    assert result["mismatches"] == 0 and not result["errors"] and result["max_ms"] < 1000, result  # never stalled
    stats = PolicyClient(srv.url, token=TOKEN).stats()["connections"]
    assert stats.get("refused", 0) + stats.get("evicted", 0) >= 250 and stats["closed_unauthenticated"] >= 8


def test_fd_exhaustion_log_is_rate_limited(expert_checkpoint, tmp_path):
    """With the fd limit at 64 and no connection cap to speak of, a flood makes accept() fail: the server logs a
    few lines, not megabytes of tracebacks, and serves again once the flood is gone."""
    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    log_path = tmp_path / "stderr.txt"
    args = [sys.executable, "-m", "rlrobot", "serve", "--checkpoint", str(expert_checkpoint), "--port", "0",
            "--token", TOKEN, "--max-connections", "1000", "--max-unauthenticated", "1000", "--hello-timeout-s", "1"]
    with open(log_path, "w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=low_fd_limit,
                                env={**os.environ, "MUJOCO_GL": "egl"})
    try:
        line = ""
        deadline = time.time() + 60
        while time.time() < deadline and '"listening"' not in line:
            line = proc.stdout.readline()
        port = int(line.split('"url": "ws://127.0.0.1:')[1].split('"')[0])
        socks = []
        for _ in range(200):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                break
        time.sleep(3.0)
        for s in socks:
            s.close()
        time.sleep(1.5)
        client = PolicyClient(f"ws://127.0.0.1:{port}", token=TOKEN, timeout_s=3.0)
        assert client.connect()["task"] == "so101-reach"
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
    size = log_path.stat().st_size
    text = log_path.read_text()
    assert size < 30_000 and text.count("out of system resource") <= 5, (size, text[:2000])


def test_log_rate_limit_filter():
    """A flood of one message kind is cut to a burst per window; the next window's first record reports the count."""
    import logging

    from rlrobot.real_robot.server import RateLimitFilter

    limiter = RateLimitFilter(burst=5, window_s=0.2)
    record = lambda: logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "accept failed", None, None)  # noqa: E731
    passed = sum(limiter.filter(record()) for _ in range(10_000))
    assert passed == 5
    time.sleep(0.25)
    r = record()
    assert limiter.filter(r) and "9995 similar messages suppressed" in r.msg


# ---------------------------------------------------------------------------------------------- item 5: misc
def test_insecure_needs_a_host_that_resolves_to_loopback_only(expert_checkpoint):
    from rlrobot.real_robot.server import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("127.0.0.1.example.com") and not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    p = subprocess.run([sys.executable, "-m", "rlrobot", "serve", "--checkpoint", str(expert_checkpoint), "--insecure",
                        "--host", "127.0.0.1.example.com"], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "RLROBOT_TOKEN"})
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "loopback" in out and "Traceback" not in out


def test_tls_serves_wss_and_the_client_verifies_the_certificate(expert_checkpoint, tmp_path):
    cert, key = self_signed_certificate(tmp_path)
    srv = ServerProcess(expert_checkpoint, extra=("--host", "127.0.0.1", "--tls-cert", str(cert), "--tls-key", str(key)))
    try:
        assert srv.url.startswith("wss://127.0.0.1:")
        # a generous timeout: this checks TLS, not speed (a loaded CI machine once took > 1 s for the first handshake)
        client = PolicyClient(srv.url, token=TOKEN, tls_ca=str(cert), timeout_s=10.0)
        assert client.connect()["task"] == "so101-reach"
        assert client.infer({"state": OBS[0]}).shape == (1, 5)
        client.close()
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):  # the system CAs do not know it
            PolicyClient(srv.url, token=TOKEN, timeout_s=10.0).connect()
        with pytest.raises(ConnectionError):  # plaintext to a TLS port
            PolicyClient(srv.url.replace("wss://", "ws://"), token=TOKEN, timeout_s=10.0).connect()
    finally:
        srv.stop()

