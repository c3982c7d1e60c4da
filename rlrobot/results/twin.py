"""``rlrobot results deploy-twin``: the README's deploy row as one step: ``rlrobot serve`` on a free loopback port
with a fresh token in a child process, ``rlrobot deploy --robot twin`` against it in this one (real time, default
safety limits), then the server is stopped. Writes the deploy report plus the figures the table shows."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlrobot.real_robot.deploy import DeployArgs, run_deploy


@dataclass
class TwinDeployArgs:
    checkpoint: str
    """a checkpoint or run directory (served by rlrobot serve)"""
    episodes: int = 20
    seed: int = 500
    json_out: str | None = None
    startup_timeout_s: float = 120.0
    """how long to wait for the server to listen (imports take a while on a loaded machine)"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConnectionError(f"rlrobot serve exited with code {proc.returncode} before listening on port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.5)
    raise ConnectionError(f"rlrobot serve did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


def deploy_twin(args: TwinDeployArgs) -> dict[str, Any]:
    if not Path(args.checkpoint).exists():
        raise FileNotFoundError(f"checkpoint {args.checkpoint} does not exist")
    port, token = _free_port(), secrets.token_hex(16)
    server = subprocess.Popen([sys.executable, "-m", "rlrobot", "serve", "--checkpoint", args.checkpoint,
                               "--host", "127.0.0.1", "--port", str(port)],
                              env={**os.environ, "RLROBOT_TOKEN": token}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, server, args.startup_timeout_s)
        summary = run_deploy(DeployArgs(robot="twin", server=f"ws://127.0.0.1:{port}", token=token,
                                        episodes=args.episodes, seed=args.seed))
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    acting = max(summary["steps"] - summary["holds"], 1)
    figures = {"success_rate": summary["success_rate"], "changed_commands": summary["clamped_steps"] / acting,
               "round_trip_median_ms": summary["round_trip"].get("median_ms", float("nan")),
               "round_trip_p99_ms": summary["round_trip"].get("p99_ms", float("nan")),
               "jitter_p99_ms": summary["control_jitter"].get("p99_ms", float("nan")), "holds": summary["holds"]}
    result = {**figures, "report": {k: v for k, v in summary.items() if k != "per_episode"}}
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return result
