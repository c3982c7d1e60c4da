import json

import numpy as np
import pytest
import torch

from rlrobot.algorithms.ppo import PPO, PPOConfig, ReturnNormalizer
from rlrobot.config import train_config
from rlrobot.data.rollout_storage import RolloutStorage
from rlrobot.policies import ActorCritic, ActorCriticConfig
from rlrobot.runners.on_policy import OnPolicyRunner


def test_gae_on_a_hand_made_sequence():
    s = RolloutStorage(3, 1, {"state": ((1,), torch.float32)}, {}, torch.device("cpu"))
    rewards, values, dones = [1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [0.0, 1.0, 0.0]
    for t in range(3):
        s.add({"state": torch.zeros(1, 1)}, values=torch.tensor([values[t]]), rewards=torch.tensor([rewards[t]]),
              dones=torch.tensor([dones[t]]))
    gamma, lam, last = 0.9, 0.8, 2.0
    s.compute_returns(torch.tensor([last]), gamma, lam)
    d2 = 3.0 + gamma * last - 1.5
    d1 = 2.0 + 0.0 - 1.0  # episode ends at t=1
    d0 = 1.0 + gamma * 1.0 - 0.5
    expected = [d0 + gamma * lam * d1, d1, d2]
    assert torch.allclose(s.advantages[:, 0], torch.tensor(expected))
    assert torch.allclose(s.returns[:, 0], torch.tensor(expected) + torch.tensor(values))


def _runner(tmp_path, **kw):
    cfg = train_config("ppo", task="so101-reach", num_envs=16, total_steps=16 * 8 * 4, logger="none", out=str(tmp_path / "run"),
                      ppo=PPOConfig(rollout_steps=8), policy=ActorCriticConfig(actor_hidden=(32, 32), critic_hidden=(32, 32)),
                      eval_every=0, eval_episodes=4, eval_envs=4, video=False, **kw)
    return OnPolicyRunner(cfg)


def test_ratio_is_exactly_one_before_the_first_step(tmp_path):
    r = _runner(tmp_path)
    r.obs, _ = r.env.reset(seed=0)
    r._rollout()
    mb = next(r.algo.storage.minibatches(4, 1, torch.Generator().manual_seed(0)))
    dist = r.policy.distribution(r.policy.features(mb["obs"]))
    ratio = torch.exp(dist.log_prob(mb["actions"]).sum(-1) - mb["log_probs"])
    assert torch.equal(ratio, torch.ones_like(ratio))


def test_timeouts_are_bootstrapped_with_the_final_observation(tmp_path):
    cfg = train_config("ppo", task="gym:Pendulum-v1", num_envs=2, total_steps=400, logger="none", out=str(tmp_path / "p"),
                      ppo=PPOConfig(rollout_steps=200, num_minibatches=2), eval_every=0, video=False)
    r = OnPolicyRunner(cfg)
    seen = {}
    step = r.env.step

    def recording_step(action):
        out = step(action)
        if out[3].any():
            seen["reward"], seen["final_obs"] = out[1].clone(), {k: v.clone() for k, v in out[4]["final_obs"].items()}
        return out

    r.env.step = recording_step
    r.obs, _ = r.env.reset(seed=0)
    r._rollout()
    with torch.no_grad():
        bootstrap = cfg.ppo.gamma * r.policy.value(seen["final_obs"])
    assert torch.allclose(r.algo.storage.rewards[-1], seen["reward"] + bootstrap)
    assert r.algo.storage.dones[-1].all()


def test_return_normalizer_is_baselines_vecnormalize_reward_scaling():
    """Against gymnasium's RunningMeanStd (an independent implementation of the same statistics) fed the per-env
    discounted returns G <- gamma G + r, reset after an episode's end: the scaled rewards and the variance agree."""
    from gymnasium.wrappers.utils import RunningMeanStd

    g = torch.Generator().manual_seed(0)
    num_envs, gamma, clip = 3, 0.9, 10.0
    norm = ReturnNormalizer(num_envs, gamma, clip, torch.device("cpu"))
    rms, returns = RunningMeanStd(shape=()), np.zeros(num_envs)
    for _ in range(60):
        reward = torch.randn(num_envs, generator=g) * 5.0 + 2.0
        done = torch.rand(num_envs, generator=g) < 0.1
        scaled = norm(reward, done)
        returns = returns * gamma + reward.double().numpy()
        rms.update(returns)
        expected = np.clip(reward.double().numpy() / np.sqrt(rms.var + 1e-8), -clip, clip)
        np.testing.assert_allclose(scaled.numpy(), expected, rtol=1e-5, atol=1e-6)
        returns[done.numpy()] = 0.0
    assert norm.var.item() == pytest.approx(rms.var, rel=1e-5)  # our G is float32
    # with settled statistics (unit variance over many steps) a reward far beyond the return's scale is clipped
    state = norm.state_dict()
    norm.load_state_dict({**state, "returns": torch.zeros(num_envs), "mean": torch.tensor(0.0, dtype=torch.float64),
                          "var": torch.tensor(1.0, dtype=torch.float64), "count": torch.tensor(1e9, dtype=torch.float64)})
    scaled = norm(torch.tensor([100.0, -100.0, 0.5]), torch.zeros(num_envs, dtype=torch.bool))
    assert scaled.tolist() == pytest.approx([clip, -clip, 0.5], rel=1e-4)


def test_normalized_rewards_reach_the_storage_raw_returns_the_logs(tmp_path):
    cfg = train_config("ppo", task="gym:Pendulum-v1", num_envs=2, total_steps=400, logger="none", out=str(tmp_path / "p"),
                      ppo=PPOConfig(rollout_steps=200, num_minibatches=2, normalize_rewards=True), eval_every=0,
                      video=False)
    r = OnPolicyRunner(cfg)
    raw, step = [], r.env.step

    def recording_step(action):
        out = step(action)
        raw.append((out[1].clone(), (out[2] | out[3]).clone(), out[3].clone(),
                    {k: v.clone() for k, v in out[4]["final_obs"].items()} if out[3].any() else None))
        return out

    r.env.step = recording_step
    r.obs, _ = r.env.reset(seed=0)
    r._rollout()
    reference = ReturnNormalizer(2, cfg.ppo.gamma, cfg.ppo.reward_clip, torch.device("cpu"))
    for t, (reward, done, truncated, final_obs) in enumerate(raw):
        expected = reference(reward, done)
        if final_obs is not None:  # the bootstrap is added to the scaled reward (V learns scaled returns)
            with torch.no_grad():
                expected = expected + cfg.ppo.gamma * r.policy.value(final_obs) * truncated.float()
        assert torch.allclose(r.algo.storage.rewards[t], expected), t
    assert raw[-1][2].all()  # Pendulum's 200-step time limit ended both episodes inside the rollout
    # Pendulum's rewards are in [-16.3, 0]; episode returns are logged unscaled
    assert min(r.recent_returns) < -200.0
    assert r.algo.storage.rewards.abs().max() < 10.0 + 1e-4 + cfg.ppo.gamma * 100


def test_linear_lr_anneals_over_the_run(tmp_path):
    lr = 1e-3
    cfg = train_config("ppo", task="so101-reach", num_envs=8, total_steps=8 * 4 * 4, logger="none",
                      out=str(tmp_path / "lin"), ppo=PPOConfig(rollout_steps=4, lr=lr, lr_schedule="linear"),
                      policy=ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)), eval_every=0, eval_episodes=1,
                      eval_envs=1, video=False)
    runner = OnPolicyRunner(cfg)
    runner.learn()
    rows = [json.loads(line) for line in open(tmp_path / "lin" / "metrics.jsonl")]
    lrs = [row["loss/lr"] for row in rows if "loss/lr" in row]
    assert lrs == pytest.approx([lr * (1 - i / 4) for i in range(4)])
    assert runner.algo.optimizer.param_groups[0]["lr"] == pytest.approx(lr / 4)


