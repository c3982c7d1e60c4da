"""Policy server: ``rlrobot serve --checkpoint PATH --host 127.0.0.1 --port P`` (websocket, msgpack frames).

Each connection must open with a ``hello``; the reply carries the policy's metadata. Then ``infer`` requests get
``action`` replies. Anything wrong in a frame (size, authentication, version, shape) gets an ``error`` frame and the
connection stays usable; nothing a client sends can stop the server. Inference runs in a worker thread under a lock,
so slow inference never stalls the event loop that serves the other clients.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from dataclasses import dataclass

from . import protocol
from .policy_runtime import LoadedPolicy, latency_summary

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeArgs:
    checkpoint: str
    """a checkpoint directory or a run directory (its latest checkpoint)"""
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    """shared secret: every frame carries an HMAC-SHA256 made with it (also read from RLROBOT_TOKEN)"""
    insecure: bool = False
    """serve without a token (refused unless the host is a loopback address)"""
    max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES
    device: str = "cpu"


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def resolve_secret(token: str | None, insecure: bool, host: str) -> bytes | None:
    import os

    token = token or os.environ.get("RLROBOT_TOKEN")
    if token:
        return token.encode()
    if not insecure:
        raise ValueError("a token is required (--token or RLROBOT_TOKEN); pass --insecure to serve without one on loopback")
    if not is_loopback(host):
        raise ValueError(f"--insecure is only allowed on a loopback host ({', '.join(LOOPBACK_HOSTS)}), not {host!r}")
    return None


class PolicyServer:
    def __init__(self, policy: LoadedPolicy, secret: bytes | None, max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES):
        self.policy, self.secret, self.max_frame_bytes = policy, secret, max_frame_bytes
        self.lock = asyncio.Lock()
        self.errors: dict[str, int] = {}
        self.connections = 0

    async def handle(self, connection) -> None:
        self.connections += 1
        hello_done, last_seq, out_seq = False, -1, 0

        async def send(msg: dict) -> None:
            nonlocal out_seq
            out_seq += 1
            await connection.send(protocol.encode({**msg, "seq": out_seq}, self.secret))

        try:
            async for frame in connection:
                try:
                    msg = protocol.decode(frame, self.secret, self.max_frame_bytes)
                    if msg["seq"] <= last_seq:
                        raise protocol.ProtocolError("bad_request", f"seq {msg['seq']} does not increase (replayed frame?)")
                    last_seq = msg["seq"]
                    kind = msg["type"]
                    if kind == "hello":
                        hello_done = True
                        await send(protocol.message("hello", 0, metadata=self.policy.metadata))
                    elif not hello_done:
                        raise protocol.ProtocolError("bad_request", "send a hello first")
                    elif kind == "infer":
                        obs = self.policy.check_observation(msg.get("obs"))
                        async with self.lock:
                            actions, seconds = await asyncio.to_thread(self.policy.infer_timed, obs)
                        await send(protocol.message("action", 0, request=msg["seq"], actions=actions, inference_s=seconds))
                    elif kind == "stats":
                        await send(protocol.message("stats", 0, latency=latency_summary(self.policy.latencies),
                                                    errors=dict(self.errors), connections=self.connections))
                    else:
                        raise protocol.ProtocolError("bad_request", f"unknown message type {kind!r}")
                except protocol.ProtocolError as e:
                    self.errors[e.code] = self.errors.get(e.code, 0) + 1
                    await send(protocol.error(0, e.code, e.message))
                except Exception as e:  # a bug in a request must not take the server down
                    self.errors["internal"] = self.errors.get("internal", 0) + 1
                    await send(protocol.error(0, "internal", f"{type(e).__name__}: {e}"))
        except Exception:  # the peer vanished mid-send: that connection ends, the server does not
            pass


async def _serve(args: ServeArgs, secret: bytes | None, policy: LoadedPolicy) -> None:
    from websockets.asyncio.server import serve

    server = PolicyServer(policy, secret, args.max_frame_bytes)
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    # frames a little over the limit still arrive and get an "oversized" error frame; far larger ones close the
    # connection (websocket close code 1009) before they are buffered
    async with serve(server.handle, args.host, args.port, max_size=args.max_frame_bytes + 64 * 1024,
                     compression=None) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        print(json.dumps({"event": "listening", "url": f"ws://{args.host}:{port}", "policy": policy.metadata,
                          "authenticated": secret is not None}), flush=True)
        await stop
    print(json.dumps({"event": "stopped", "latency": latency_summary(policy.latencies), "errors": server.errors,
                      "connections": server.connections}), flush=True)


def run_server(args: ServeArgs) -> None:
    secret = resolve_secret(args.token, args.insecure, args.host)  # refuse bad set-ups before loading anything
    if not 0 <= args.port < 65536:
        raise ValueError(f"port={args.port} is not in 0..65535")
    policy = LoadedPolicy(args.checkpoint, args.device)
    try:
        asyncio.run(_serve(args, secret, policy))
    except OSError as e:
        print(f"cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        raise
