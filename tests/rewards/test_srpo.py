"""SRPO latent progress: rewards on a hand-made group (successes 1, failures ordered by distance, the group filter,
GRPO advantages), the DBSCAN success centres, the per-step wrapper's bookkeeping and checkpointed state, and a
flow-srpo run end to end."""

import math

import pytest
import torch

import rlrobot
from rlrobot.config import train_config
from rlrobot.rewards import RewardConfig
from rlrobot.rewards.srpo import (
    SRPORewardConfig,
    SRPOSettings,
    dbscan_labels,
    group_filter,
    srpo_advantages,
    srpo_rewards,
    success_centres,
    trajectory_embeddings,
)


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_srpo_rewards_on_a_hand_made_group():
    # task 0: two successes near the origin, three failures at distance 1, 2 and 3 from their mean (0.05, 0)
    # task 1: failures only (no reference: reward 0); task 2: successes only
    emb = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.05, 3.0], [1.05, 0.0], [0.05, -2.0],
                        [5.0, 5.0], [6.0, 6.0], [1.0, 1.0], [2.0, 2.0]])
    success = torch.tensor([1, 1, 0, 0, 0, 0, 0, 1, 1], dtype=torch.bool)
    task = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2, 2])
    r = srpo_rewards(emb, success, task, SRPOSettings(cluster="mean"))
    assert torch.equal(r[success], torch.ones(4))
    # d = 3, 1, 2 -> d_hat = 1, 0, 0.5 -> 0.6 sigmoid(10 (0.5 - d_hat))
    expected = torch.tensor([0.6 * sig(-5.0), 0.6 * sig(5.0), 0.6 * sig(0.0)])
    assert torch.allclose(r[2:5], expected, atol=1e-6)
    assert r[3] > r[4] > r[2]  # closer to the successes -> more reward, always below a success's 1
    assert torch.equal(r[5:7], torch.zeros(2))


def test_a_lone_failure_gets_the_midpoint():
    r = srpo_rewards(torch.tensor([[0.0], [4.0]]), torch.tensor([True, False]), torch.zeros(2, dtype=torch.long))
    assert r.tolist() == pytest.approx([1.0, 0.3])