def test_adaptive_lr_moves_with_kl():
    policy = ActorCritic(2, 1, ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)))
    algo = PPO(policy, PPOConfig(rollout_steps=4, num_minibatches=1, num_epochs=1, lr=1e-3), torch.device("cpu"), 2,
               {"state": ((2,), torch.float32)})
    s = algo.storage
    for _ in range(4):
        obs = {"state": torch.randn(2, 2)}
        # a rollout policy far from the current one: KL is large, so the learning rate must drop
        s.add(obs, actions=torch.randn(2, 1), log_probs=torch.zeros(2), values=torch.zeros(2), rewards=torch.ones(2),
              dones=torch.zeros(2), action_mean=torch.full((2, 1), 3.0), action_std=torch.full((2, 1), 0.1))
    s.compute_returns(torch.zeros(2), 0.99, 0.95)
    stats = algo.update()
    assert stats["kl"] > 0.02 and algo.lr_schedule.lr < 1e-3
    assert algo.state_dict()["lr"] == algo.lr_schedule.lr == algo.optimizer.param_groups[0]["lr"]


@pytest.mark.slow
def test_ppo_learns_reach(tmp_path):
    """A real, seeded, small run: deterministic eval success on so101-reach must reach 0.8."""
    cfg = train_config("ppo", task="so101-reach", num_envs=128, total_steps=128 * 24 * 90, seed=1, logger="none",
                      out=str(tmp_path / "learn"), eval_every=0, eval_episodes=64, eval_envs=32, video=False)
    summary = OnPolicyRunner(cfg).learn()
    print(json.dumps(summary["eval"]))
    assert summary["eval"]["episodes"] == 64
    assert summary["eval"]["success_rate"] >= 0.8
    rows = [json.loads(line) for line in open(tmp_path / "learn" / "metrics.jsonl")]
    rows = [r for r in rows if "train/return" in r]
    first = np.mean([r["train/return"] for r in rows[3:8]])  # iterations 6-10: none finished an episode in 1-2
    last = np.mean([r["train/return"] for r in rows[-5:]])
    assert last > first + 5


