"""``rlrobot deploy``: run a policy on a robot, locally or through ``rlrobot serve``, safely, and report.

    rlrobot deploy --robot twin --checkpoint runs/reach --episodes 20
    rlrobot deploy --robot twin --server ws://127.0.0.1:8765 --token $TOKEN --record data/twin_reach
    rlrobot deploy --robot lerobot --lerobot-port /dev/ttyACM0 --checkpoint runs/reach --target 0.18 0.05 0.08
    rlrobot deploy --robot twin --server wss://policy-host:8765 --tls-ca server-cert.pem --token $TOKEN

Safety policy: an e-stop, a watchdog disable (the server went silent for ``safety.disable_after_s``) or a fault of the
control loop holds and disables the arm and *latches*: no further episode starts in this run, and the summary says
why (``latched``). Re-arming is an operator's deliberate act: fix the cause and start ``rlrobot deploy`` again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .drivers import DRIVERS, make_robot
from .executor import ChunkExecutor, ControlLoopFault, ExecutorConfig
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
    tls_ca: str | None = None
    """(wss:// servers) PEM file of the CA or self-signed certificate that the server's certificate must verify
    against (default: the system's CAs); the host name in --server must match the certificate"""
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
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 60):
            raise ValueError(f"timeout_s={self.timeout_s!r} must be a number in (0, 60]")
        if self.twin_latency_steps < 0:
            raise ValueError(f"twin_latency_steps={self.twin_latency_steps} must be >= 0")
        if not (math.isfinite(self.twin_obs_noise) and self.twin_obs_noise >= 0):
            raise ValueError(f"twin_obs_noise={self.twin_obs_noise!r} must be a finite number >= 0")
        if self.target is not None and not all(math.isfinite(x) for x in self.target):
            raise ValueError(f"target={self.target} must be 3 finite numbers (m)")
        if self.tls_ca is not None:
            if self.server is None or not self.server.startswith("wss://"):
                raise ValueError("tls_ca is for a wss:// --server (TLS)")
            if not Path(self.tls_ca).is_file():
                raise ValueError(f"tls_ca={self.tls_ca!r} is not a readable file")


def run_deploy(args: DeployArgs) -> dict[str, Any]:
    import os
    import signal

    from .bridge import TaskBridge

    args.validate()
    token = args.token or os.environ.get("RLROBOT_TOKEN")
    if args.checkpoint is not None:
        from .policy_runtime import LoadedPolicy
        source = LoadedPolicy(args.checkpoint)  # times every inference in bounded RunningStats
        metadata = source.metadata
    else:
        from .client import PolicyClient

        source = PolicyClient(args.server, token=token, timeout_s=args.timeout_s, tls_ca=args.tls_ca)
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
    fault = None
    try:
        for k in range(args.episodes):
            if k > 0 and hasattr(robot, "reset_episode"):
                robot.reset_episode()
            try:
                result = executor.run_episode(max_steps)
            except ControlLoopFault as e:
                fault = e
                if recorder is not None:
                    recorder.discard_episode()
                print(json.dumps({"event": "fault", "episode": k, "reason": str(e)}), flush=True)
                break
            if recorder is not None:
                recorder.save_episode()
            episodes.append(result)
            print(json.dumps({"episode": k, "steps": result.steps, "success": result.success, "aborted": result.aborted,
                              "abort_reason": result.abort_reason, "holds": result.holds,
                              "late_chunks": result.late_chunks, "refused_chunks": result.refused_chunks,
                              "interventions": result.interventions}), flush=True)
            if supervisor.estopped:  # latched: no further episode starts without an operator
                print(json.dumps({"event": "latched", "reason": supervisor.estop_reason,
                                  "episodes_left": args.episodes - k - 1}), flush=True)
                break
    finally:
        executor.close()
        robot.disconnect()
        bridge.close()
        if hasattr(source, "close"):
            source.close()
    # in-process the "round trip" is the inference call itself
    round_trip = executor.round_trips.summary() if args.server is not None else source.latencies.summary()
    summary = {
        "task": task, "robot": args.robot, "policy": args.server or args.checkpoint, "episodes": len(episodes),
        "episodes_requested": args.episodes,
        "success_rate": float(np.mean([bool(e.success) for e in episodes]))
        if episodes and episodes[0].success is not None else None,
        "aborted": sum(e.aborted for e in episodes),
        "latched": supervisor.estop_reason if supervisor.estopped else None,
        "fault": str(fault) if fault is not None else None,
        "holds": sum(e.holds for e in episodes),
        "late_chunks": sum(e.late_chunks for e in episodes),
        "refused_chunks": sum(e.refused_chunks for e in episodes),
        "interventions": dict(sorted(supervisor.interventions.items())),
        "round_trip": round_trip,
        "control_jitter": executor.jitter.summary(),
        "inference_failures": sum(e.inference_failures for e in episodes),
        "dropped_frames": dict(getattr(source, "dropped", {})),
        "recorded": args.record,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    print(json.dumps({"summary": summary}), flush=True)
    if fault is not None:  # the arm is held and disabled; say so in one line and fail the command
        raise SystemExit(f"error: {fault}")
    return summary
