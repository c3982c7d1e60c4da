"""Potential-based shaping (--reward-mode sparse --reward.shaping dense-potential): per episode the shaped discounted
return differs from the sparse one only by the boundary terms gamma^T Phi(s_T) [0 if terminated] - Phi(s_0)."""

import pytest
import torch

import rlrobot
from rlrobot.config import train_config
from rlrobot.rewards import RewardConfig

GAMMA = 0.9


def test_shaped_return_differs_from_the_sparse_one_by_the_boundary_terms():
    env = rlrobot.make("so101-push", 6, seed=0, reward_mode="sparse", max_episode_steps=15,
                       reward_wrappers=RewardConfig(shaping="dense-potential").wrappers(GAMMA))
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    phi0 = env.potential().clone()  # Phi of each env's first state
    t = torch.zeros(6)
    sparse_disc, shaped_disc = torch.zeros(6), torch.zeros(6)
    sparse_sum, shaped_sum = torch.zeros(6), torch.zeros(6)
    checked, largest_change = 0, 0.0
    for _ in range(45):
        action = env.expert_action() + 0.3 * torch.randn(6, 5, generator=gen)  # reaches success now and then
        _, shaped, terminated, truncated, info = env.step(action.clamp(-1, 1))
        sparse = info["success"].float()  # the sparse task reward
        largest_change = max(largest_change, float((shaped - sparse).abs().max()))
        sparse_disc += GAMMA**t * sparse
        shaped_disc += GAMMA**t * shaped
        sparse_sum += sparse
        shaped_sum += shaped
        t += 1
        done = terminated | truncated
        if done.any():
            boundary = GAMMA**t * info["next_potential"] * (~terminated).float() - phi0
            assert torch.allclose((shaped_disc - sparse_disc)[done], boundary[done], atol=1e-4)
            ids = info["episode"]["env_ids"]
            assert torch.allclose(info["episode"]["return"], shaped_sum[ids], atol=1e-4)
            assert torch.allclose(info["episode"]["task_return"], sparse_sum[ids], atol=1e-4)
            checked += int(done.sum())
            fresh = env.potential()
            phi0 = torch.where(done, fresh, phi0)
            for x in (t, sparse_disc, shaped_disc, sparse_sum, shaped_sum):
                x[done] = 0.0
    assert checked == 18  # three 15-step episodes in each of 6 envs
    assert largest_change > 0.01  # the shaping does change the per-step rewards
    env.close()


def test_shaping_is_refused_where_it_cannot_work():
    with pytest.raises(ValueError, match="needs a native task"):
        train_config("ppo", task="gym:Pendulum-v1", reward=RewardConfig(shaping="dense-potential")).validate()
    with pytest.raises(ValueError, match="reward.shaping='magic' is not one of"):
        train_config("ppo", reward=RewardConfig(shaping="magic")).validate()
    cfg = train_config("sft", dataset="x", reward=RewardConfig(shaping="dense-potential"))
    with pytest.raises(ValueError, match="learns without rewards"):
        cfg.validate()


def test_shaped_training_resumes_exactly(tmp_path):
    """The shaping wrapper's state (Phi of the current states, running returns) travels with the checkpoint."""
    from safetensors.torch import load_file

    from rlrobot.algorithms.ppo import PPOConfig
    from rlrobot.checkpoints import resolve_checkpoint
    from rlrobot.policies import ActorCriticConfig
    from rlrobot.runners.on_policy import OnPolicyRunner

    def cfg(out, iterations, **kw):
        return train_config("ppo", task="so101-push", num_envs=4, total_steps=4 * 6 * iterations, seed=2, out=str(out),
                            reward_mode="sparse", reward=RewardConfig(shaping="dense-potential"), logger="none",
                            ppo=PPOConfig(rollout_steps=6, num_minibatches=2, num_epochs=1), checkpoint_every=2,
                            policy=ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)), max_episode_steps=10,
                            eval_every=0, eval_episodes=2, eval_envs=2, video=False, **kw)

    OnPolicyRunner(cfg(tmp_path / "a", 4)).learn()
    OnPolicyRunner(cfg(tmp_path / "b", 2)).learn()
    OnPolicyRunner(cfg(tmp_path / "b", 4, resume=True)).learn()
    a = load_file(resolve_checkpoint(tmp_path / "a") / "model.safetensors")
    b = load_file(resolve_checkpoint(tmp_path / "b") / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_chunk_learners_discount_the_potential_once_per_chunk():
    """An action-chunk learner sums a chunk's step rewards and discounts once per chunk: with steps_per_discount = h
    each chunk's shaping sums to gamma Phi(chunk end) - Phi(chunk start) (with gamma on every step it would carry
    -(1 - gamma) x Phi of the chunk's inner states, a penalty for progress)."""
    from rlrobot.rewards import set_steps_per_discount

    h = 4
    for per_chunk in (True, False):
        env = rlrobot.make("so101-push", 4, seed=0, reward_mode="sparse", max_episode_steps=200,
                           reward_wrappers=RewardConfig(shaping="dense-potential").wrappers(GAMMA))
        env.reset(seed=0)
        if per_chunk:
            assert set_steps_per_discount(env, h) == 1
        gen = torch.Generator().manual_seed(0)
        gaps = []
        for _ in range(6):
            phi_start, block, alive = env.potential().clone(), torch.zeros(4), torch.ones(4, dtype=torch.bool)
            for _ in range(h):
                action = env.expert_action() + 0.3 * torch.randn(4, 5, generator=gen)
                _, shaped, terminated, truncated, info = env.step(action.clamp(-1, 1))
                block += (shaped - info["success"].float()) * alive
                alive &= ~(terminated | truncated)
            exact = GAMMA * info["next_potential"] - phi_start  # the chunk-level potential term
            gaps.append((block - exact)[alive].abs().max())
        env.close()
        if per_chunk:
            assert max(gaps) < 1e-5
        else:
            assert max(gaps) > 0.01  # gamma per step: not the chunk's potential term
    with pytest.raises(ValueError, match="steps_per_discount must be >= 1"):
        set_steps_per_discount(rlrobot.make("so101-push", 1, seed=0, reward_mode="sparse",
                                            reward_wrappers=RewardConfig(shaping="dense-potential").wrappers(GAMMA)), 0)


def test_flow_runner_sets_the_chunk_discount_of_potential_rewards(tmp_path):
    from rlrobot.rewards.dense_potential import PotentialShaping
    from rlrobot.runners.base import make_runner

    cfg = train_config("flow-noise", task="so101-reach", reward_mode="sparse", num_envs=2, total_steps=1000,
                       init="none", out=str(tmp_path / "run"), logger="none", video=False,
                       reward=RewardConfig(shaping="dense-potential"))
    runner = make_runner(cfg)
    wrapper = runner.env
    while not isinstance(wrapper, PotentialShaping):
        wrapper = wrapper.__dict__["env"]
    assert runner.execute_steps > 1 and wrapper.steps_per_discount == runner.execute_steps
    runner.env.close()