def _seeded_cheetah_run(tmp_path, name, seed=3):
    cfg = train_config("ppo", task="mujoco-HalfCheetah-v5", control_mode="joint_torque", num_envs=8, total_steps=8 * 16 * 2,
                      seed=seed, logger="none", out=str(tmp_path / name), eval_every=0, eval_episodes=1, eval_envs=1, video=False,
                      torch_threads=1, update_threads=1, num_threads=1,
                      ppo=PPOConfig(rollout_steps=16, num_minibatches=2, num_epochs=2),
                      policy=ActorCriticConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), activation="tanh"))
    cfg.max_episode_steps = 20  # episodes end inside the run (autoreset, bootstrap) and the final evaluation is short
    runner = OnPolicyRunner(cfg)
    runner.learn()
    return runner.policy.state_dict()


@pytest.mark.slow
def test_seeded_runs_are_bit_identical(tmp_path):
    """The same seed gives the same learning outcome to the last bit (the update's host-sync-free bookkeeping and the
    written-out Gaussian must not change it); a different seed does not."""
    a, b = _seeded_cheetah_run(tmp_path, "a"), _seeded_cheetah_run(tmp_path, "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = _seeded_cheetah_run(tmp_path, "c", seed=4)
    assert not torch.equal(a["actor.0.weight"], c["actor.0.weight"])


def _updated_policy(**ppo):
    torch.manual_seed(0)
    policy = ActorCritic(3, 2, ActorCriticConfig(actor_hidden=(16,), critic_hidden=(16,)))
    algo = PPO(policy, PPOConfig(rollout_steps=8, num_minibatches=2, num_epochs=2, **ppo), torch.device("cpu"), 4,
               {"state": ((3,), torch.float32)})
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        obs = {"state": torch.randn(4, 3, generator=g)}
        with torch.no_grad():
            action, log_prob, value, mean, std = algo.act(obs)
        algo.storage.add(obs, actions=action, log_probs=log_prob, values=value, rewards=torch.randn(4, generator=g),
                         dones=torch.zeros(4), action_mean=mean, action_std=std)
    algo.storage.compute_returns(torch.zeros(4), 0.99, 0.95)
    stats = algo.update(torch.Generator().manual_seed(1))
    return policy.state_dict(), stats


def test_fused_adam_is_the_same_update_up_to_rounding():
    plain, plain_stats = _updated_policy()
    again, again_stats = _updated_policy()
    fused, _ = _updated_policy(fused_adam=True)
    assert all(torch.equal(plain[k], again[k]) for k in plain) and plain_stats == again_stats
    assert all(torch.allclose(plain[k], fused[k], atol=1e-5) for k in plain)
    assert set(plain_stats) >= {"policy_loss", "value_loss", "entropy", "kl", "clip_fraction", "lr"}


@pytest.mark.slow
def test_compiled_update_is_the_same_update_up_to_rounding():
    """--ppo.compile runs the minibatch loss through torch.compile (generated C++ kernels on the CPU): the same
    parameters and statistics as the eager update, up to float rounding."""
    plain, plain_stats = _updated_policy()
    compiled, compiled_stats = _updated_policy(compile=True)
    assert all(torch.allclose(plain[k], compiled[k], atol=1e-5) for k in plain)
    torch.manual_seed(0)
    start = ActorCritic(3, 2, ActorCriticConfig(actor_hidden=(16,), critic_hidden=(16,))).state_dict()
    assert max((plain[k] - start[k]).abs().max().item() for k in plain) > 1e-3  # the update moved them
    for key in ("policy_loss", "value_loss", "entropy", "kl", "clip_fraction"):
        assert compiled_stats[key] == pytest.approx(plain_stats[key], rel=1e-4, abs=1e-6), key


def test_act_is_torch_distributions_normal_bit_for_bit():
    torch.manual_seed(0)
    policy = ActorCritic(5, 3, ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)))
    algo = PPO(policy, PPOConfig(), torch.device("cpu"), 4, {"state": ((5,), torch.float32)})
    obs = {"state": torch.randn(4, 5)}
    torch.manual_seed(1)
    action, log_prob, value, mean, std = algo.act(obs)
    torch.manual_seed(1)
    dist = policy.distribution(policy.features(obs))
    expected = dist.sample()
    assert torch.equal(action, expected) and torch.equal(mean, dist.mean) and torch.equal(std, dist.stddev)
    assert torch.equal(log_prob, dist.log_prob(expected).sum(-1))
    assert torch.equal(value, policy.value(obs))
