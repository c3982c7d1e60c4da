"""Training and evaluation start states come from disjoint seed streams (rlrobot.envs.seeds)."""

from __future__ import annotations

import dataclasses

import pytest

from rlrobot.config import train_config
from rlrobot.envs.seeds import EVAL_BLOCK, evaluation_seed, group_start_seed, training_seed
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.runners.flow_on_policy import FlowNFTRunner


def test_no_training_seed_is_an_evaluation_seed_for_any_rank_or_restart():
    for seed in (0, 1, 7, 9_999, 10_000, 123_456):
        evaluation = {evaluation_seed(seed, i) for i in range(EVAL_BLOCK)}
        training = {training_seed(seed, rank, index) for rank in range(64) for index in range(0, 30_000, 7)}
        training |= {group_start_seed(seed, rank, it) for rank in range(8) for it in range(20_000)}
        assert not training & evaluation


def test_the_first_training_seeds_of_each_rank_and_the_evaluation_seed_keep_their_values():
    # the seeds every run so far used for its first resets and its evaluations
    assert [training_seed(3, rank) for rank in range(4)] == [3, 1_003, 2_003, 3_003]
    assert training_seed(3, 0, 42) == 45 and evaluation_seed(3) == 10_003
    with pytest.raises(ValueError, match="evaluation seed index"):
        evaluation_seed(0, EVAL_BLOCK)


def test_a_long_grouped_run_never_resets_its_envs_to_an_evaluation_seed(tmp_path):
    flow = FlowPolicyConfig(chunk_size=4, denoising_steps=2, state_hidden=(16,), embed_dim=16, time_embed_dim=8,
                            velocity_hidden=(16,), noise_hidden=(8,), value_hidden=(16,))
    cfg = train_config("flow-nft", task="so101-lift", num_envs=4, total_steps=4 * 8, out=str(tmp_path / "group"),
                       logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1, init="none",
                       max_episode_steps=8, flow=dataclasses.replace(flow))
    cfg.flow_nft.optimality, cfg.flow_nft.group_size = "group", 2
    cfg.flow_nft.rollout_chunks, cfg.flow_nft.num_minibatches = 2, 2
    cfg.validate()
    runner = FlowNFTRunner(cfg)
    seeds: list[int] = []
    reset = runner.env.reset

    def recorded(seed=None):
        seeds.append(seed)
        return reset(seed=seed)

    runner.env.reset = recorded
    for iteration in range(40):  # the start states of 40 iterations (the rollouts themselves do not reset by seed)
        runner.iteration = iteration
        runner.group_starts()
    runner.env.close()
    assert len(set(seeds)) == 40
    assert evaluation_seed(cfg.seed) not in seeds
    assert not set(seeds) & {evaluation_seed(cfg.seed, i) for i in range(EVAL_BLOCK)}
