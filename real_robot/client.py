"""Policy client: the robot side of ``rlrobot serve`` (synchronous; the executor calls it from a worker thread).

It speaks protocol version 2 (PROTOCOL.md): it answers the server's challenge with its own nonce, derives the keys of
this connection, and accepts an answer only if it is authenticated with the server-to-client key of this connection,
carries the next server ``seq``, and names the request it answers in ``request``. Anything else that arrives while it
waits (a replayed, injected or stale frame) is dropped and counted in ``dropped``, and the wait goes on until the
request's deadline: a frame can never be taken for the answer to another request.

A lost server is an ordinary event: ``infer`` raises ``ConnectionError`` at once (or after ``timeout_s``), and the
next call tries to reconnect (no more often than ``reconnect_interval_s``), so the client picks the server up again
when it returns. ``wss://`` URLs use TLS, verified against the system's CAs or ``tls_ca``.
"""

from __future__ import annotations

import collections
import ssl
import time
from typing import Any

import numpy as np

from . import protocol
from .stats import RunningStats


class ServerConnectError(ConnectionError):
    """``PolicyClient.connect`` failed; ``cause`` is one of ``CONNECT_FAILURES``, the message says what to check.
    A ConnectionError, so the CLI prints it as its one-line ``error: ...``."""

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


CONNECT_FAILURES = ("unreachable", "handshake", "tls", "auth", "protocol", "unknown")


class HelloReplyMissing(TimeoutError):
    """No frame that is the server's hello reply arrived in time; ``dropped`` counts what arrived instead."""

    def __init__(self, timeout_s: float, dropped: dict[str, int]):
        self.dropped = dropped
        if not dropped:
            what = "nothing arrived"
        elif set(dropped) == {"unauthenticated"}:
            what = (f"{dropped['unauthenticated']} frame(s) arrived that are not signed for this connection: the server "
                    f"runs with another token, or something between us injects frames")
        else:
            what = "dropped " + ", ".join(f"{n} {code}" for code, n in sorted(dropped.items()))
        super().__init__(f"no valid hello reply within {timeout_s:g} s ({what})")


class PolicyClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 1.0, reconnect_interval_s: float = 0.2,
                 max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES, tls_ca: str | None = None):
        self.url, self.timeout_s, self.reconnect_interval_s = url, timeout_s, reconnect_interval_s
        self.secret = token.encode() if token else None
        self.max_frame_bytes = max_frame_bytes
        self.tls_ca = tls_ca
        self.metadata: dict[str, Any] | None = None
        self.round_trips = RunningStats(scale=1e3)  # ms; bounded however long the client runs
        self.dropped: collections.Counter[str] = collections.Counter()
        self.last_unsigned_error: str | None = None
        self.reconnects = 0
        self._ws = None
        self._keys: dict[str, bytes | None] = {}
        self._seq = 0
        self._peer_seq = 0
        self._last_attempt = -1e9

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("wss://"):
            return None
        context = ssl.create_default_context(cafile=self.tls_ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def _send(self, msg: dict, key: bytes | None) -> int:
        self._seq += 1
        self._ws.send(protocol.encode({**msg, "seq": self._seq}, key))
        return self._seq

    def _unsigned_error(self, frame) -> protocol.ProtocolError | None:
        """An unsigned error frame (the server's answer to a frame it could not authenticate), else None."""
        try:
            msg = protocol.decode_unsigned(frame)
        except protocol.ProtocolError:
            return None
        if msg["type"] != "error":
            return None
        self.last_unsigned_error = f"{msg.get('code')}: {str(msg.get('message'))[:200]}"
        return protocol.ProtocolError(str(msg.get("code", "internal")), str(msg.get("message", "")))

    def connect(self) -> dict[str, Any]:
        """Open a connection and authenticate; the server's metadata. Every failure is a ``ServerConnectError``
        (a ``ConnectionError``) whose ``cause`` and message say what went wrong and what to check."""
        self.close()
        self._last_attempt = time.monotonic()
        try:
            reply = self._handshake()
        except Exception as e:
            self.close()
            raise self._explain(e) from e
        if self.metadata is not None:
            self.reconnects += 1
        self.metadata = reply["metadata"]
        return self.metadata

    def _handshake(self) -> dict[str, Any]:
        from websockets.sync.client import connect

        # entering the context makes the connection ours to close (websockets >= 17 warns otherwise)
        options = {"ssl": self._ssl_context()} if self.url.startswith("wss://") else {}
        self._ws = connect(self.url, open_timeout=self.timeout_s, close_timeout=0.2, compression=None,
                           max_size=self.max_frame_bytes + 64 * 1024, **options).__enter__()
        challenge = protocol.decode_unsigned(self._ws.recv(timeout=self.timeout_s))
        server_nonce = challenge.get("nonce")
        if challenge["type"] != "challenge" or not isinstance(server_nonce, bytes) \
                or len(server_nonce) != protocol.NONCE_BYTES:
            raise protocol.ProtocolError("malformed", f"expected a challenge with a {protocol.NONCE_BYTES}-byte nonce")
        client_nonce = protocol.new_nonce()
        self._seq, self._peer_seq = 0, 0
        keys = protocol.session_keys(self.secret, server_nonce, client_nonce)
        self._send(protocol.message("hello", 0, nonce=client_nonce, client="rlrobot"),
                   protocol.hello_key(self.secret, server_nonce))
        reply = self._hello_reply(keys[protocol.S2C], time.monotonic() + self.timeout_s)
        self._keys, self._peer_seq = keys, 1
        return reply

    def _hello_reply(self, key: bytes | None, deadline: float) -> dict[str, Any]:
        """The server's hello reply, by the same rule as every answer: authenticated with K_s2c, seq 1, request 1.
        Anything else is dropped (counted) until the deadline; an unsigned error frame is the server's refusal."""
        dropped: collections.Counter[str] = collections.Counter()
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                frame = self._ws.recv(timeout=remaining)
            except TimeoutError:
                break
            try:
                reply = protocol.decode(frame, key, self.max_frame_bytes)
            except protocol.ProtocolError as e:
                refusal = self._unsigned_error(frame)
                if refusal is not None:
                    refusal.from_server = True
                    raise refusal from None
                dropped[e.code] += 1
                continue
            if reply["type"] == "error":  # (without a token we cannot tell a signed answer from an unsigned one)
                refusal = protocol.ProtocolError(str(reply.get("code")), str(reply.get("message")))
                refusal.from_server = True
                raise refusal
            if reply["type"] != "hello" or reply["seq"] != 1 or reply.get("request") != 1:
                dropped["not the hello reply"] += 1
                continue
            self.dropped.update(dropped)
            return reply
        self.dropped.update(dropped)
        raise HelloReplyMissing(self.timeout_s, dict(dropped))

    def _explain(self, e: Exception) -> ServerConnectError:
        """What a failed connect means for the operator: the cause and what to check, in one line."""
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        url, detail = self.url, f"{type(e).__name__}: {str(e)[:200]}"
        if isinstance(e, protocol.ProtocolError):
            if e.code == "unauthenticated":
                if getattr(e, "from_server", False):
                    hint = ("no token was given (--token or RLROBOT_TOKEN) and the server requires one" if self.secret is None
                            else "the token differs from the server's: check --token / RLROBOT_TOKEN on both sides")
                else:  # the server's hello does not verify with our key
                    hint = "its hello is not signed with this token: the server runs with another token or with --insecure"
                return ServerConnectError("auth", f"the policy server at {url} refused authentication: {hint}")
            if e.code == "version":
                return ServerConnectError("protocol", f"the policy server at {url} speaks another protocol version "
                                                      f"({e.message}); this client speaks bridge protocol "
                                                      f"{protocol.PROTOCOL_VERSION}: run the same rlrobot on both sides")
            return ServerConnectError("protocol", f"the policy server at {url} broke the handshake ({e}): is it an rlrobot "
                                                  f"serve of the same version?")
        if isinstance(e, ssl.SSLCertVerificationError):
            return ServerConnectError("tls", f"the TLS certificate of {url} cannot be verified "
                                             f"({detail}): pass the server's certificate or "
                                             f"its CA with --tls-ca, and use the host name it was issued for in --server")
        if isinstance(e, ssl.SSLError):
            return ServerConnectError("tls", f"the TLS handshake with {url} failed ({detail}): is the server serving TLS "
                                             f"(rlrobot serve --tls-cert)? For a plain server use ws://")
        if isinstance(e, HelloReplyMissing):
            cause = "auth" if set(e.dropped) == {"unauthenticated"} else "handshake"
            return ServerConnectError(cause, f"the policy server at {url} sent no valid hello reply: {e}")
        if isinstance(e, (TimeoutError, ConnectionClosed, InvalidHandshake)):
            hint = "it serves TLS: use wss://" if not url.startswith("wss://") else "is it an rlrobot serve?"
            if isinstance(e, TimeoutError):
                hint = f"no answer within --timeout-s {self.timeout_s:g} s: check host, port and firewall; is it an rlrobot serve?"
            elif isinstance(e, ConnectionClosed):
                hint = "the server closed the connection during the handshake (at --max-connections, or it refused us)"
            elif not url.startswith("wss://"):
                hint = "not a websocket answer: is it an rlrobot serve, or one serving TLS (then use wss://)?"
            return ServerConnectError("handshake", f"the policy server at {url} did not complete the handshake: {hint} "
                                                   f"({detail})")
        if isinstance(e, OSError):  # refused, unreachable network, unknown host
            return ServerConnectError("unreachable", f"cannot reach the policy server at {url} ({detail}): is `rlrobot "
                                                     f"serve` running there, and are host and port right?")
        return ServerConnectError("unknown", f"cannot connect to the policy server at {url}: {detail}")

    @property
    def connected(self) -> bool:
        return self._ws is not None

    def _request(self, msg: dict) -> dict:
        """Send one request; return the authenticated frame answering it (an error frame raises ProtocolError)."""
        seq = self._send(msg, self._keys[protocol.C2S])
        deadline = time.monotonic() + self.timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer to request {seq} within {self.timeout_s} s"
                                   + (f" (last unsigned error: {self.last_unsigned_error})" if self.last_unsigned_error else ""))
            frame = self._ws.recv(timeout=remaining)
            try:
                reply = protocol.decode(frame, self._keys[protocol.S2C], self.max_frame_bytes)
            except protocol.ProtocolError as e:
                self._unsigned_error(frame)
                self.dropped[e.code] += 1
                continue
            if reply["seq"] != self._peer_seq + 1:
                self.dropped["seq"] += 1  # replayed or duplicated on this connection
                continue
            self._peer_seq = reply["seq"]
            if reply.get("request") != seq:
                self.dropped["request"] += 1  # answers another request: never take it for this one
                continue
            if reply["type"] == "error":
                raise protocol.ProtocolError(str(reply.get("code", "internal")), str(reply.get("message", "")), seq)
            return reply

    def infer(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Action chunk [chunk, action_dim] for one observation; ConnectionError when the server is unreachable."""
        if self._ws is None:
            if time.monotonic() - self._last_attempt < self.reconnect_interval_s:
                raise ConnectionError("policy server unreachable (waiting before the next reconnect attempt)")
            self.connect()
        start = time.perf_counter()
        try:
            reply = self._request(protocol.message("infer", 0, obs=obs))
        except protocol.ProtocolError:
            raise
        except Exception as e:  # closed socket, timeout, reset: the server is gone until a reconnect works
            self.close()
            raise ConnectionError(f"policy server lost: {type(e).__name__}: {e}") from e
        self.round_trips.append(time.perf_counter() - start)
        actions = reply.get("actions")
        if reply["type"] != "action" or not isinstance(actions, np.ndarray) or actions.dtype.kind != "f":
            raise protocol.ProtocolError("malformed", f"an action reply carries a float array 'actions', got "
                                                      f"{type(actions).__name__}")
        return actions.astype(np.float32)

    def stats(self) -> dict[str, Any]:
        if self._ws is None:
            self.connect()
        return self._request(protocol.message("stats", 0))

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:
                pass
        self._ws = None
