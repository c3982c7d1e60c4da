"""Policy client: the robot side of ``rlrobot serve`` (synchronous; the executor calls it from a worker thread).

A lost server is an ordinary event: ``infer`` raises ``ConnectionError`` at once (or after ``timeout_s``), and the
next call tries to reconnect (no more often than ``reconnect_interval_s``), so the client picks the server up again
when it returns.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import protocol


class PolicyClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 1.0, reconnect_interval_s: float = 0.2,
                 max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES):
        self.url, self.timeout_s, self.reconnect_interval_s = url, timeout_s, reconnect_interval_s
        self.secret = token.encode() if token else None
        self.max_frame_bytes = max_frame_bytes
        self.metadata: dict[str, Any] | None = None
        self.round_trips: list[float] = []
        self.reconnects = 0
        self._ws = None
        self._seq = 0
        self._last_attempt = -1e9

    def _send(self, msg: dict) -> None:
        self._seq += 1
        self._ws.send(protocol.encode({**msg, "seq": self._seq}, self.secret))

    def _receive(self) -> dict:
        reply = protocol.decode(self._ws.recv(timeout=self.timeout_s), self.secret, self.max_frame_bytes)
        if reply["type"] == "error":
            raise protocol.ProtocolError(reply.get("code", "internal"), reply.get("message", ""))
        return reply

    def connect(self) -> dict[str, Any]:
        from websockets.sync.client import connect

        self.close()
        self._last_attempt = time.monotonic()
        try:
            # entering the context makes the connection ours to close (websockets >= 17 warns otherwise)
            self._ws = connect(self.url, open_timeout=self.timeout_s, close_timeout=0.2, compression=None,
                               max_size=self.max_frame_bytes + 64 * 1024).__enter__()
            self._send(protocol.message("hello", 0, client="rlrobot"))
            reply = self._receive()
        except protocol.ProtocolError:
            self.close()
            raise
        except Exception as e:
            self.close()
            raise ConnectionError(f"cannot reach the policy server at {self.url}: {e}") from e
        if reply["type"] != "hello":
            self.close()
            raise protocol.ProtocolError("bad_request", f"expected a hello, got {reply['type']!r}")
        if self.metadata is not None:
            self.reconnects += 1
        self.metadata = reply["metadata"]
        return self.metadata

    @property
    def connected(self) -> bool:
        return self._ws is not None

    def infer(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Action chunk [chunk, action_dim] for one observation; ConnectionError when the server is unreachable."""
        if self._ws is None:
            if time.monotonic() - self._last_attempt < self.reconnect_interval_s:
                raise ConnectionError("policy server unreachable (waiting before the next reconnect attempt)")
            self.connect()
        start = time.perf_counter()
        try:
            self._send(protocol.message("infer", 0, obs=obs))
            reply = self._receive()
        except protocol.ProtocolError:
            raise
        except Exception as e:  # closed socket, timeout, reset: the server is gone until a reconnect works
            self.close()
            raise ConnectionError(f"policy server lost: {type(e).__name__}: {e}") from e
        self.round_trips.append(time.perf_counter() - start)
        return np.asarray(reply["actions"], np.float32)

    def stats(self) -> dict[str, Any]:
        self._send(protocol.message("stats", 0))
        return self._receive()

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:
                pass
        self._ws = None
