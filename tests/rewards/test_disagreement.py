"""--reward.shaping disagreement: the bonus is the members' variance of their standardised state-change predictions,
recomputed here by hand; the ensemble learns, so a transition seen again earns less than a new one; the wrapper adds
the scaled bonus to the task's reward and keeps the episode statistics; its state (ensemble, Adam moments, running
statistics) travels with checkpoints, and a PPO run with it trains and resumes bit-exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.config import train_config
from rlrobot.rewards import RewardConfig
from rlrobot.rewards.disagreement import DisagreementBonus, DisagreementConfig, DynamicsEnsemble, disagreement

TASK = "so101-reach"


def _numpy_members(params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """Every member's prediction, written out: two SiLU layers and a linear output per member."""
    def silu(z):
        return z / (1.0 + np.exp(-z))

    w1, b1, w2, b2, w3, b3 = params
    out = []
    for k in range(len(w1)):
        h = silu(x @ w1[k] + b1[k])
        h = silu(h @ w2[k] + b2[k])
        out.append(h @ w3[k] + b3[k])
    return np.stack(out)


def test_the_bonus_is_the_members_variance_of_the_standardised_state_change_by_hand():
    gen = torch.Generator().manual_seed(0)
    predictions = torch.randn(4, 6, 3, generator=gen)
    by_hand = np.var(predictions.numpy(), axis=0).mean(-1)  # population variance over members, mean over dims
    assert np.allclose(disagreement(predictions).numpy(), by_hand, atol=1e-6)

    env = rlrobot.make(TASK, 6, seed=0)
    wrapper = DisagreementBonus(env, DisagreementConfig(members=4, hidden=8, seed=3))
    state, action, next_state = (torch.randn(6, 27, generator=gen), torch.rand(6, 5, generator=gen) * 2 - 1,
                                 torch.randn(6, 27, generator=gen))
    params = [p.numpy().astype(np.float64) for p in wrapper.ensemble.params]
    raw = wrapper.bonus(state, action, next_state)
    s, a, s2 = (t.numpy().astype(np.float64) for t in (state, action, next_state))
    mean, std = s.mean(0), np.maximum(s.std(0), 1e-3)  # the running statistics after one batch: that batch's
    x = np.concatenate([(s - mean) / std, a], -1)
    expected = np.var(_numpy_members(params, x), axis=0).mean(-1)
    assert np.allclose(raw.numpy(), expected, rtol=1e-4, atol=1e-7)
    assert wrapper.ensemble.steps == 1 and not np.allclose(wrapper.ensemble.params[0].numpy(), params[0])  # then it learnt
    env.close()


def test_a_transition_seen_again_earns_less_than_a_new_one():
    gen = torch.Generator().manual_seed(1)
    seen = torch.randn(64, 4, generator=gen)
    target = torch.sin(seen[:, :2] * 3)
    ensemble = DynamicsEnsemble(5, 4, 2, 32, seed=0, device="cpu")
    first = disagreement(ensemble(seen)).mean()
    losses = [ensemble.learn(seen, target, 1e-2) for _ in range(300)]
    assert losses[-1] < 0.05 * losses[0]
    again = disagreement(ensemble(seen)).mean()
    new = disagreement(ensemble(seen + 3.0)).mean()  # far from anything the members learnt from
    assert again < 0.2 * first and new > 5 * again


def test_the_wrapper_adds_the_scaled_bonus_and_keeps_the_episode_statistics():
    settings = DisagreementConfig(scale=0.5, members=3, hidden=16)
    plain = rlrobot.make(TASK, 4, seed=0, reward_mode="sparse", max_episode_steps=10)
    env = rlrobot.make(TASK, 4, seed=0, reward_mode="sparse", max_episode_steps=10,
                       reward_wrappers=RewardConfig(shaping="disagreement", disagreement=settings).wrappers(0.99))
    plain.reset(seed=0)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    returns = torch.zeros(4)
    for _ in range(10):
        action = torch.rand(4, 5, generator=gen) * 2 - 1
        _, task_reward, _, _, task_info = plain.step(action)
        _, reward, terminated, truncated, info = env.step(action)
        assert torch.allclose(reward, task_reward + 0.5 * info["disagreement"]) and (info["disagreement"] > 0).all()
        assert torch.equal(info["final_obs"]["state"], task_info["final_obs"]["state"])
        returns += reward
    assert (terminated | truncated).all()
    assert torch.allclose(info["episode"]["return"], returns, atol=1e-5)
    assert torch.equal(info["episode"]["task_return"], task_info["episode"]["return"])
    plain.close()
    env.close()


