"""Load test of ``rlrobot serve``: N concurrent well-behaved clients, closed loop (send, wait for the answer, repeat).

    python -m rlrobot.real_robot.loadtest --checkpoint runs/reach --clients 1 8 32 --seconds 5
    python -m rlrobot.real_robot.loadtest --url ws://127.0.0.1:8765 --token $TOKEN --clients 8

With ``--checkpoint`` it starts its own server on 127.0.0.1 (a random port) and stops it afterwards. Prints one JSON
line per client count: requests per second over all clients, and p50 / p99 / max latency of one request in ms.

    python -m rlrobot.real_robot.loadtest --checkpoint runs/reach --attack bomb idle --seconds 5

``--attack`` instead runs one good client at 20 Hz while an attacker (with the token: the worst case) sends signed
8 MiB frames of 8M empty maps back to back (``bomb``), or 500 idle TCP connections are held open (``idle``), and
reports the good client's latency and whether every answer was identical to the one before the attack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import msgpack
import numpy as np


@dataclass
class LoadTestArgs:
    checkpoint: str | None = None
    """start a server for this checkpoint on 127.0.0.1 (give this or --url)"""
    url: str | None = None
    """an already running server"""
    token: str | None = None
    """the server's token (a random one when --checkpoint starts the server)"""
    clients: tuple[int, ...] = (1, 8, 32)
    seconds: float = 5.0
    """duration of each load level"""
    attack: tuple[str, ...] = ()
    """bomb | idle: measure one good 20 Hz client under these attacks instead of the closed-loop levels"""


def observation(metadata: dict) -> dict[str, np.ndarray]:
    return {k: np.zeros((1, *metadata["observation_space"][k]), np.float32) for k in metadata["obs_keys"]}


def start_server(checkpoint: str, token: str, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "rlrobot", "serve", "--checkpoint", checkpoint, "--host", "127.0.0.1", "--port", "0",
            "--token", token, *extra]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        if line.startswith("{") and json.loads(line).get("event") == "listening":
            return proc, json.loads(line)["url"]
    proc.kill()
    raise RuntimeError("the server did not start within 120 s")


def closed_loop(url: str, token: str | None, n_clients: int, seconds: float) -> dict:
    from .client import PolicyClient

    latencies: list[list[float]] = [[] for _ in range(n_clients)]
    errors = [0] * n_clients
    ready = threading.Barrier(n_clients + 1)
    window: list[float] = []

    def run(i: int) -> None:
        client = PolicyClient(url, token=token, timeout_s=5.0)
        try:
            obs = observation(client.connect())
        except Exception:
            errors[i] += 1
            ready.wait()
            return
        ready.wait()
        end = window[0] + seconds
        while (start := time.perf_counter()) < end:
            try:
                client.infer(obs)
                latencies[i].append(time.perf_counter() - start)
            except Exception:
                errors[i] += 1
        client.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n_clients)]
    for t in threads:
        t.start()
    window.append(time.perf_counter() + 0.0)
    ready.wait()
    window[0] = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - window[0]
    lat = np.concatenate([np.asarray(x) for x in latencies]) * 1e3 if any(latencies) else np.zeros(0)
    return {"clients": n_clients, "requests": int(lat.size), "errors": int(sum(errors)),
            "req_per_s": round(lat.size / elapsed, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 2) if lat.size else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 2) if lat.size else None,
            "max_ms": round(float(lat.max()), 2) if lat.size else None}


ATTACKS = ("bomb", "idle")


def _bomb_loop(url: str, token: str, stop: threading.Event, sent: list[int]) -> None:
    from websockets.sync.client import connect

    from . import protocol

    n = protocol.DEFAULT_MAX_FRAME_BYTES - 4096
    with connect(url, max_size=None, compression=None, open_timeout=5) as ws:
        challenge = protocol.decode_unsigned(ws.recv(timeout=5))
        client_nonce = protocol.new_nonce()
        keys = protocol.session_keys(token.encode(), challenge["nonce"], client_nonce)
        ws.send(protocol.encode(protocol.message("hello", 1, nonce=client_nonce),
                                protocol.hello_key(token.encode(), challenge["nonce"])))
        ws.recv(timeout=5)
        seq = 1
        while not stop.is_set() and sent[0] < 10_000:
            seq += 1
            body = (b"\x84" + b"".join(msgpack.packb(x) for x in ("type", "infer", "version", protocol.PROTOCOL_VERSION,
                                                                  "seq", seq, "obs")) + b"\xdd" + n.to_bytes(4, "big")
                    + b"\x80" * n)
            ws.send(protocol.tag(keys[protocol.C2S], body) + body)
            ws.recv(timeout=30)  # the server's error frame; a refused authenticated frame still counts in its sequence
            sent[0] += 1


def under_attack(url: str, token: str, attack: str, seconds: float) -> dict:
    import socket

    from .client import PolicyClient

    client = PolicyClient(url, token=token, timeout_s=5.0)
    obs = observation(client.connect())
    reference = client.infer(obs)
    stop, sent, socks = threading.Event(), [0], []
    attacker = None
    host, port = url.split("://")[1].rsplit(":", 1)
    if attack == "bomb":
        attacker = threading.Thread(target=_bomb_loop, args=(url, token, stop, sent), daemon=True)
        attacker.start()
    else:
        for _ in range(500):
            try:
                socks.append(socket.create_connection((host, int(port)), timeout=2))
            except OSError:
                break
        sent[0] = len(socks)
    latencies, mismatches, errors = [], 0, 0
    end = time.perf_counter() + seconds
    next_t = time.perf_counter()
    while (start := time.perf_counter()) < end:
        try:
            mismatches += not np.array_equal(client.infer(obs), reference)
            latencies.append(time.perf_counter() - start)
        except Exception:
            errors += 1
        next_t += 0.05
        time.sleep(max(0.0, next_t - time.perf_counter()))
    stop.set()
    if attacker is not None:
        attacker.join(35)
    for s in socks:
        s.close()
    client.close()
    lat = np.asarray(latencies) * 1e3
    return {"attack": attack, "attack_units": sent[0], "good_requests": int(lat.size), "mismatches": mismatches,
            "errors": errors, "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2), "max_ms": round(float(lat.max()), 2)}


def main(argv: list[str] | None = None) -> list[dict]:
    import tyro

    args = tyro.cli(LoadTestArgs, args=argv, prog="python -m rlrobot.real_robot.loadtest")
    if (args.checkpoint is None) == (args.url is None):
        raise SystemExit("error: give exactly one of --checkpoint (start a server) or --url")
    if any(n < 1 for n in args.clients) or not 0 < args.seconds < 3600:
        raise SystemExit("error: --clients must be >= 1 and --seconds in (0, 3600)")
    if any(a not in ATTACKS for a in args.attack):
        raise SystemExit(f"error: --attack must be among {ATTACKS}, got {args.attack}")
    if args.attack and args.checkpoint is None and args.token is None:
        raise SystemExit("error: --attack needs --token (the bomb attacker signs its frames)")
    proc = None
    token = args.token
    url = args.url
    if args.checkpoint is not None:
        token = token or os.urandom(16).hex()
        proc, url = start_server(args.checkpoint, token)
    results = []
    try:
        for attack in args.attack:
            results.append(under_attack(url, token, attack, args.seconds))
            print(json.dumps(results[-1]), flush=True)
        for n in () if args.attack else args.clients:
            results.append(closed_loop(url, token, n, args.seconds))
            print(json.dumps(results[-1]), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    return results


if __name__ == "__main__":
    main()
