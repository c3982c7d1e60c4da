"""Update cost of flow-policy RL: one Flow-Noise PPO, Flow-SDE PPO and Flow-NFT update on the same rollout, interleaved.

``python -m rlrobot.bench.flow_rl_bench [--num-envs 64 --rollout-chunks 10 --repeats 3]`` builds the so101-lift flow
policy of the presets (random weights: the cost does not depend on them), fills each algorithm's rollout storage with
the same observations and chunks, and times ``update()`` (4 epochs x 4 minibatches each, the presets') with one torch
thread. PPO's update re-evaluates the stored denoising chain (K velocity calls per sample for Flow-Noise, one for
hybrid Flow-SDE); NFT's evaluates ``times_per_sample`` velocity calls per sample plus the reference's, and needs no
chain. Rollout cost (the env and the sampler) is the same for all three and is not timed here.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlrobot.algorithms.flow_nft import FlowNFT, FlowNFTConfig
from rlrobot.algorithms.flow_ppo import FlowPPO, FlowPPOConfig
from rlrobot.policies.flow import FlowPolicyConfig, MLPFlowPolicy


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


def run(num_envs: int, rollout_chunks: int, repeats: int, state_dim: int = 27, action_dim: int = 5) -> dict[str, float]:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(rollout_chunks, num_envs, state_dim, generator=generator)
    specs = {"state": ((state_dim,), torch.float32)}
    makers = {
        "flow-noise": lambda p: FlowPPO(p, FlowPPOConfig(rollout_chunks=rollout_chunks), "noise", torch.device("cpu"),
                                        num_envs, specs),
        "flow-sde": lambda p: FlowPPO(p, FlowPPOConfig(rollout_chunks=rollout_chunks), "sde", torch.device("cpu"),
                                      num_envs, specs),
        "flow-nft": lambda p: FlowNFT(p, FlowNFTConfig(rollout_chunks=rollout_chunks), torch.device("cpu"), num_envs, specs),
    }
    algos = {name: make(MLPFlowPolicy({"state": (state_dim,)}, action_dim, FlowPolicyConfig())) for name, make in makers.items()}
    times: dict[str, list[float]] = {name: [] for name in algos}
    for _ in range(repeats):  # interleaved: each repeat times every algorithm once
        for name, algo in algos.items():
            fill(algo, obs, generator)
            start = time.perf_counter()
            algo.update(generator)
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m rlrobot.bench.flow_rl_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--rollout-chunks", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    result = run(args.num_envs, args.rollout_chunks, args.repeats)
    base = result["flow-noise"]
    print(f"update time per iteration ({args.num_envs} envs x {args.rollout_chunks} chunks, 4 epochs x 4 minibatches, "
          f"best of {args.repeats}, 1 torch thread):")
    for name, seconds in result.items():
        print(f"  {name:<11} {seconds:6.2f} s   {base / seconds:4.2f}x flow-noise's speed")
    return result


if __name__ == "__main__":
    main()
