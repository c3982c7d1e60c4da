"""Deploy a trained policy on the digital twin: first in-process, then the way a real arm runs it, with the policy
served over a signed websocket by ``rlrobot serve`` in another process and ``rlrobot deploy`` driving the robot.

    python examples/deploy_twin.py [--checkpoint RUN] [--episodes 10] [--smoke]

The twin is the task's MuJoCo simulation behind the robot interface, stepped in real time at the control rate; the
robot side runs the safety supervisor (joint, velocity, acceleration limits, watchdog) and reports every intervention.
Replacing ``robot="twin"`` by ``robot="lerobot"`` (with ``lerobot_port=...``) drives a LeRobot SO-101 follower.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

from rlrobot.cli import main as rlrobot_cli
from rlrobot.real_robot.deploy import DeployArgs, run_deploy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(checkpoint: str, port: int, token: str) -> subprocess.Popen:
    """`rlrobot serve --checkpoint RUN --host 127.0.0.1 --port PORT` with the token in RLROBOT_TOKEN."""
    proc = subprocess.Popen([sys.executable, "-m", "rlrobot", "serve", "--checkpoint", checkpoint, "--host", "127.0.0.1",
                             "--port", str(port)], env={**os.environ, "RLROBOT_TOKEN": token})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # imports take a few seconds
        if proc.poll() is not None:
            raise RuntimeError(f"rlrobot serve exited with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return proc
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise TimeoutError("rlrobot serve did not start listening")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="", help="a run directory ('' = train PPO on so101-reach first)")
    parser.add_argument("--out", default="runs/example-deploy-reach")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="a tiny policy and 2 short episodes, for the tests")
    args = parser.parse_args()
    run = args.checkpoint or args.out
    if not args.checkpoint and not (Path(run) / "checkpoints" / "latest").is_file():
        small = ["--num-envs", "32", "--eval-episodes", "4", "--logger", "none", "--total-steps", "1536"] if args.smoke else []
        rlrobot_cli(["train", "--task", "so101-reach", "--out", run, "--no-video", *small])  # the reach preset
    episodes, max_steps = (2, 20) if args.smoke else (args.episodes, None)

    # 1. in-process: `rlrobot deploy --robot twin --checkpoint RUN`
    local = run_deploy(DeployArgs(robot="twin", checkpoint=run, episodes=episodes, max_steps=max_steps, seed=500))
    print(f"in-process: success {local['success_rate']:.2f}, holds {local['holds']}, clamped {local['clamped_steps']}")

    # 2. served: `rlrobot serve` in its own process, `rlrobot deploy --server ws://...` here
    port, token = free_port(), secrets.token_hex(16)
    server = serve(run, port, token)
    try:
        remote = run_deploy(DeployArgs(robot="twin", server=f"ws://127.0.0.1:{port}", token=token, episodes=episodes,
                                       max_steps=max_steps, seed=500))
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"served: success {remote['success_rate']:.2f}, round trip median "
          f"{remote['round_trip'].get('median_ms', float('nan')):.1f} ms")
