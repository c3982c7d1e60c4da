"""AWAC (rlrobot/algorithms/awac.py): the actor loss and the TD target against hand computations, the advantage
weights as the paper describes them, a seeded learning run on the bandit where behaviour cloning stays at the data's
mean, checkpoints, bad values, and a warm start continuing from an AWAC run (the spec is sac_compatible)."""

from __future__ import annotations

import dataclasses
import io
import math

import pytest
import torch

from rlrobot.algorithms.awac import AWAC, AWACConfig, advantage_weights
from rlrobot.algorithms.bc import BC, BCConfig
from rlrobot.algorithms.offline import OFFLINE_POLICY_KIND, offline_algorithm_names
from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.config import train_config

from .offline_bandit import BEST_GAIN, bandit_transitions, mean_distance_to_best


def small(data, seed: int = 0, **cfg) -> AWAC:
    torch.manual_seed(seed)  # network initialisation
    return AWAC(AWACConfig(**{"hidden": (16,), "batch_size": 8, **cfg}), 2, 2, data, "cpu",
                torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- the losses, by hand
def test_actor_loss_equals_a_hand_computation_on_a_tiny_batch():
    """L = -1/B sum_i w_i log N(a_i | tanh(mu(s_i)), sigma(s_i)), w_i = exp(A_i / lambda) / mean_j exp(A_j / lambda);
    the log-density written out per dimension, the weights with plain exp and mean (no softmax)."""
    algo = small(bandit_transitions(8), temperature=0.5)
    s = torch.tensor([[0.1, -0.3], [0.5, 0.2], [-0.7, 0.9]])
    a = torch.tensor([[0.2, -0.1], [1.0, -1.0], [-0.4, 0.6]])  # an action at the bounds keeps a finite likelihood
    adv = torch.tensor([0.3, -0.2, 0.05])
    with torch.no_grad():
        pre_mean, log_std = algo.networks["actor"](s)
    mean, std = torch.tanh(pre_mean), log_std.exp()
    log_prob = (-(a - mean) ** 2 / (2 * std**2) - torch.log(std * math.sqrt(2 * math.pi))).sum(1)
    raw = torch.exp(adv / 0.5)
    expected = -(log_prob * raw / raw.mean()).mean()
    out = algo.actor_loss(s, a, adv)
    assert out["actor"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert out["weight_max"].item() == pytest.approx((raw / raw.mean()).max().item(), rel=1e-6)
    clipped = small(bandit_transitions(8), temperature=0.5, weights="clip", max_weight=1.5)
    with torch.no_grad():
        pre_mean, log_std = clipped.networks["actor"](s)
    mean, std = torch.tanh(pre_mean), log_std.exp()
    log_prob = (-(a - mean) ** 2 / (2 * std**2) - torch.log(std * math.sqrt(2 * math.pi))).sum(1)
    expected = -(log_prob * raw.clamp(max=1.5)).mean()  # exp(0.6) = 1.82 is capped, the others are not
    assert clipped.actor_loss(s, a, adv)["actor"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_advantages_and_td_target_use_sampled_policy_actions_and_bootstrap_time_outs():
    """A = min_i Q_i(s, a) - mean_k min_i Q_i(s, a'_k), a'_k ~ N(tanh mu, sigma) clipped to [-1, 1] (current critics);
    the TD target r + gamma (1 - terminal) min_i Q'_i(s', a'), a' ~ pi(s') (target critics): replayed from the
    learner's generator."""
    data = bandit_transitions(8)
    algo = small(data, value_samples=3, gamma=0.9)
    with torch.no_grad():  # targets that differ from the critics, so the test sees which one is used
        for p in algo.networks["critic_target"].parameters():
            p.mul_(0.5)
    s = torch.tensor([[0.1, -0.3], [0.5, 0.2]])
    a = torch.tensor([[0.2, -0.1], [0.9, -0.9]])
    state = algo.generator.get_state()
    adv, v = algo.advantages(s, a)
    replay = torch.Generator().manual_seed(0)
    replay.set_state(state)
    critic = algo.networks["critic"]
    with torch.no_grad():
        pre_mean, log_std = algo.networks["actor"](s.repeat_interleave(3, 0))
        noise = torch.randn(pre_mean.shape, generator=replay)
        a_pi = (torch.tanh(pre_mean) + log_std.exp() * noise).clamp(-1, 1)
        v_hand = critic(s.repeat_interleave(3, 0), a_pi).min(0).values.view(2, 3).mean(1)
        q_hand = critic(s, a).min(0).values
    assert torch.allclose(v, v_hand, atol=1e-6) and torch.allclose(adv, q_hand - v_hand, atol=1e-6)

    batch = data.index(torch.arange(4))
    batch = dataclasses.replace(batch, rewards=torch.tensor([1.0, 0.5, -1.0, 0.0]),
                                terminals=torch.tensor([True, False, True, False]))
    s, s_next = algo.normalize(batch.obs), algo.normalize(batch.next_obs)
    state = algo.generator.get_state()
    loss, q = algo.critic_loss(batch, s, s_next)
    replay.set_state(state)
    with torch.no_grad():
        pre_mean, log_std = algo.networks["actor"](s_next)
        a_next = (torch.tanh(pre_mean) + log_std.exp() * torch.randn(pre_mean.shape, generator=replay)).clamp(-1, 1)
        q_next = algo.networks["critic_target"](s_next, a_next).min(0).values
        target = batch.rewards + 0.9 * torch.tensor([0.0, 1.0, 0.0, 1.0]) * q_next
        hand = sum(((q[i] - target) ** 2).mean() for i in range(2))
    assert loss.item() == pytest.approx(hand.item(), rel=1e-5)


# ---------------------------------------------------------------------- the weights
def test_advantage_weights_grow_with_the_advantage_and_lambda_trades_greed_for_imitation():
    """The paper's exp(A / lambda): higher advantage -> more weight, ratios exp((A_i - A_j) / lambda); the batch
    normalisation (the per-state Z(s) the paper drops, taken over the batch) makes them average 1 and ignore a shift
    of every A; lambda -> infinity is behaviour cloning (equal weights), a small lambda puts the mass on the best."""
    adv = torch.tensor([-1.0, -0.2, 0.0, 0.4, 2.0])
    w = advantage_weights(adv, 0.5)
    assert (w.diff() > 0).all() and w.mean().item() == pytest.approx(1.0)
    assert (w[4] / w[0]).item() == pytest.approx(math.exp(3.0 / 0.5), rel=1e-5)
    assert torch.allclose(advantage_weights(adv + 7.0, 0.5), w)
    assert torch.allclose(advantage_weights(adv, 1e6), torch.ones(5), atol=1e-4)
    assert advantage_weights(adv, 0.01)[4].item() == pytest.approx(5.0, rel=1e-4)
    big = advantage_weights(torch.tensor([0.0, 1000.0]), 0.1)  # no overflow: 2 x softmax
    assert torch.isfinite(big).all() and big.tolist() == pytest.approx([0.0, 2.0])
    clipped = advantage_weights(adv, 0.5, "clip", max_weight=10.0)
    assert torch.allclose(clipped, torch.exp(adv / 0.5).clamp(max=10.0)) and clipped[4].item() == 10.0


def test_after_learning_the_dataset_actions_near_the_best_get_the_most_weight():
    """On the bandit the learned critics rank the data's actions by reward: the quarter of actions closest to the best
    action 0.6 s gets over 10x the mean weight of the farthest quarter (measured 78x, 150x, 97x with seeds 0-2 after 250
    steps; 0.93 before training)."""
    data = bandit_transitions(2048, seed=0)
    algo = small(data, hidden=(32, 32), batch_size=256, lr=1e-3, temperature=0.3)

    def ratio() -> float:
        s = algo.normalize(data.obs)
        adv, _ = algo.advantages(s, data.actions)
        w = advantage_weights(adv, 0.3)
        dist = (data.actions - BEST_GAIN * data.obs["state"]).norm(dim=1)
        order = dist.argsort()
        quarter = len(order) // 4
        return float(w[order[:quarter]].mean() / w[order[-quarter:]].mean())

    assert ratio() < 2.0
    for _ in range(250):
        algo.update()
    assert ratio() > 10.0, ratio()


# ---------------------------------------------------------------------- learning
def test_awac_beats_behaviour_cloning_on_the_uniformly_random_bandit():
    """Uniformly random actions, r = -|a - 0.6 s|^2: BC (and AWAC at a large lambda) acts near the data's mean 0.
    Mean distance from the best action 0.6 s after 250 steps, measured with seeds 0-2: BC 0.46-0.48, AWAC at lambda 100
    0.46-0.48, the zero action 0.46, uniform random actions 0.86; AWAC at lambda 0.3 0.08-0.09 (lambda 1: 0.22-0.29).
    Thresholds: AWAC under 0.2, BC and lambda 100 over 0.4."""
    data = bandit_transitions(2048, seed=0)
    cfg = dict(hidden=(32, 32), batch_size=256, lr=1e-3)
    awac = small(data, **cfg, temperature=0.3)
    imitating = small(data, **cfg, temperature=100.0)
    torch.manual_seed(0)
    bc = BC(BCConfig(**cfg), 2, 2, data, "cpu", torch.Generator().manual_seed(0))
    for _ in range(250):
        stats = awac.update()
        imitating.update()
        bc.update()
    s = data.obs["state"]
    with torch.no_grad():
        d_awac, d_imitating, d_bc = (mean_distance_to_best(x.act(data.obs), s) for x in (awac, imitating, bc))
    assert d_awac < 0.2, d_awac
    assert d_bc > 0.4 and d_imitating > 0.4, (d_bc, d_imitating)
    assert stats["critic"] < 0.2 and math.isfinite(stats["actor"])


# ---------------------------------------------------------------------- checkpoints and the registry
def test_checkpoint_round_trip_continues_the_same_run():
    """Weights (networks) and state (optimizers, counter) restored into a learner built without data give the same
    actions, and a learner restored with data makes the same next gradient step as the original."""
    data = bandit_transitions(64, seed=0)
    algo = small(data)
    for _ in range(3):
        algo.update()
    buffer = io.BytesIO()  # through bytes, as a checkpoint file (the live state dicts share tensors with the learner)
    torch.save({"weights": algo.policy.state_dict(), "state": algo.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    weights, state = saved["weights"], saved["state"]
    acting = AWAC(algo.cfg, 2, 2, None, "cpu")
    acting.policy.load_state_dict(weights)
    acting.load_state_dict(state)
    obs = {"state": torch.randn(5, 2) * 2}
    assert torch.equal(acting.policy.act(obs), algo.policy.act(obs)) and acting.updates == 3
    assert acting.policy.act(obs).abs().max() <= 1.0

    resumed = small(data, seed=5)
    resumed.policy.load_state_dict(weights)
    resumed.load_state_dict(state)
    resumed.generator.set_state(algo.generator.get_state())
    algo.update()
    resumed.update()
    for (name, a), b in zip(algo.policy.state_dict().items(), resumed.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert resumed.updates == 4


def test_the_registry_builds_awac_and_a_checkpoint_rebuilds_its_policy():
    from rlrobot.policies.registry import build_policy

    spec = algorithm_spec("awac")
    assert spec.learner is AWAC and spec.config is AWACConfig and spec.policy_kind == OFFLINE_POLICY_KIND
    assert spec.needs_rewards and spec.sac_compatible and "awac" in offline_algorithm_names()
    cfg = train_config("awac", task="so101-push", dataset="x")
    cfg.awac.hidden = (16,)
    learner = spec.learner(cfg.awac, 2, 2, bandit_transitions(32), "cpu", torch.Generator().manual_seed(0))
    learner.update()
    meta = {"train": cfg.to_dict(), "policy_kind": OFFLINE_POLICY_KIND, "obs_dim": 2, "action_dim": 2}
    rebuilt = build_policy(meta, cfg)
    rebuilt.load_state_dict(learner.policy.state_dict())
    obs = {"state": torch.randn(4, 2)}
    assert torch.equal(rebuilt.act(obs), learner.policy.act(obs))


def test_the_presets_are_the_cpu_size_of_iqls():
    from rlrobot.configs import preset

    for task in ("so101-push", "so101-lift"):
        awac, iql = preset(task, "awac"), preset(task, "iql")
        assert awac.task == task and awac.algo == "awac"
        assert (awac.awac.gradient_steps, awac.awac.hidden, awac.awac.batch_size, awac.awac.gamma) == \
            (iql.iql.gradient_steps, iql.iql.hidden, iql.iql.batch_size, iql.iql.gamma) == (3000, (64, 64), 256, 0.9)
        assert awac.awac.temperature == AWACConfig().temperature == 1.0  # the reference code's lambda
        assert (awac.eval_episodes, awac.eval_envs) == (iql.eval_episodes, iql.eval_envs)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("temperature", 0.0, r"awac.temperature must be > 0"), ("temperature", math.nan, r"awac.temperature must be > 0"),
    ("weights", "softmax", r"awac.weights='softmax' is not one of \('batch', 'clip'\)"),
    ("max_weight", -1.0, r"awac.max_weight must be > 0"), ("value_samples", 0, r"awac.value_samples must be >= 1"),
    ("actor_weight_decay", -1e-4, r"awac.actor_weight_decay must be >= 0"), ("tau", 1.5, r"awac.tau must be in \(0, 1\]"),
    ("num_critics", 0, r"awac.num_critics must be >= 1"), ("gamma", 1.2, r"awac.gamma must be in"),
    ("hidden", (64, 0), r"awac.hidden must be"),
])
def test_bad_values_are_refused_naming_the_field(field, value, match):
    run = train_config("awac", task="so101-push", dataset="somewhere")
    setattr(run.awac, field, value)
    with pytest.raises(ValueError, match=match):
        run.validate()


# ---------------------------------------------------------------------- the warm start continues from AWAC
COMMON = dict(task="so101-reach", logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1,
              max_episode_steps=20, update_threads=1)


def test_a_warm_start_continues_from_an_awac_run_with_its_networks_and_mean_action(tmp_path):
    """--algo wsrl --init AWAC_RUN: the actor, the critics, their targets and the normaliser are copied bit for bit;
    SAC's deterministic action is AWAC's mean action; the discount and the critic ensemble are adopted."""
    from rlrobot.algorithms.wsrl import sac_weights_from_offline
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations
    from rlrobot.runners.base import make_runner

    dataset = tmp_path / "reach_noisy"
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=4, out=str(dataset), num_envs=4, noise=0.3))
    awac_out = tmp_path / "awac"
    cfg = train_config("awac", **COMMON, num_envs=1, dataset=str(dataset), out=str(awac_out), seed=3,
                       awac=AWACConfig(gradient_steps=6, updates_per_iteration=3, batch_size=32, hidden=(16, 16),
                                       num_critics=3, critic_layer_norm=True, gamma=0.8))
    offline = make_runner(cfg)
    offline.learn()
    wsrl = train_config("wsrl", **COMMON, num_envs=4, init=str(awac_out), out=str(tmp_path / "w"), total_steps=32,
                        eval_every=0)
    wsrl.wsrl = dataclasses.replace(wsrl.wsrl, learning_starts=16, batch_size=16, utd=0.5, rollout_steps=4,
                                    buffer_size=1000)
    runner = make_runner(wsrl)
    weights, _, _ = load_checkpoint(awac_out)
    expected = sac_weights_from_offline(weights, algorithm_spec("awac"))
    state = runner.policy.state_dict()
    assert set(expected) == set(state)
    assert all(torch.equal(state[k], v) for k, v in expected.items())
    assert runner.cfg.wsrl.gamma == 0.8 and runner.cfg.wsrl.num_target_critics == 3 and runner.cfg.wsrl.actor_q == "min"
    assert runner.policy.cfg.num_critics == 3 and runner.policy.cfg.critic_layer_norm
    obs = {"state": offline.algo.data.obs["state"][:6]}
    with torch.no_grad():
        assert torch.allclose(runner.policy.act(obs, deterministic=True), offline.algo.act(obs), atol=1e-6)
    runner.learn()  # the warm-up with the AWAC policy, then SAC's updates
    assert runner.algo.num_updates > 0
