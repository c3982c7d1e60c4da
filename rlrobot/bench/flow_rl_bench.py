"""Where a flow-policy RL iteration's compute goes: Flow-Noise PPO, Flow-SDE PPO and Flow-NFT on the same rollout.

``python -m rlrobot.bench.flow_rl_bench [--num-envs 64 --rollout-chunks 10 --repeats 3 --fused-adam --compile]``
builds the so101-lift flow policy of the presets (random weights: the cost does not depend on them), fills each
algorithm's rollout storage with the same observations and chunks, and times with one torch thread, interleaved
(each repeat times every algorithm once; the best repeat is reported):

* sampling: the rollout's policy calls (``rollout_act`` for every chunk: encoder, K denoising steps, value head), the
  part of a rollout that is not the simulator;
* update: ``update()`` (4 epochs x 4 minibatches each, the presets'). PPO's update re-evaluates the stored denoising
  chain (K velocity calls per sample for Flow-Noise, one for hybrid Flow-SDE); NFT's evaluates ``times_per_sample``
  velocity calls per sample plus the reference's, and needs no chain;
* phases (PPO variants): the update's minibatch steps split into the loss (forward), backward, gradient clip and
  optimizer step, the same calls ``update()`` makes.

``--fused-adam`` / ``--compile`` time the opt-in ``--flow-ppo.fused-adam`` (and ``--flow-nft.fused-adam``) and
``--flow-ppo.compile`` (the first, compiling update is outside the timing).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from rlrobot.algorithms.flow_nft import FlowNFT, FlowNFTConfig
from rlrobot.algorithms.flow_ppo import FlowPPO, FlowPPOConfig
from rlrobot.policies.flow import FlowPolicyConfig, MLPFlowPolicy

PHASES = ("loss", "backward", "clip", "optimizer")


def fill(algo, obs: torch.Tensor, generator: torch.Generator) -> None:
    storage = algo.storage
    storage.clear()
    with torch.no_grad():
        for t in range(storage.num_steps):
            actions, fields, value = algo.rollout_act({"state": obs[t]}, generator)
            zeros = torch.zeros(len(value))
            storage.add({"state": obs[t]}, **fields, values=value, rewards=torch.randn(len(value), generator=generator),
                        dones=zeros)
        storage.compute_returns(torch.zeros(storage.num_envs), 0.99, 0.95)


def sampling_seconds(algo, obs: torch.Tensor, generator: torch.Generator) -> float:
    """The rollout's policy calls for one iteration (every chunk of every env), as the runner makes them."""
    start = time.perf_counter()
    with torch.inference_mode():
        for t in range(len(obs)):
            algo.rollout_act({"state": obs[t]}, generator)
    return time.perf_counter() - start


def update_phases(algo: FlowPPO, generator: torch.Generator) -> dict[str, float]:
    """Seconds per phase over one update's minibatch steps (``FlowPPO.update``'s calls, without its bookkeeping)."""
    seconds = dict.fromkeys(PHASES, 0.0)
    for mb in algo.storage.minibatches(algo.cfg.num_minibatches, algo.cfg.num_epochs, generator):
        t0 = time.perf_counter()
        loss = algo._losses(mb, False)[0]
        t1 = time.perf_counter()
        algo.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        for params in algo.param_groups:
            nn.utils.clip_grad_norm_(params, algo.cfg.max_grad_norm)
        t3 = time.perf_counter()
        algo.optimizer.step()
        t4 = time.perf_counter()
        for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            seconds[name] += dt
    return seconds


def make_algorithms(num_envs: int, rollout_chunks: int, state_dim: int, action_dim: int, fused_adam: bool = False,
                    compile: bool = False) -> dict:
    specs = {"state": ((state_dim,), torch.float32)}
    cpu = torch.device("cpu")

    def ppo(variant: str):
        return lambda p: FlowPPO(p, FlowPPOConfig(rollout_chunks=rollout_chunks, fused_adam=fused_adam, compile=compile),
                                 variant, cpu, num_envs, specs)

    makers = {"flow-noise": ppo("noise"), "flow-sde": ppo("sde"),
              "flow-nft": lambda p: FlowNFT(p, FlowNFTConfig(rollout_chunks=rollout_chunks, fused_adam=fused_adam), cpu,
                                            num_envs, specs)}
    torch.manual_seed(0)
    return {name: make(MLPFlowPolicy({"state": (state_dim,)}, action_dim, FlowPolicyConfig()))
            for name, make in makers.items()}


def profile(num_envs: int, rollout_chunks: int, repeats: int, state_dim: int = 27, action_dim: int = 5,
            fused_adam: bool = False, compile: bool = False) -> dict[str, dict[str, float]]:
    """Per algorithm: best-of-``repeats`` seconds of the rollout's sampling, the update and (PPO) its phases."""
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(rollout_chunks, num_envs, state_dim, generator=generator)
    algos = make_algorithms(num_envs, rollout_chunks, state_dim, action_dim, fused_adam, compile)
    if compile:  # the first update compiles: outside the timing
        for algo in algos.values():
            fill(algo, obs, generator)
            algo.update(generator)
    rows: dict[str, dict[str, list[float]]] = {name: {} for name in algos}
    for _ in range(repeats):  # interleaved: each repeat times every algorithm once
        for name, algo in algos.items():
            row = rows[name]
            row.setdefault("sampling", []).append(sampling_seconds(algo, obs, generator))
            fill(algo, obs, generator)
            start = time.perf_counter()
            algo.update(generator)
            row.setdefault("update", []).append(time.perf_counter() - start)
            if isinstance(algo, FlowPPO):
                fill(algo, obs, generator)
                for phase, seconds in update_phases(algo, generator).items():
                    row.setdefault(phase, []).append(seconds)
    return {name: {k: min(v) for k, v in row.items()} for name, row in rows.items()}


def run(num_envs: int, rollout_chunks: int, repeats: int, state_dim: int = 27, action_dim: int = 5) -> dict[str, float]:
    """Update seconds per algorithm (the best of ``repeats``)."""
    return {name: row["update"] for name, row in profile(num_envs, rollout_chunks, repeats, state_dim, action_dim).items()}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m rlrobot.bench.flow_rl_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--rollout-chunks", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fused-adam", action="store_true", help="time --flow-ppo.fused-adam / --flow-nft.fused-adam")
    parser.add_argument("--compile", action="store_true", help="time --flow-ppo.compile")
    parser.add_argument("--json-out", default="", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    result = profile(args.num_envs, args.rollout_chunks, args.repeats, fused_adam=args.fused_adam, compile=args.compile)
    base = result["flow-noise"]["update"]
    options = " ".join(f"--{k}" for k in ("fused-adam", "compile") if getattr(args, k.replace("-", "_"))) or "defaults"
    print(f"one iteration of {args.num_envs} envs x {args.rollout_chunks} chunks ({options}; best of {args.repeats}, "
          "1 torch thread), seconds:")
    print(f"  {'':<11} {'sampling':>8} {'update':>7}  update vs flow-noise  " + " ".join(f"{p:>9}" for p in PHASES))
    for name, row in result.items():
        phases = " ".join(f"{row[p]:9.3f}" if p in row else f"{'':>9}" for p in PHASES)
        print(f"  {name:<11} {row['sampling']:8.3f} {row['update']:7.3f}  {base / row['update']:5.2f}x faster        "
              + phases)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"num_envs": args.num_envs, "rollout_chunks": args.rollout_chunks,
                                                   "fused_adam": args.fused_adam, "compile": args.compile,
                                                   "seconds": result}, indent=2))
    return result


if __name__ == "__main__":
    main()
