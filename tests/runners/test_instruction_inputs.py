"""PPO and SAC train MLP policies that read the instruction embedding: the rollout storage and the replay buffer keep
it beside the state, and the update runs on it (multi-task suite tasks)."""

import dataclasses

import torch

from rlrobot.config import train_config
from rlrobot.runners.base import make_runner


def small(algo: str, tmp_path):
    cfg = train_config(algo, task="so101-push-to", num_envs=4, out=str(tmp_path / algo), logger="none", video=False,
                       eval_episodes=2, eval_envs=2, num_threads=1, max_episode_steps=16)
    cfg.policy = dataclasses.replace(cfg.policy, instruction_key="instruction_embedding", actor_hidden=(16,),
                                     critic_hidden=(16,))
    if algo == "ppo":
        cfg.ppo.rollout_steps, cfg.ppo.num_minibatches = 4, 2
    else:
        cfg.sac = dataclasses.replace(cfg.sac, learning_starts=8, batch_size=8, rollout_steps=4)
    cfg.total_steps = 2 * cfg.steps_per_iteration()
    cfg.validate()
    return cfg


def test_ppo_stores_and_trains_on_the_instruction(tmp_path):
    runner = make_runner(small("ppo", tmp_path))
    runner.obs, _ = runner.env.reset(seed=0)
    runner._rollout()
    stored = runner.algo.storage.obs
    assert set(stored) == {"state", "instruction_embedding"} and stored["instruction_embedding"].shape[-1] == 384
    assert torch.allclose(stored["instruction_embedding"].norm(dim=-1), torch.ones(4, 4), atol=1e-4)  # unit vectors
    runner.update()
    runner.env.close()


def test_sac_replays_the_instruction(tmp_path):
    runner = make_runner(small("sac", tmp_path))
    summary = runner.learn()
    assert set(runner.replay.obs) == {"state", "instruction_embedding"}
    assert summary["eval"]["episodes"] == 2
