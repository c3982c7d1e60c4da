"""``rlrobot deploy``: run a policy on a robot, locally or through ``rlrobot serve``, safely, and report.

    rlrobot deploy --robot twin --checkpoint runs/reach --episodes 20
    rlrobot deploy --robot twin --server ws://127.0.0.1:8765 --token $TOKEN --record data/twin_reach
    rlrobot deploy --robot lerobot --lerobot-port /dev/ttyACM0 --checkpoint runs/reach --target 0.18 0.05 0.08
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .drivers import DRIVERS, make_robot
from .executor import ChunkExecutor, ExecutorConfig
from .safety import SafetyConfig, SafetySupervisor


@dataclass
class DeployArgs:
    robot: str = "twin"
    """twin (MuJoCo digital twin) | lerobot (a LeRobot SO-101 follower)"""
    checkpoint: str | None = None
    """run the policy in this process (give this or --server)"""
    server: str | None = None
    """ws://host:port of `rlrobot serve`"""
    token: str | None = None
    """the server's shared secret (also read from RLROBOT_TOKEN)"""
    episodes: int = 10
    max_steps: int | None = None
    """control steps per episode (default: the task's episode length)"""
    seed: int = 0
    """the twin's scene seed (episode k uses seed + k)"""
    record: str | None = None
    """write the episodes as a LeRobotDataset in this (new) directory"""
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    twin_latency_steps: int = 0
    twin_obs_noise: float = 0.0
    cameras: bool = False
    """(twin) also read and record the front and wrist cameras"""
    lerobot_port: str = "/dev/ttyACM0"
    lerobot_id: str = "rlrobot_so101"
    target: tuple[float, float, float] | None = None
    """(lerobot) the task's target position in the robot base frame, m (the twin knows its own)"""
    timeout_s: float = 1.0
    """network timeout of one request to the server"""
    estop_key: bool = False
    """watch stdin: an empty line or 'e' triggers the e-stop (SIGUSR1 always does)"""
    json_out: str | None = None

    def validate(self) -> None:
        if self.robot not in DRIVERS:
            raise ValueError(f"robot={self.robot!r} is not one of {DRIVERS}")
        if (self.checkpoint is None) == (self.server is None):
            raise ValueError("give exactly one of --checkpoint (run the policy here) or --server ws://host:port")
        if self.server is not None and not self.server.startswith(("ws://", "wss://")):
            raise ValueError(f"server={self.server!r} must be a ws:// or wss:// URL")
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    a = np.abs(np.asarray(values))
    return {"count": len(values), "median_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max())}


def run_deploy(args: DeployArgs) -> dict[str, Any]:
    import os
    import signal

    from .bridge import TaskBridge

    args.validate()
    token = args.token or os.environ.get("RLROBOT_TOKEN")
    if args.checkpoint is not None:
        from .policy_runtime import LoadedPolicy

        source = LoadedPolicy(args.checkpoint)
        metadata = source.metadata
    else:
        from .client import PolicyClient

        source = PolicyClient(args.server, token=token, timeout_s=args.timeout_s)
        metadata = source.connect()
    task, control_mode = metadata["task"], metadata["control_mode"]
    if control_mode is None:
        raise ValueError(f"the policy was trained on {task!r}, which has no robot-side model (native tasks only)")
    bridge = TaskBridge(task, control_mode)
    if args.robot == "twin":
        robot = make_robot("twin", task=task, seed=args.seed, latency_steps=args.twin_latency_steps,
                           obs_noise_std=args.twin_obs_noise, cameras=args.cameras)
    else:
        context = {"target": args.target} if args.target is not None else {}
        robot = make_robot("lerobot", port=args.lerobot_port, robot_id=args.lerobot_id, context=context,
                           control_rate_hz=metadata.get("control_rate_hz") or 25.0)
    robot.connect()
    supervisor = SafetySupervisor(args.safety, robot.joint_low, robot.joint_high, 1.0 / robot.control_rate_hz,
                                  forward_kinematics=bridge.tcp_position)
    if hasattr(signal, "SIGUSR1"):
        supervisor.install_signal_estop(signal.SIGUSR1)
    if args.estop_key:
        supervisor.start_key_estop()
    recorder = None
    if args.record:
        from .recorder import EpisodeRecorder

        reading = robot.observe()
        images = {k: tuple(v.shape) for k, v in reading.get("images", {}).items()}
        recorder = EpisodeRecorder(args.record, robot.control_rate_hz, int(bridge.observation(reading)["state"].shape[-1]),
                                   bridge.action_dim, robot.joint_names, images)
    executor = ChunkExecutor(robot, bridge, source, supervisor, args.executor, recorder)
    max_steps = args.max_steps or bridge.shadow.max_episode_steps
    episodes = []
    try:
        for k in range(args.episodes):
            if k > 0 and hasattr(robot, "reset_episode"):
                robot.reset_episode()
            result = executor.run_episode(max_steps)
            if recorder is not None:
                recorder.save_episode()
            episodes.append(result)
            print(json.dumps({"episode": k, "steps": result.steps, "success": result.success, "aborted": result.aborted,
                              "abort_reason": result.abort_reason, "holds": result.holds,
                              "interventions": result.interventions}), flush=True)
            if supervisor.estopped:  # latched: no further episode starts without an operator
                print(json.dumps({"event": "e-stop", "reason": supervisor.estop_reason}), flush=True)
                break
    finally:
        executor.close()
        robot.disconnect()
        bridge.close()
        if hasattr(source, "close"):
            source.close()
    round_trips = [x for e in episodes for x in e.round_trip_ms]
    if args.server is None:  # in-process: the "round trip" is the inference call itself
        round_trips = [x * 1e3 for x in getattr(source, "latencies", [])]
    summary = {
        "task": task, "robot": args.robot, "policy": args.server or args.checkpoint, "episodes": len(episodes),
        "success_rate": float(np.mean([bool(e.success) for e in episodes])) if episodes[0].success is not None else None,
        "aborted": sum(e.aborted for e in episodes),
        "holds": sum(e.holds for e in episodes),
        "interventions": {k: sum(e.interventions.get(k, 0) for e in episodes)
                          for k in sorted({k for e in episodes for k in e.interventions})},
        "round_trip": _percentiles(round_trips),
        "control_jitter": _percentiles([x for e in episodes for x in e.jitter_ms]),
        "inference_failures": sum(e.inference_failures for e in episodes),
        "recorded": args.record,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    print(json.dumps({"summary": summary}), flush=True)
    return summary