def test_group_filter_and_grpo_advantages():
    success = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)  # rates 0, .25, .5, 1
    keep = group_filter(success, 4, 0.1, 0.9)
    assert keep.tolist() == [False] * 4 + [True] * 8 + [False] * 4
    rewards = torch.where(success, 1.0, 0.3) + torch.arange(16) * 0.01
    adv = srpo_advantages(rewards, 4, keep)
    assert torch.equal(adv[~keep], torch.zeros(8))
    kept = adv[keep].reshape(2, 4)
    assert torch.allclose(kept.mean(1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(kept.std(1, unbiased=False), torch.ones(2), atol=1e-5)
    assert adv[4] > 0 and adv[5] < 0  # the success leads its group


def test_dbscan_finds_two_success_modes_and_rewards_the_failure_near_either():
    gen = torch.Generator().manual_seed(0)
    a = torch.tensor([0.0, 0.0]) + 0.05 * torch.randn(5, 2, generator=gen)
    b = torch.tensor([4.0, 0.0]) + 0.05 * torch.randn(5, 2, generator=gen)
    labels = dbscan_labels(torch.cat([a, b]), eps=0.5)
    assert labels[:5].unique().numel() == 1 and labels[5:].unique().numel() == 1 and labels[0] != labels[5]
    assert len(success_centres(torch.cat([a, b]), "dbscan")) == 2
    assert len(success_centres(torch.cat([a, b]), "mean")) == 1
    # failures: one right next to mode b, one at the midpoint of the two modes (far from both), one far away
    fails = torch.tensor([[4.1, 0.1], [2.0, 0.0], [2.0, 6.0]])
    emb = torch.cat([a, b, fails])
    success = torch.tensor([True] * 10 + [False] * 3)
    task = torch.zeros(13, dtype=torch.long)
    clustered = srpo_rewards(emb, success, task, SRPOSettings(cluster="dbscan"))[10:]
    averaged = srpo_rewards(emb, success, task, SRPOSettings(cluster="mean"))[10:]
    assert clustered[0] > 0.55 and clustered[0] > clustered[1] > clustered[2]
    assert averaged[1] > averaged[0]  # the mean of two modes wrongly prefers the in-between failure


def test_trajectory_embeddings_average_only_the_episode_frames():
    frames = torch.arange(12, dtype=torch.float32).reshape(3, 2, 2)  # [T=3, N=2, D=2]
    valid = torch.tensor([[True, True], [True, False], [False, False]])
    emb = trajectory_embeddings(frames, valid)
    assert torch.allclose(emb[0], frames[:2, 0].mean(0)) and torch.allclose(emb[1], frames[0, 1])


def _srpo_env(n=6, steps=12):
    return rlrobot.make("so101-reach", n, seed=0, reward_mode="sparse", max_episode_steps=steps,
                        reward_wrappers=RewardConfig(shaping="srpo").wrappers(0.99))


def test_srpo_wrapper_keeps_returns_final_obs_and_success_consistent():
    env = _srpo_env()
    obs, _ = env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    task_sum, wrapped_sum = torch.zeros(6), torch.zeros(6)
    rewards, successes, checked = [], [], 0
    for _ in range(72):
        noise = torch.where(torch.arange(6) < 3, 0.05, 1.5)[:, None]  # three near-experts, three noisy envs
        action = (env.expert_action() + noise * torch.randn(6, 5, generator=gen)).clamp(-1, 1)
        obs, shaped, terminated, truncated, info = env.step(action)
        task_reward = info["success"].float()  # sparse: the task's reward is success
        task_sum += task_reward
        wrapped_sum += shaped
        done = terminated | truncated
        assert torch.equal(shaped[~done], task_reward[~done])  # SRPO pays only at an episode's end
        if done.any():
            ep, ids = info["episode"], info["episode"]["env_ids"]
            assert torch.allclose(ep["task_return"], task_sum[ids], atol=1e-5)
            assert torch.allclose(ep["return"], wrapped_sum[ids], atol=1e-5)
            assert torch.allclose(ep["return"] - ep["task_return"], ep["srpo_reward"], atol=1e-5)
            assert torch.equal(info["final_obs"]["state"][~done], obs["state"][~done])
            assert not torch.equal(info["final_obs"]["state"][done], obs["state"][done])  # the new episodes' frames
            rewards += ep["srpo_reward"].tolist()
            successes += ep["success"].tolist()
            task_sum[done], wrapped_sum[done] = 0.0, 0.0
            checked += len(ids)
    assert checked == 36
    r, s = torch.tensor(rewards), torch.tensor(successes)
    assert s.any() and (~s).any()
    assert torch.equal(r[s], torch.ones(int(s.sum())))
    assert ((r[~s] >= 0) & (r[~s] < 0.6)).all() and (r[~s] > 0).any()  # failures after the first success get some
    env.close()


def test_srpo_wrapper_state_travels_with_checkpoints():
    def run(env, steps, seed):
        gen = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(steps):
            action = (env.expert_action() + torch.randn(6, 5, generator=gen)).clamp(-1, 1)
            out.append(env.step(action)[1])
        return torch.stack(out)

    a, b = _srpo_env(), _srpo_env()
    a.reset(seed=1)
    run(a, 30, 0)
    b.reset(seed=5)  # another history: its own memory, sums and statistics
    run(b, 7, 3)
    b.set_state(a.get_state())
    assert torch.equal(run(a, 30, 1), run(b, 30, 1))
    a.close()
    b.close()


def test_srpo_is_refused_where_it_cannot_work():
    with pytest.raises(ValueError, match="needs a native task"):
        train_config("ppo", task="gym:Pendulum-v1", reward=RewardConfig(shaping="srpo")).validate()
    with pytest.raises(ValueError, match="embeds episodes by their state"):
        cfg = train_config("ppo", task="so101-reach", obs_mode="rgb", reward=RewardConfig(shaping="srpo"))
        cfg.reward.validate(cfg)  # (the MLP policy would refuse the config first)
    with pytest.raises(ValueError, match="reward.srpo.memory must be >= 1"):
        cfg = train_config("ppo", reward=RewardConfig(shaping="srpo", srpo=SRPORewardConfig(memory=0)))
        cfg.reward.validate(cfg)


def test_flow_srpo_trains_on_grouped_episodes(tmp_path):
    from rlrobot.algorithms.flow_srpo import FlowSRPOConfig
    from rlrobot.policies.flow import FlowPolicyConfig
    from rlrobot.runners.base import make_runner

    cfg = train_config("flow-srpo", task="so101-reach", num_envs=8, total_steps=2 * 8 * 12, seed=0, init="none",
                       out=str(tmp_path / "run"), max_episode_steps=12, logger="none", eval_every=0, eval_episodes=2,
                       eval_envs=2, video=False,
                       flow=FlowPolicyConfig(chunk_size=4, execute_steps=4, denoising_steps=2, state_hidden=(16,), embed_dim=16,
                                             time_embed_dim=8, velocity_hidden=(16,), noise_hidden=(8,),
                                             value_hidden=(8,)),
                       flow_srpo=FlowSRPOConfig(group_size=4, rollout_chunks=3, num_minibatches=2, num_epochs=1,
                                                low=0.0, high=1.0))
    runner = make_runner(cfg)
    before = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    metrics = runner.train_iteration()
    assert metrics["train/groups_kept"] == 1.0  # low 0 / high 1 keep every group
    adv = runner.algo.storage.advantages
    assert adv.shape == (3, 8) and torch.equal(adv, adv[:1].expand(3, 8))  # every chunk of an episode: its outcome
    groups = adv[0].reshape(2, 4)  # GRPO: each group's rewards standardised (the untrained policy's rewards differ)
    assert torch.allclose(groups.mean(1), torch.zeros(2), atol=1e-5)
    assert torch.allclose(groups.std(1, unbiased=False), torch.ones(2), atol=1e-4)
    runner.algo.update(runner.generator)
    assert any(not torch.equal(before[k], v) for k, v in runner.policy.state_dict().items())
    runner.cfg.flow_srpo.low, runner.cfg.flow_srpo.high = 0.6, 0.7  # no group of 4 can have a success rate in there
    before = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    metrics = runner.train_iteration()
    assert metrics["train/groups_kept"] == 0.0 and metrics["loss/skipped_update"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in runner.policy.state_dict().items())  # nothing to learn from
    with pytest.raises(ValueError, match="flow_srpo.group_size=3 must be >= 2 and divide num_envs=8"):
        train_config("flow-srpo", task="so101-reach", num_envs=8, init="none", max_episode_steps=12,
                     flow=FlowPolicyConfig(chunk_size=4, execute_steps=4),
                     flow_srpo=FlowSRPOConfig(group_size=3, rollout_chunks=3)).validate()
