"""An independent client of the bridge's wire format, written from PROTOCOL.md with websockets + msgpack + hmac only:
it does not use the project's client class or protocol module (the third party's / the attacker's view). Also a
man-in-the-middle relay (no token) that can replay and inject frames. Loopback only; every loop is bounded."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import threading

import msgpack
import numpy as np
from websockets.sync.client import connect

VERSION = 2
LABEL = b"rlrobot-bridge/2 "
ZERO = bytes(32)


def mac(key: bytes | None, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest() if key else ZERO


def hello_key(secret: bytes | None, server_nonce: bytes) -> bytes | None:
    return hmac.new(secret, LABEL + b"hello c2s" + server_nonce, hashlib.sha256).digest() if secret else None


def session_keys(secret: bytes | None, server_nonce: bytes, client_nonce: bytes) -> tuple[bytes | None, bytes | None]:
    if not secret:
        return None, None
    return tuple(hmac.new(secret, LABEL + d + server_nonce + client_nonce, hashlib.sha256).digest()
                 for d in (b"c2s", b"s2c"))


def ndarray(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    return {"__ndarray__": True, "dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}


def _arrays(obj):
    if isinstance(obj, dict):
        if obj.get("__ndarray__") is True:
            return np.frombuffer(obj["data"], dtype=obj["dtype"]).reshape(obj["shape"])
        return {k: _arrays(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_arrays(v) for v in obj]
    return obj


def frame(msg: dict, key: bytes | None) -> bytes:
    body = msgpack.packb(msg, use_bin_type=True)
    return mac(key, body) + body


def parse(data: bytes, key: bytes | None = None) -> tuple[dict, bool]:
    """(message, tag valid for ``key``); an unsigned frame is valid only when its tag is zero and key is None."""
    tag, body = data[:32], data[32:]
    return _arrays(msgpack.unpackb(body, raw=False)), hmac.compare_digest(tag, mac(key, body))


class RawSession:
    """One connection: challenge, hello, then requests with consecutive seq numbers."""

    def __init__(self, url: str, token: str | None, hello: bool = True, timeout: float = 5.0):
        self.secret = token.encode() if token else None
        self.timeout = timeout
        self.ws = connect(url, max_size=None, compression=None, open_timeout=timeout, close_timeout=1).__enter__()
        self.challenge, ok = parse(self.ws.recv(timeout=timeout))
        assert self.challenge["type"] == "challenge" and ok, self.challenge
        self.server_nonce = self.challenge["nonce"]
        self.client_nonce = os.urandom(32)
        self.c2s, self.s2c = session_keys(self.secret, self.server_nonce, self.client_nonce)
        self.seq = 0
        self.sent: list[bytes] = []
        self.received: list[bytes] = []
        if hello:
            reply, ok = self.request({"type": "hello", "nonce": self.client_nonce, "client": "raw"},
                                     key=hello_key(self.secret, self.server_nonce))
            assert reply["type"] == "hello" and ok, reply

    def send(self, msg: dict, key: bytes | None = None, raw: bytes | None = None) -> int:
        self.seq += 1
        data = raw if raw is not None else frame({"version": VERSION, "seq": self.seq, **msg},
                                                 self.c2s if key is None else key)
        self.sent.append(data)
        self.ws.send(data)
        return self.seq

    def recv(self, key: bytes | None = None, unsigned: bool = False) -> tuple[dict, bool]:
        """The next frame and whether its tag is valid (for the session key, ``key``, or zero if ``unsigned``)."""
        data = self.ws.recv(timeout=self.timeout)
        self.received.append(data)
        return parse(data, None if unsigned else self.s2c if key is None else key)

    def request(self, msg: dict, key: bytes | None = None) -> tuple[dict, bool]:
        self.send(msg, key)
        return self.recv()

    def infer(self, state: np.ndarray) -> np.ndarray:
        reply, ok = self.request({"type": "infer", "obs": {"state": ndarray(state)}})
        assert ok and reply["type"] == "action" and reply["request"] == self.seq, reply
        return reply["actions"]

    def close(self) -> None:
        self.ws.close()


class Mitm:
    """A relay on 127.0.0.1 between a client and the server, without the token: ``hook(conn, index, frame)`` returns
    the frames to pass to the client for the index-th server frame of connection ``conn`` (default: the frame)."""

    def __init__(self, upstream: str, hook=None):
        from websockets.asyncio.server import serve

        self.upstream, self.hook = upstream, hook or (lambda conn, i, f: [f])
        self.server_frames: list[list[bytes]] = []
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        async def main():
            self.server = await serve(self._relay, "127.0.0.1", 0, max_size=None, compression=None).__aenter__()
            self.url = f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
            started.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(main(), self.loop)
        assert started.wait(10)

    async def _relay(self, client) -> None:
        from websockets.asyncio.client import connect as aconnect

        conn = len(self.server_frames)
        self.server_frames.append([])
        async with aconnect(self.upstream, max_size=None, compression=None) as up:
            async def c2s():
                async for f in client:
                    await up.send(f)

            async def s2c():
                async for f in up:
                    self.server_frames[conn].append(f)
                    for out in self.hook(conn, len(self.server_frames[conn]) - 1, f):
                        await client.send(out)

            tasks = [asyncio.create_task(c2s()), asyncio.create_task(s2c())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED, timeout=60)
            for t in tasks:
                t.cancel()

    def close(self) -> None:
        async def stop():
            self.server.close()
            await self.server.wait_closed()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
