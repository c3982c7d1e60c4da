"""``rlrobot bench``: which benches run (native MuJoCo, the other backends, peers, images, SAC, offline, PRM) and one
``--json-out`` for all their figures."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rlrobot.bench.adapter_bench import run_adapter_bench
from rlrobot.bench.common import console
from rlrobot.bench.mjwarp_bench import run_mjwarp_bench
from rlrobot.bench.mujoco_bench import images_bench, native_bench, sac_bench
from rlrobot.bench.offline_bench import offline_bench
from rlrobot.bench.peers_bench import PeerSettings, run_peers_bench
from rlrobot.bench.prm_bench import prm_bench

BENCH_BACKENDS = ("mujoco", "mjwarp", "maniskill")


@dataclass
class BenchArgs:
    task: str = "so101-reach"
    num_envs: tuple[int, ...] = (64, 256, 1024)
    seconds: float = 3.0
    """time budget for each of (a) and (b) at each size"""
    ppo_iterations: int = 5
    """iterations of the real PPO training run timed for (c)"""
    ppo_hidden: tuple[int, ...] = ()
    """hidden widths of the actor and the critic in (c) (() = the task's PPO preset's)"""
    num_threads: int = 0
    torch_threads: int = 1
    update_threads: int = 0
    """torch threads of the PPO update in (c) (0 = all cores, the train default; on a loaded machine 1 is faster)"""
    control_mode: str = "ee_delta"
    sac: bool = True
    """also time SAC training at the task's SAC preset (UTD, batch, num_envs)"""
    sac_seconds: float = 5.0
    json_out: str | None = None
    offline: bool = True
    """(f) gradient steps/s of every offline RL algorithm at its preset (rlrobot.bench.offline_bench)"""
    backend: str = "mujoco"
    """mujoco (native tasks) | mjwarp (native task on MuJoCo Warp vs native, same run) | maniskill (its vector env vs
    our adapter vs PPO; task maniskill:PushCube-v1 unless --task names a maniskill: task)"""
    device: str = "auto"
    """where the mjwarp bench runs Warp and PPO: auto (cuda if available) | cpu | cuda"""
    ppo_steps: int = 16
    """rollout length of the PPO iterations in the mjwarp and maniskill benches"""
    images: bool = True
    """also time the VecEnv with two 64x64 cameras (obs_mode state+rgb, rendered in the worker threads) against
    state only, at images_num_envs envs: env steps/s, frames/s and their ratio"""
    images_num_envs: int = 64
    profile: bool = True
    """(h) the LeRobot profile's observations (two cameras, every randomisation, a greenscreen) against state only at
    profile_num_envs envs, and where its time goes (rlrobot.bench.profile_bench)"""
    profile_num_envs: tuple[int, ...] = (16, 64)
    peers: bool = False
    """time Stable-Baselines3 PPO / SAC, rsl_rl PPO and EnvPool against rlrobot on the same task, network and batch,
    interleaved in this one run, and print the ratios (needs the extra: pip install 'rlrobot[bench]')"""
    peer: PeerSettings = field(default_factory=PeerSettings)
    """settings of --peers (task, envs, rollout, epochs, minibatch, network, rounds)"""
    prm: bool = True
    """(g) the process reward model's inference per env step beside the env step, so101-suite (rlrobot.bench.prm_bench)"""
    prm_num_envs: int = 256
    """envs of (g) (at most the largest --num-envs of the run)"""
    prm_checkpoint: str = ""
    """a trained PRM for (g) ('' = the preset's network; the weights do not change the cost)"""

    def __post_init__(self):
        if self.backend not in BENCH_BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not one of {BENCH_BACKENDS}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r} is not one of ('auto', 'cpu', 'cuda', 'cuda:N')")


def run_bench(args: BenchArgs) -> dict:
    if args.peers:
        result = run_peers_bench(args.peer, progress_json=args.json_out)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=2)
        return result
    if args.backend != "mujoco":
        result = run_mjwarp_bench(args) if args.backend == "mjwarp" else run_adapter_bench(args)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=2)
        return result
    rows = native_bench(args)
    result: dict = {"ppo": rows}
    if args.images:
        result["images"] = images_bench(args)
    if args.profile:
        from rlrobot.bench.profile_bench import profile_bench  # renders cameras (EGL): only with --profile

        result["profile"] = profile_bench(args)
    if args.sac:
        result["sac"] = sac_bench(args)
    if args.offline:
        result["offline"] = offline_bench(args)
    if args.prm:
        result["prm"] = prm_bench(min(args.prm_num_envs, max(args.num_envs)), args.seconds, args.prm_checkpoint,
                                  args.num_threads, console)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return result
