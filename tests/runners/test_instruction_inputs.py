"""PPO and SAC train MLP policies that read the instruction embedding: the rollout storage and the replay buffer keep
it beside the state, and the update runs on it (multi-task suite tasks)."""

import dataclasses

import pytest
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


def instruction_columns(linear: torch.nn.Linear) -> torch.Tensor:
    """The first layer's weights on the instruction embedding (concatenated after the state)."""
    return linear.weight[:, -384:].detach().clone()


def table_rows() -> torch.Tensor:
    import numpy as np

    from rlrobot.tasks.so101_suite import EMBEDDINGS_TABLE

    return torch.as_tensor(np.load(EMBEDDINGS_TABLE)["embeddings"])


def test_ppo_stores_and_trains_on_the_instruction(tmp_path):
    runner = make_runner(small("ppo", tmp_path))
    runner.obs, _ = runner.env.reset(seed=0)
    first = runner.obs["instruction_embedding"].clone()
    runner._rollout()
    stored = runner.algo.storage.obs
    assert set(stored) == {"state", "instruction_embedding"} and stored["instruction_embedding"].shape[-1] == 384
    assert torch.equal(stored["instruction_embedding"][0], first)  # what the env showed at each step
    assert torch.allclose(stored["instruction_embedding"].norm(dim=-1), torch.ones(4, 4), atol=1e-4)  # unit vectors
    actor_before, critic_before = instruction_columns(runner.policy.actor[0]), instruction_columns(runner.policy.critic[0])
    runner.update()
    # the update's gradient reached the instruction inputs of both networks (zero embeddings would give none)
    assert not torch.allclose(instruction_columns(runner.policy.actor[0]), actor_before)
    assert not torch.allclose(instruction_columns(runner.policy.critic[0]), critic_before)
    runner.env.close()


@pytest.mark.slow
def test_sac_replays_the_instruction(tmp_path):
    runner = make_runner(small("sac", tmp_path))
    actor_before = instruction_columns(runner.policy.actor.net[0])
    summary = runner.learn()
    assert set(runner.replay.obs) == {"state", "instruction_embedding"}
    stored = runner.replay.obs["instruction_embedding"][:len(runner.replay) // 4].reshape(-1, 384)
    assert len(stored) == summary["env_steps"] == 32
    # every stored embedding is one of the suite's instruction embeddings (none left zero)
    assert torch.cdist(stored, table_rows(), compute_mode="donot_use_mm_for_euclid_dist").min(1).values.max() < 1e-6
    assert runner.algo.num_updates > 0 and summary["eval"]["episodes"] == 2
    assert not torch.allclose(instruction_columns(runner.policy.actor.net[0]), actor_before)
