"""Policy server: ``rlrobot serve --checkpoint PATH --host 127.0.0.1 --port P`` (websocket, msgpack frames).

Each connection gets a ``challenge`` (a fresh nonce) and must answer with an authenticated ``hello`` within
``--hello-timeout-s``; the reply carries the policy's metadata and every later frame is authenticated with keys of
that connection (PROTOCOL.md). Then ``infer`` requests get ``action`` replies. The server is bounded against hostile
peers: at most ``--max-connections`` TCP connections, counted from accept() whether or not they use TLS (of which
at most ``--max-unauthenticated`` before their hello, and a reserve of those for connections that started a websocket
handshake: a new silent one evicts the oldest silent one of the busiest source), every connection not authenticated
``--hello-timeout-s`` after accept() is dropped, frames over the size limit are refused, large frames are decoded
off the event loop by a decoder whose every length is capped, and its own log is rate-limited. Anything wrong in an
authenticated session's frame gets an ``error`` frame and the connection stays usable; before authentication an
error frame (unsigned) is followed by closing the connection. Inference runs in a worker thread, one at a time, so
slow inference never stalls the event loop that serves the other clients.

No connection, authenticated or not, can take more than its share: each has a byte budget (``--byte-rate`` bytes/s,
``--byte-burst`` at once); reading from a connection over it waits until it refills, so its bytes stay in the
kernel and TCP pushes back on the sender, and one that stays over it for ``--budget-close-s`` is closed. Decoding
large frames and inference take fair turns: a free worker goes to the waiting connection that has used the least.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import ipaddress
import itertools
import json
import logging
import math
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import protocol
from .stats import RunningStats

log = logging.getLogger("rlrobot.server")

FRAME_SLACK_BYTES = 64 * 1024
"""frames up to this much over the limit are still read and answered with an ``oversized`` error; larger ones close
the connection (websocket close code 1009) before they are buffered"""
CLOSE_TIMEOUT_S = 1.0
"""how long a closing handshake may take before the connection is dropped (websockets' default is 10 s)"""
PING_INTERVAL_S = 5.0
"""keepalive: an authenticated peer that does not answer a ping within this long (one stalled mid-frame cannot) is
closed, after at most twice this"""
OFFLOAD_DECODE_BYTES = 64 * 1024
"""frames larger than this are authenticated and decoded in a worker thread, off the event loop"""
MIB = 1024 * 1024


@dataclass
class ServeArgs:
    checkpoint: str
    """a checkpoint directory or a run directory (its latest checkpoint)"""
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    """shared secret: every frame carries an HMAC-SHA256 with keys derived from it (also read from RLROBOT_TOKEN)"""
    insecure: bool = False
    """serve without a token (refused unless the host resolves only to loopback addresses)"""
    tls_cert: str | None = None
    """PEM certificate (chain) to serve wss:// (TLS); give with --tls-key"""
    tls_key: str | None = None
    """PEM private key of --tls-cert"""
    max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES
    """largest frame accepted after authentication (1 KiB .. 256 MiB)"""
    max_connections: int = 64
    """open TCP connections at most; more are closed at once"""
    max_unauthenticated: int = 32
    """connections that have not yet sent an authenticated hello, at most; a quarter (at least 1) is kept for those that
    started a websocket handshake (a new silent connection evicts the oldest silent one of the busiest source)"""
    hello_timeout_s: float = 5.0
    """a connection that has not authenticated this long after accept() (TLS and websocket handshakes included) is
    dropped"""
    byte_rate: int = 32 * MIB
    """bytes per second one connection may send on average (64 KiB/s .. 1 GiB/s); above it the server reads from
    that connection only as its budget refills, so the sender blocks (TCP back-pressure)"""
    byte_burst: int = 16 * MIB
    """bytes one connection may send at once before --byte-rate applies (64 KiB .. 1 GiB)"""
    budget_close_s: float = 10.0
    """a connection whose reading has waited this long for its byte budget, without the budget refilling in between,
    is closed (1 .. 3600 s)"""
    device: str = "cpu"

    def validate(self) -> None:
        """One clear error naming the field and what is allowed, before anything is loaded."""
        if not 0 <= self.port < 65536:
            raise ValueError(f"port={self.port} is not in 0..65535")
        if not 1024 <= self.max_frame_bytes <= 256 * 1024 * 1024:
            raise ValueError(f"max_frame_bytes={self.max_frame_bytes} is not in 1024..268435456")
        if not 1 <= self.max_connections <= 65536:
            raise ValueError(f"max_connections={self.max_connections} is not in 1..65536")
        if not 1 <= self.max_unauthenticated <= self.max_connections:
            raise ValueError(f"max_unauthenticated={self.max_unauthenticated} is not in 1..max_connections "
                             f"({self.max_connections})")
        if not (math.isfinite(self.hello_timeout_s) and 0 < self.hello_timeout_s <= 300):
            raise ValueError(f"hello_timeout_s={self.hello_timeout_s} is not a number in (0, 300]")
        for flag, value in (("byte_rate", self.byte_rate), ("byte_burst", self.byte_burst)):
            if type(value) is not int or not 64 * 1024 <= value <= 1024 * MIB:
                raise ValueError(f"{flag}={value} (--{flag.replace('_', '-')}) is not an integer in 65536..1073741824 "
                                 f"(bytes{'/s' if flag == 'byte_rate' else ''} per connection)")
        if not (math.isfinite(self.budget_close_s) and 1 <= self.budget_close_s <= 3600):
            raise ValueError(f"budget_close_s={self.budget_close_s} (--budget-close-s) is not a number of seconds in "
                             f"1..3600")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together (PEM files)")
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}={path!r} is not a readable file")


