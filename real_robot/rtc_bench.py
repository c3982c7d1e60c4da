"""Per-chunk latency and chunk-to-chunk discontinuity with and without real-time chunking, on the twin.

    python -m rlrobot.real_robot.rtc_bench --checkpoint runs/sft/checkpoints/iter_000020 --episodes 5 --max-steps 100

Runs the same episodes (same twin seeds) through bridge, safety supervisor and chunk executor (open-loop chunks, the
wall-clock control rate) three ways: plain open-loop (re-plan when the chunk is about to run out), plain re-planning
every s steps (the same request schedule as RTC, no guidance) and RTC. Per way: inference latency per chunk (ms), the
gap between each new chunk's first action and the leftover it continues, mean |a_new[0] - a_prev_leftover[0]|, the
jump at the step the new chunk takes over, holds, success. Prints a markdown table; ``--json-out`` writes the numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from rlrobot.policies.rtc import RTCConfig

from .bridge import TaskBridge
from .drivers.twin import TwinRobot
from .executor import ChunkExecutor, ExecutorConfig
from .policy_runtime import LoadedPolicy
from .safety import SafetyConfig, SafetySupervisor
from .stats import RunningStats


@dataclass
class RTCBenchArgs:
    checkpoint: str
    """a flow-policy checkpoint (rlrobot train --algo sft / flow-noise / ...)"""
    episodes: int = 5
    max_steps: int = 100
    seed: int = 0
    rtc: RTCConfig = field(default_factory=RTCConfig)
    """the RTC settings of the guided way (enabled is implied); the plain every-s way uses the same s"""
    json_out: str | None = None

    def __post_init__(self):
        if self.episodes < 1 or self.max_steps < 1:
            raise ValueError(f"episodes={self.episodes} and max_steps={self.max_steps} must be >= 1")


def _run(policy: LoadedPolicy, cfg: ExecutorConfig, args: RTCBenchArgs, every: int = 0) -> dict:
    twin = TwinRobot(policy.metadata["task"], seed=args.seed)
    twin.connect()
    bridge = TaskBridge(policy.metadata["task"], policy.metadata["control_mode"])
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz, bridge.tcp_position)
    executor = ChunkExecutor(twin, bridge, policy, sup, cfg)
    if every:  # the RTC request schedule without guidance: force a request every s steps
        executor.rtc_horizon = every
        executor._rtc_request = lambda chunks, t, median_rt: None
    policy.latencies = RunningStats(scale=1e3)
    results = []
    try:
        for k in range(args.episodes):
            if k:
                twin.reset_episode()
            results.append(executor.run_episode(args.max_steps))
    finally:
        executor.close()
        twin.disconnect()
        bridge.close()
    lat = policy.latencies.summary()
    mean = lambda key: float(np.mean([getattr(r, key)["mean"] for r in results if getattr(r, key).get("count")]))  # noqa: E731
    return {"chunks": lat["count"], "latency_median_ms": lat["median_ms"], "latency_p99_ms": lat["p99_ms"],
            "chunk_gap": mean("chunk_gap"), "switch_jump": mean("switch_jump"),
            "holds": sum(r.holds for r in results), "steps": sum(r.steps for r in results),
            "success": float(np.mean([bool(r.success) for r in results])),
            "aborted": sum(r.aborted for r in results)}


def run_rtc_bench(args: RTCBenchArgs) -> dict:
    torch.set_num_threads(1)
    policy = LoadedPolicy(args.checkpoint)
    if not policy.supports_rtc:
        raise ValueError(f"checkpoint={args.checkpoint!r} is not a flow (chunk) policy: RTC needs one")
    rtc = replace(args.rtc, enabled=True)
    horizon = rtc.horizon_for(policy.metadata["chunk_size"], policy.metadata["execute_steps"])
    rows = {
        "open-loop (re-plan at the end)": _run(policy, ExecutorConfig(mode="open_loop"), args),
        f"open-loop, re-plan every {horizon}": _run(policy, ExecutorConfig(mode="open_loop"), args, every=horizon),
        f"RTC (s={horizon}, d={'measured' if rtc.inference_delay < 0 else rtc.inference_delay}, "
        f"{rtc.prefix_schedule}, beta={rtc.max_guidance_weight:g}, {rtc.jacobian})":
            _run(policy, ExecutorConfig(mode="open_loop", rtc=rtc), args),
    }
    print(f"{policy.metadata['task']} ({policy.metadata['control_mode']}), chunk {policy.metadata['chunk_size']}, "
          f"{args.episodes} episodes x {args.max_steps} steps on the twin at its control rate")
    print("| executor | chunks | latency median / p99 (ms) | mean gap a_new[0] vs leftover[0] | mean jump at the splice "
          "| holds | success |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['chunks']} | {r['latency_median_ms']:.1f} / {r['latency_p99_ms']:.1f} | {r['chunk_gap']:.4f} "
              f"| {r['switch_jump']:.4f} | {r['holds']}/{r['steps']} | {r['success']:.2f} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    import tyro

    run_rtc_bench(tyro.cli(RTCBenchArgs))