def test_the_wrapper_state_travels_with_checkpoints():
    wrap = RewardConfig(shaping="disagreement", disagreement=DisagreementConfig(members=3, hidden=16)).wrappers(0.99)
    a, b = (rlrobot.make(TASK, 3, seed=0, reward_wrappers=wrap) for _ in range(2))
    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(3, 5, generator=gen) * 2 - 1 for _ in range(8)]
    a.reset(seed=0)
    b.reset(seed=5)
    for action in actions[:4]:
        a.step(action)
    b.set_state(a.get_state())
    for action in actions[4:]:
        _, ra, _, _, _ = a.step(action)
        _, rb, _, _, _ = b.step(action)
        assert torch.equal(ra, rb)
    assert all(torch.equal(p, q) for p, q in zip(a.ensemble.tensors(), b.ensemble.tensors(), strict=True))
    a.close()
    b.close()


def test_its_flags_parse_and_its_settings_and_needs_are_validated_naming_the_field():
    import tyro

    from rlrobot.config import config_class

    cfg = tyro.cli(config_class("ppo"), args=["--reward.shaping", "disagreement", "--reward.disagreement.members", "3",
                                              "--reward.disagreement.scale", "0.2"])
    assert cfg.reward.disagreement == DisagreementConfig(members=3, scale=0.2)
    for settings, match in ((DisagreementConfig(members=1), "reward.disagreement.members must be >= 2"),
                            (DisagreementConfig(lr=0.0), "reward.disagreement.scale and lr must be > 0")):
        cfg = train_config("ppo", reward=RewardConfig(shaping="disagreement", disagreement=settings))
        with pytest.raises(ValueError, match=match):
            cfg.reward.validate(cfg)
    pixels = train_config("ppo", obs_mode="rgb", reward=RewardConfig(shaping="disagreement"))
    with pytest.raises(ValueError, match="models how the state changes; obs_mode='rgb' has no state"):
        pixels.reward.validate(pixels)


def test_a_ppo_run_with_the_bonus_trains_and_resumes_exactly(tmp_path):
    from rlrobot.algorithms.ppo import PPOConfig
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.policies import ActorCriticConfig
    from rlrobot.runners.base import make_runner

    def config(out, total):
        return train_config("ppo", task=TASK, num_envs=4, total_steps=total, seed=0, out=str(out), reward_mode="sparse",
                            reward=RewardConfig(shaping="disagreement", disagreement=DisagreementConfig(hidden=16)),
                            logger="none", ppo=PPOConfig(rollout_steps=6, num_minibatches=2, num_epochs=1),
                            policy=ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)), max_episode_steps=5,
                            eval_every=0, eval_episodes=2, eval_envs=2, video=False, checkpoint_every=1)

    runner = make_runner(config(tmp_path / "straight", 48))
    before = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    runner.learn()
    straight, _, _ = load_checkpoint(tmp_path / "straight")
    assert any(not torch.equal(before[k], straight[k]) for k in before)  # it trained
    make_runner(config(tmp_path / "resumed", 24)).learn()
    resumed = config(tmp_path / "resumed", 48)
    resumed.resume = True
    make_runner(resumed).learn()
    again, saved, _ = load_checkpoint(tmp_path / "resumed")
    assert all(torch.equal(straight[k], again[k]) for k in straight)
    assert saved["train"]["reward"]["disagreement"]["hidden"] == 16
    assert json.loads((tmp_path / "straight" / "eval.json").read_text())["episodes"] == 2