def is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {info[4][0].split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def resolve_secret(token: str | None, insecure: bool, host: str) -> bytes | None:
    import os

    token = token or os.environ.get("RLROBOT_TOKEN")
    if token:
        return token.encode()
    if not insecure:
        raise ValueError("a token is required (--token or RLROBOT_TOKEN); pass --insecure to serve without one on loopback")
    if not is_loopback(host):
        raise ValueError(f"--insecure is only allowed on a host that resolves to loopback addresses only (127.0.0.0/8, "
                         f"::1), not {host!r}")
    return None


class RateLimitFilter(logging.Filter):
    """At most ``burst`` records of one kind (logger + message template) per ``window_s``; the next record after a
    quiet window says how many were dropped. A flood of hostile connections cannot fill the disk with tracebacks."""

    def __init__(self, burst: int = 5, window_s: float = 10.0, max_kinds: int = 256):
        super().__init__()
        self.burst, self.window_s, self.max_kinds = burst, window_s, max_kinds
        self.kinds: dict[tuple[str, str], list[float]] = {}  # kind -> [window start, count, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "authenticated", False):  # only a token holder can cause these: never dropped
            return True
        now = time.monotonic()
        kind = (record.name, str(record.msg)[:100])
        state = self.kinds.get(kind)
        if state is None:
            if len(self.kinds) >= self.max_kinds:
                self.kinds.clear()
            state = self.kinds[kind] = [now, 0, 0]
        if now - state[0] >= self.window_s:
            if state[2]:
                record.msg = f"{record.msg} [{int(state[2])} similar messages suppressed in the last {self.window_s:.0f} s]"
            state[:] = [now, 0, 0]
        state[1] += 1
        if state[1] > self.burst:
            state[2] += 1
            return False
        return True


WS_LOGGER = "rlrobot.server.websockets"
"""the websockets library logs here: its errors only (a failed opening handshake is part of the connection's line)"""


class _DropHandshakeFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "opening handshake failed"


def install_log_handler() -> None:
    """One plain line per record on stderr for the server's loggers, unless the embedding program set up logging."""
    server_log, ws_log = logging.getLogger("rlrobot.server"), logging.getLogger(WS_LOGGER)
    ws_log.setLevel(logging.ERROR)
    if not any(isinstance(f, _DropHandshakeFailures) for f in ws_log.filters):
        ws_log.addFilter(_DropHandshakeFailures())
    if logging.getLogger().handlers or server_log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    server_log.addHandler(handler)
    server_log.setLevel(logging.INFO)
    server_log.propagate = False


@dataclass
class Peer:
    """One connection's story, logged as one line when it closes."""

    address: str
    accepted: float
    auth: str = "no hello"
    """no hello | authenticated | refused (<code>)"""
    requests: int = 0
    errors: int = 0
    first_error: str = ""
    """the first refused request's code and message (why a client's requests fail, without a debug log)"""
    reason: str = ""
    """why the server closed it (empty: the peer closed it, or the network did)"""
    throttled_s: float = 0.0
    """how long reading from it waited for its byte budget, in all"""

    def line(self, close_code: int | None, handshake_error: BaseException | None) -> str:
        reason = self.reason
        if not reason and handshake_error is not None:
            reason = f"websocket handshake failed ({type(handshake_error).__name__}: {str(handshake_error)[:80]})"
        if not reason:
            reason = f"closed by the peer ({close_code})" if close_code not in (None, 1006) else "connection lost"
        refused = f" ({self.errors} refused, the first: {self.first_error})" if self.first_error else \
            (f" ({self.errors} refused)" if self.errors else "")
        served = f", {self.requests} requests{refused}" if self.auth == "authenticated" else ""
        throttled = f", throttled {self.throttled_s:.1f} s (byte budget)" if self.throttled_s >= 0.05 else ""
        return f"peer {self.address}: {self.auth}{served}{throttled}, {time.monotonic() - self.accepted:.1f} s; {reason}"


class ByteBudget:
    """Token bucket of the bytes one connection sends: ``rate`` bytes/s on average, ``burst`` at once. The server
    charges every received chunk; when the bucket is empty, reading from that connection waits until it refills."""

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.stamp = burst, now
        self.waited_s = 0.0
        """time reading has waited since the bucket was last full: it grows only while the peer keeps over budget"""

    def charge(self, n: int, now: float) -> float:
        """Take ``n`` received bytes; return how many seconds reading must now wait (0.0: none)."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= self.burst:
            self.waited_s = 0.0
        self.tokens -= n
        if self.tokens >= 0:
            return 0.0
        wait = -self.tokens / self.rate
        self.waited_s += wait
        return wait


class FairTurns:
    """Runs blocking jobs in worker threads, at most ``slots`` at once. A free slot goes to the waiting job whose
    connection has used the least (start-time fair queueing; the cost is bytes decoded or seconds of inference), so a
    connection that keeps the workers busy waits behind every other connection's next job instead of ahead of it."""

    def __init__(self, slots: int, executor: ThreadPoolExecutor | None = None):
        self.slots, self.executor = slots, executor
        self.running = 0
        self.clock = 0.0
        """virtual time: the start tag of the latest job that got a slot"""
        self.finish: dict[Any, float] = {}  # connection -> virtual finish tag of its latest job
        self.waiting: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()

    async def run(self, key: Any, cost: float | None, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a worker thread once this job's turn comes; ``cost`` None: its measured seconds."""
        start = max(self.clock, self.finish.get(key, 0.0))
        self.finish[key] = start + (cost or 0.0)
        if self.running < self.slots and not self.waiting:
            self.running += 1
        else:
            turn = asyncio.get_running_loop().create_future()
            heapq.heappush(self.waiting, (start, next(self._order), turn))
            try:
                await turn  # a finishing job hands its slot over
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release()  # the slot arrived as this job was cancelled: pass it on
                raise
        self.clock = max(self.clock, start)
        began = time.perf_counter()
        try:
            job = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        except BaseException:  # the executor is shut down (the server is stopping)
            self._release()
            raise

        def done(_: Any) -> None:
            if cost is None and key in self.finish:
                self.finish[key] = max(self.finish[key], start + time.perf_counter() - began)
            self._release()

        # the slot stays taken until the thread's job has ended, also when this caller is cancelled: the policy is
        # never called by two threads at once
        job.add_done_callback(done)
        return await asyncio.shield(job)

    def _release(self) -> None:
        while self.waiting:
            turn = heapq.heappop(self.waiting)[2]
            if not turn.done():  # a cancelled waiter (its connection closed) is skipped
                turn.set_result(None)
                return
        self.running -= 1

    def forget(self, key: Any) -> None:
        self.finish.pop(key, None)


def install_log_rate_limit(burst: int = 5, window_s: float = 10.0) -> RateLimitFilter:
    limiter = RateLimitFilter(burst, window_s)
    for name in ("asyncio", "websockets", "websockets.server", "rlrobot.server", WS_LOGGER):
        logging.getLogger(name).addFilter(limiter)
    return limiter


@dataclass
class Admission:
    """One accepted TCP connection, counted from accept(): before any TLS or websocket handshake."""

    sock: socket.socket
    source: str
    accepted: float
    progressed: bool = False
    """it completed the websocket opening handshake (over TLS: the TLS handshake first): it speaks the protocol"""
    authenticated: bool = False
    peer: Peer | None = None


class _AdmittingListener(socket.socket):
    """The listening socket's class once serving: asyncio's selector loop calls ``accept()`` on it, so every
    connection is admitted (counted, capped, time-limited) at the TCP level, also while a TLS handshake is pending."""

    __slots__ = ()
    admit: Any = None

    def accept(self):
        while True:
            conn, address = super().accept()  # BlockingIOError once the backlog is empty: asyncio stops there
            if type(self).admit(conn, address):
                return conn, address
            conn.close()


class ListenError(ConnectionError):
    """``rlrobot serve`` cannot open its listening socket (a ConnectionError: the CLI prints one line)."""


class PolicyServer:
    def __init__(self, policy, secret: bytes | None, max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES,
                 max_connections: int = 64, max_unauthenticated: int = 32, hello_timeout_s: float = 5.0,
                 byte_rate: int = ServeArgs.byte_rate, byte_burst: int = ServeArgs.byte_burst,
                 budget_close_s: float = ServeArgs.budget_close_s):
        self.policy, self.secret, self.max_frame_bytes = policy, secret, max_frame_bytes
        self.max_connections, self.max_unauthenticated = max_connections, max_unauthenticated
        self.hello_timeout_s = hello_timeout_s
        self.byte_rate, self.byte_burst, self.budget_close_s = byte_rate, byte_burst, budget_close_s
        self._closing: set[asyncio.Task] = set()  # close handshakes started by the server (a reference keeps them)
        self.errors: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.open: set[Any] = set()
        self.admitted: dict[int, Admission] = {}  # file descriptor -> its admission, from accept() to close
        self.reserve = max(1, max_unauthenticated // 4)
        """unauthenticated slots that silent connections (no websocket handshake yet) can never take"""
        self._sweeping = False
        self.peers: dict[Any, Peer] = {}  # open connection -> its story (one log line when it closes)
        self.latency = RunningStats(scale=1e3)  # inference seconds -> ms; bounded however long the server runs
        policy.latencies = RunningStats(scale=1e3)  # bounded, whatever kind of policy object this is
        self.decoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="decode")
        self.decoding = FairTurns(2, self.decoder)  # large frames, cost in bytes
        self.inference = FairTurns(1)  # the policy, one call at a time, cost in seconds

    # ------------------------------------------------------------ admission at accept() (TCP level)
    def admit_listeners(self, sockets) -> None:
        """Admit connections at accept() on these listening sockets (asyncio's selector loop: Linux, macOS)."""
        listener = type("AdmittingListener", (_AdmittingListener,), {"__slots__": (), "admit": staticmethod(self._accept)})
        for sock in sockets:
            raw = getattr(sock, "_sock", sock)  # asyncio hands out TransportSocket wrappers
            raw.__class__ = listener

    def _accept(self, conn: socket.socket, address: Any) -> bool:
        """Admit a new TCP connection or refuse it. Silent connections (no websocket handshake yet) are held to
        max_unauthenticated - reserve: a new one evicts the oldest silent one of the source with the most; the
        reserve keeps room for connections that speak the protocol, evicted only by age when the slots are full."""
        self._sweep()
        if len(self.admitted) >= self.max_connections and not self._evict(progressed_too=False):
            self.counts["refused"] += 1
            log.warning("peer %s: refused, %d connections open (--max-connections)", _format_address(address),
                        len(self.admitted))
            return False
        waiting = [a for a in self.admitted.values() if not a.authenticated]
        silent = sum(not a.progressed for a in waiting)
        if silent >= self.max_unauthenticated - self.reserve or len(waiting) >= self.max_unauthenticated:
            self._evict(progressed_too=len(waiting) >= self.max_unauthenticated)
        self.counts["accepted"] += 1
        source = address[0] if isinstance(address, tuple) else str(address)
        self.admitted[conn.fileno()] = Admission(conn, source, time.monotonic())
        self._schedule_sweep()
        return True

    def _evict(self, progressed_too: bool) -> bool:
        """Close one unauthenticated connection: the oldest silent one of the busiest source, else (if allowed) the
        oldest that speaks the protocol. False if there was none."""
        waiting = [a for a in self.admitted.values() if not a.authenticated]
        silent = [a for a in waiting if not a.progressed]
        if silent:
            per_source = collections.Counter(a.source for a in silent)
            busiest = max(per_source, key=per_source.__getitem__)
            victim = min((a for a in silent if a.source == busiest), key=lambda a: a.accepted)
        elif progressed_too and waiting:
            victim = min(waiting, key=lambda a: a.accepted)
        else:
            return False
        self.counts["evicted"] += 1
        self._close_admission(victim, f"closed for a newer one: {self.max_unauthenticated} waited for their hello "
                                      f"(--max-unauthenticated)")
        return True

    def _close_admission(self, admission: Admission, reason: str) -> None:
        self.admitted.pop(admission.sock.fileno(), None)
        self.counts["closed_unauthenticated"] += not admission.authenticated
        if admission.peer is not None and not admission.peer.reason:
            admission.peer.reason = reason
        try:  # the transport sees EOF and closes: works during a TLS or websocket handshake alike
            admission.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _sweep(self) -> None:
        """Forget connections asyncio has closed; close those not authenticated hello_timeout_s after accept()."""
        now = time.monotonic()
        for fd, admission in list(self.admitted.items()):
            if admission.sock.fileno() == -1:
                del self.admitted[fd]
                self.counts["closed_unauthenticated"] += not admission.authenticated
            elif not admission.authenticated and now - admission.accepted >= self.hello_timeout_s:
                self.counts["hello_timeouts"] += 1
                self._close_admission(admission, f"no hello within {self.hello_timeout_s:g} s (--hello-timeout-s)")

    def _schedule_sweep(self) -> None:
        if self._sweeping:
            return
        self._sweeping = True

        def tick() -> None:
            self._sweeping = False
            self._sweep()
            if any(not a.authenticated for a in self.admitted.values()):
                self._schedule_sweep()

        asyncio.get_running_loop().call_later(min(0.1, self.hello_timeout_s / 4), tick)

    # ------------------------------------------------------------ connection (websocket level)
    def connection_class(self):
        from websockets.asyncio.server import ServerConnection

        server = self

        class AdmittedConnection(ServerConnection):
            def connection_made(self, transport) -> None:
                super().connection_made(transport)
                self.holds: set[str] = set()
                # websockets pauses reading when its queue of received messages is full; the byte budget pauses it
                # too: reading resumes only when neither holds it
                self.recv_messages.pause = lambda: self.hold_reading("queue", True)
                self.recv_messages.resume = lambda: self.hold_reading("queue", False)
                server._admit(self, transport)

            def hold_reading(self, why: str, on: bool) -> None:
                (self.holds.add if on else self.holds.discard)(why)
                if self.holds:
                    self.transport.pause_reading()
                else:
                    self.transport.resume_reading()

            def data_received(self, data: bytes) -> None:
                admission = getattr(self, "admission", None)
                if admission is not None and not admission.progressed and data.startswith(b"GET "):
                    admission.progressed = True  # it speaks HTTP: the start of a websocket opening handshake
                server._charge(self, len(data))
                super().data_received(data)

            def connection_lost(self, exc) -> None:
                super().connection_lost(exc)
                server._release(self)

        return AdmittedConnection

    def _admit(self, connection, transport) -> None:
        sock = transport.get_extra_info("socket")
        admission = self.admitted.get(sock.fileno()) if sock is not None else None
        self.open.add(connection)
        connection.admission = admission
        connection.budget = ByteBudget(self.byte_rate, self.byte_burst, time.monotonic())
        connection.budget_timer = None
        self.peers[connection] = Peer(_peer_address(transport), admission.accepted if admission else time.monotonic())
        if admission is not None:
            admission.peer = self.peers[connection]
            if transport.get_extra_info("ssl_object") is not None:
                admission.progressed = True  # over TLS we get here only after a complete TLS handshake
        # before authentication only tiny frames are legitimate; larger ones close the connection (1009)
        connection.protocol.max_message_size = protocol.HANDSHAKE_MAX_FRAME_BYTES

    def _charge(self, connection, n: int) -> None:
        """Charge ``n`` received bytes to the connection's budget; over it, reading from it waits until the budget
        has refilled (the bytes stay in the kernel, TCP pushes back on the sender), and past --budget-close-s of
        waiting it is closed."""
        self.counts["bytes_in"] += n
        budget = getattr(connection, "budget", None)
        if budget is None or "closing" in connection.holds:
            return
        wait = budget.charge(n, time.monotonic())
        if wait <= 0.0:
            return
        self.counts["budget_waits"] += 1
        peer = self.peers.get(connection)
        if peer is not None:
            peer.throttled_s += wait
        if budget.waited_s > self.budget_close_s:
            self._close_over_budget(connection)
            return
        if connection.budget_timer is not None:
            connection.budget_timer.cancel()
        connection.hold_reading("budget", True)
        connection.budget_timer = asyncio.get_running_loop().call_later(wait, connection.hold_reading, "budget", False)

    def _close_over_budget(self, connection) -> None:
        """Close (1008) a connection that kept over its byte budget; nothing more is read from it, so a peer that
        does not answer the close is dropped after the closing handshake's timeout."""
        self.counts["closed_over_budget"] += 1
        self._note(connection, reason=f"closed: over its byte budget for {connection.budget.waited_s:.1f} s "
                                      f"(--byte-rate {self.byte_rate}, --byte-burst {self.byte_burst}, "
                                      f"--budget-close-s {self.budget_close_s:g})")
        connection.hold_reading("closing", True)
        task = asyncio.ensure_future(connection.close(1008, "over its byte budget"))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _release(self, connection) -> None:
        self.open.discard(connection)
        self.decoding.forget(connection)
        self.inference.forget(connection)
        timer = getattr(connection, "budget_timer", None)
        if timer is not None:
            timer.cancel()
        admission = getattr(connection, "admission", None)
        if admission is not None and self.admitted.get(admission.sock.fileno()) is admission:
            self._sweep()
        peer = self.peers.pop(connection, None)
        if peer is not None:  # the connection's one log line
            ok = peer.auth == "authenticated"
            line = peer.line(getattr(connection, "close_code", None), getattr(connection.protocol, "handshake_exc", None))
            log.log(logging.INFO if ok else logging.WARNING, "%s", line, extra={"authenticated": ok})

    def _authenticated(self, connection) -> None:
        admission = getattr(connection, "admission", None)
        if admission is not None:
            admission.authenticated = True
        if connection in self.peers:
            self.peers[connection].auth = "authenticated"
        self.counts["authenticated"] += 1
        connection.protocol.max_message_size = self.max_frame_bytes + FRAME_SLACK_BYTES

    # ------------------------------------------------------------ one connection
    async def handle(self, connection) -> None:
        from websockets.exceptions import ConnectionClosed

        admission = getattr(connection, "admission", None)
        if connection not in self.open or (admission is not None and admission.sock.fileno() == -1):
            return
        if admission is not None:
            admission.progressed = True  # the websocket handshake is done: it speaks the protocol
        try:
            accepted = admission.accepted if admission is not None else time.monotonic()
            keys = await self._handshake(connection, accepted + self.hello_timeout_s)
            if keys is not None:
                await self._session(connection, keys)
        except ConnectionClosed:
            pass
        except Exception as e:  # a bug must end this connection only, never the server
            self.errors["internal"] += 1
            self._note(connection, reason=f"internal error: {type(e).__name__}: {str(e)[:200]}")

    def _note(self, connection, reason: str | None = None, auth: str | None = None, requests: int = 0,
              errors: int = 0, error: str = "") -> None:
        """``error``: what a refused request was refused for (the connection's first is kept for its log line)."""
        peer = self.peers.get(connection)
        if peer is None:
            return
        peer.requests += requests
        peer.errors += errors
        if error and not peer.first_error:
            peer.first_error = error[:200]
        if reason is not None and not peer.reason:
            peer.reason = reason
        if auth is not None:
            peer.auth = auth

    async def _refuse(self, connection, e: protocol.ProtocolError, close: bool) -> None:
        """An unsigned error frame (the peer is not authenticated), then maybe close the connection."""
        self.errors[e.code] += 1
        if close:  # the hello was refused
            self._note(connection, reason=f"hello refused: {e.message[:120]}", auth=f"refused ({e.code})")
        else:  # a frame on an authenticated connection that is not signed with its key (injected, or a bug)
            self._note(connection, errors=1, error=f"{e.code}: {e.message}")
        await connection.send(protocol.encode(protocol.error(0, e.code, e.message, e.request), None))
        if close:
            await connection.close(1008, e.code)

    async def _handshake(self, connection, deadline: float) -> dict[str, bytes | None] | None:
        server_nonce = protocol.new_nonce()
        await connection.send(protocol.encode(protocol.message("challenge", 0, nonce=server_nonce), None))
        key = protocol.hello_key(self.secret, server_nonce)
        try:
            frame = await asyncio.wait_for(connection.recv(), max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            self.counts["hello_timeouts"] += 1
            self._note(connection, reason=f"no hello within {self.hello_timeout_s:g} s (--hello-timeout-s)")
            connection.transport.abort()  # no closing handshake to wait for: a stalled peer would hold it longer
            return None
        try:
            hello = protocol.decode(frame, key, protocol.HANDSHAKE_MAX_FRAME_BYTES)
            if hello["type"] != "hello" or hello["seq"] != 1:
                raise protocol.ProtocolError("bad_request", "the first frame is a hello with seq 1")
            client_nonce = hello.get("nonce")
            if not isinstance(client_nonce, bytes) or len(client_nonce) != protocol.NONCE_BYTES:
                raise protocol.ProtocolError("malformed", f"a hello carries a {protocol.NONCE_BYTES}-byte 'nonce'")
        except protocol.ProtocolError as e:
            await self._refuse(connection, e, close=True)
            return None
        keys = protocol.session_keys(self.secret, server_nonce, client_nonce)
        self._authenticated(connection)
        reply = protocol.message("hello", 1, request=1, metadata=self.policy.metadata,
                                 max_frame_bytes=self.max_frame_bytes)
        await connection.send(protocol.encode(reply, keys[protocol.S2C]))
        return keys

    async def _session(self, connection, keys: dict[str, bytes | None]) -> None:
        last_seq, out_seq = 1, 1

        async def send(msg: dict) -> None:
            nonlocal out_seq
            out_seq += 1
            await connection.send(protocol.encode({**msg, "seq": out_seq}, keys[protocol.S2C]))

        async for frame in connection:
            try:
                if len(frame) > OFFLOAD_DECODE_BYTES:  # hashing and decoding a large frame: not on the event loop
                    msg = await self.decoding.run(connection, len(frame), protocol.decode, frame, keys[protocol.C2S],
                                                  self.max_frame_bytes)
                else:
                    msg = protocol.decode(frame, keys[protocol.C2S], self.max_frame_bytes)
            except protocol.ProtocolError as e:
                if e.verified:  # the peer's own frame, unreadable: it counted it, so does the sequence
                    last_seq += 1
                    self.errors[e.code] += 1
                    self._note(connection, requests=1, errors=1, error=f"{e.code}: {e.message}")
                    await send(protocol.error(0, e.code, e.message))
                else:
                    await self._refuse(connection, e, close=False)
                continue
            seq = msg["seq"]
            self._note(connection, requests=1)
            try:
                if seq != last_seq + 1:
                    raise protocol.ProtocolError("bad_request", f"seq {seq} is not {last_seq + 1} (a replayed, "
                                                                f"reordered or lost frame)", request=seq)
                last_seq = seq
                kind = msg["type"]
                if kind == "infer":
                    obs = self._observation(msg.get("obs"), seq)
                    actions, seconds = await self.inference.run(connection, None, self.policy.infer_timed, obs)
                    self.latency.append(seconds)
                    await send(protocol.message("action", 0, request=seq, actions=actions, inference_s=seconds))
                elif kind == "stats":
                    await send(protocol.message("stats", 0, request=seq, **self.stats()))
                else:
                    raise protocol.ProtocolError("bad_request", f"unknown message type {kind[:40]!r} after the hello",
                                                 request=seq)
            except protocol.ProtocolError as e:
                self.errors[e.code] += 1
                self._note(connection, errors=1, error=f"{e.code}: {e.message}")
                await send(protocol.error(0, e.code, e.message, e.request))
            except Exception as e:  # a bug in a request must not take the server down
                self.errors["internal"] += 1
                self._note(connection, errors=1, error=f"internal: {type(e).__name__}: {e}")
                await send(protocol.error(0, "internal", f"{type(e).__name__}: {e}", seq))

    def _observation(self, obs: Any, seq: int) -> dict[str, np.ndarray]:
        """The policy's own checks (keys, shapes), then float32 finiteness *after* the cast inference does."""
        try:
            checked = self.policy.check_observation(obs)
        except protocol.ProtocolError as e:
            raise protocol.ProtocolError(e.code, e.message, request=seq) from None
        out = {}
        for key, value in checked.items():
            if value.dtype.kind not in "biuf":
                raise protocol.ProtocolError("bad_request", f"obs[{key!r}] has dtype {value.dtype}", request=seq)
            with np.errstate(over="ignore", invalid="ignore"):
                cast = value.astype(np.float32)
            if not np.isfinite(cast).all():
                raise protocol.ProtocolError("bad_request", f"obs[{key!r}] is not finite as float32 (NaN, Inf or "
                                                            "beyond +-3.4e38)", request=seq)
            out[key] = cast
        return out

    def stats(self) -> dict[str, Any]:
        return {"latency": self.latency.summary(), "errors": dict(self.errors),
                "connections": {**self.counts, "open": len(self.admitted),
                                "unauthenticated": sum(not a.authenticated for a in self.admitted.values())}}


def _format_address(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else f"{peer[0]}:{peer[1]}"
    return str(peer)


def _peer_address(transport) -> str:
    return _format_address(transport.get_extra_info("peername"))


def listening_url(host: str, port: int, tls: bool) -> str:
    """ws(s)://host:port, an IPv6 address in brackets (RFC 3986)."""
    return f"{'wss' if tls else 'ws'}://{f'[{host}]' if ':' in host else host}:{port}"


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def websocket_server(server: PolicyServer, host: str, port: int, context: ssl.SSLContext | None = None):
    """The websocket server of ``server`` (an async context manager; ``rlrobot serve`` and the tests use it)."""

    return _AdmittingServe(server, server.handle, host, port, max_size=server.max_frame_bytes + FRAME_SLACK_BYTES,
                           max_queue=4, compression=None, open_timeout=server.hello_timeout_s, ssl=context,
                           ssl_handshake_timeout=server.hello_timeout_s if context is not None else None,
                           close_timeout=CLOSE_TIMEOUT_S, ping_interval=PING_INTERVAL_S, ping_timeout=PING_INTERVAL_S,
                           create_connection=server.connection_class(), logger=logging.getLogger(WS_LOGGER))


class _AdmittingServe:
    """``async with``: websockets' server, its listening sockets switched to admission at accept()."""

    def __init__(self, server: PolicyServer, *args: Any, **kwargs: Any):
        from websockets.asyncio.server import serve

        if kwargs.get("ssl_handshake_timeout") is None:
            kwargs.pop("ssl_handshake_timeout", None)
        self.server, self.serve = server, serve(*args, **kwargs)

    async def __aenter__(self):
        ws_server = await self.serve.__aenter__()
        self.server.admit_listeners(ws_server.sockets)
        return ws_server

    async def __aexit__(self, *exc: Any) -> None:
        await self.serve.__aexit__(*exc)


async def _serve(args: ServeArgs, secret: bytes | None, policy) -> None:
    install_log_handler()
    install_log_rate_limit()
    server = PolicyServer(policy, secret, args.max_frame_bytes, args.max_connections, args.max_unauthenticated,
                          args.hello_timeout_s, args.byte_rate, args.byte_burst, args.budget_close_s)
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    context = tls_context(args.tls_cert, args.tls_key)
    async with websocket_server(server, args.host, args.port, context) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        print(json.dumps({"event": "listening", "url": listening_url(args.host, port, context is not None),
                          "policy": policy.metadata,
                          "authenticated": secret is not None, "tls": context is not None,
                          "protocol": protocol.PROTOCOL_VERSION}), flush=True)
        await stop
        for peer in server.peers.values():
            peer.reason = peer.reason or "the server stopped"
    server.decoder.shutdown(wait=False, cancel_futures=True)
    print(json.dumps({"event": "stopped", **server.stats()}), flush=True)


def run_server(args: ServeArgs) -> None:
    args.validate()  # refuse bad set-ups before loading anything
    secret = resolve_secret(args.token, args.insecure, args.host)
    try:
        tls_context(args.tls_cert, args.tls_key)  # a bad certificate or key fails here, not at the first client
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"tls_cert={args.tls_cert!r} / tls_key={args.tls_key!r} cannot be loaded: {e}") from e
    from .policy_runtime import LoadedPolicy

    policy = LoadedPolicy(args.checkpoint, args.device)
    try:
        asyncio.run(_serve(args, secret, policy))
    except OSError as e:  # the only OSError out of _serve: binding the listening socket
        raise ListenError(f"cannot listen on {args.host}:{args.port} ({type(e).__name__}: {e}): "
                          + ("the host name does not resolve" if isinstance(e, socket.gaierror) else
                             "another program may be using the port (choose another --port), or the host is not an "
                             "address of this machine")) from e
