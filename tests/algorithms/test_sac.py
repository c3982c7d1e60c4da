"""SAC: squashed-Gaussian log-prob, REDQ target subsets, temperature tuning, gradient isolation, a real learning run."""

import dataclasses

import pytest
import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from rlrobot.algorithms.sac import SAC, SACConfig
from rlrobot.data.replay_buffer import ReplayBuffer
from rlrobot.policies.sac_policy import SACPolicy, SACPolicyConfig

NET = SACPolicyConfig(actor_hidden=(32, 32), critic_hidden=(32, 32), activation="relu", normalize_obs=False)
CPU = torch.device("cpu")


def net(**kw) -> SACPolicyConfig:
    return dataclasses.replace(NET, **kw)


def make_sac(policy: SACPolicy, cfg: SACConfig) -> SAC:
    return SAC(policy, cfg, CPU, 8, {"state": ((policy.obs_dim,), torch.float32)})


def filled_buffer(obs_dim=3, action_dim=2, n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    buf = ReplayBuffer(n, 8, {"state": (obs_dim,)}, action_dim)
    for _ in range(n // 8):
        o = {"state": torch.randn(8, obs_dim, generator=g)}
        buf.add(o, torch.rand(8, action_dim, generator=g) * 2 - 1, torch.randn(8, generator=g),
                torch.zeros(8, dtype=torch.bool), torch.zeros(8, dtype=torch.bool), o, o)
    return buf


def test_squashed_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    policy = SACPolicy(4, 3, NET)
    x = torch.randn(64, 4)
    torch.manual_seed(1)
    action, log_prob = policy.actor.sample(x)
    mean, log_std = policy.actor(x)
    reference = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
    # clamp away from +-1 where TanhTransform's inverse is ill-conditioned in float32
    expected = reference.log_prob(action.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)
    assert torch.all(action.abs() < 1.0)
    assert torch.allclose(log_prob, expected, atol=2e-3), (log_prob - expected).abs().max()


def test_critic_ensemble_members_are_independent_and_target_is_a_copy():
    torch.manual_seed(0)
    policy = SACPolicy(3, 2, net(num_critics=5, critic_layer_norm=True))
    q = policy.critic(torch.randn(7, 3), torch.randn(7, 2))
    assert q.shape == (5, 7)
    assert len(set(q[:, 0].tolist())) == 5  # five different functions
    for p, pt in zip(policy.critic.parameters(), policy.critic_target.parameters(), strict=True):
        assert torch.equal(p, pt) and not pt.requires_grad


def test_redq_target_is_min_over_a_random_subset_of_m_critics():
    torch.manual_seed(0)
    policy = SACPolicy(3, 2, net(num_critics=10))
    sac = make_sac(policy, SACConfig(num_target_critics=2))
    member_values = torch.arange(10.0)[:, None].expand(10, 6)  # critic i predicts i everywhere
    g = torch.Generator().manual_seed(0)
    mins = [sac._target_q(member_values, g) for _ in range(200)]
    assert all(m.shape == (6,) for m in mins)
    values = torch.stack([m[0] for m in mins])
    # the min of 2 distinct members out of 10 is 0..8, never 9; P(min = k) = (9 - k) / 45
    assert values.max() <= 8 and values.min() >= 0
    assert len(set(values.tolist())) >= 6  # the subset really is redrawn
    assert abs(float((values == 0).float().mean()) - 9 / 45) < 0.08
    # M = N: plain min over all critics
    sac_full = make_sac(policy, SACConfig(num_target_critics=10))
    assert torch.all(sac_full._target_q(member_values, g) == 0)


@pytest.mark.parametrize("target_entropy, direction", [(5.0, +1), (-50.0, -1)])
def test_entropy_tuning_moves_alpha_toward_the_target(target_entropy, direction):
    torch.manual_seed(0)
    policy = SACPolicy(3, 2, NET)
    sac = make_sac(policy, SACConfig(target_entropy=target_entropy, alpha_lr=1e-2, init_alpha=0.5))
    buf = filled_buffer()
    g = torch.Generator().manual_seed(0)
    alphas = [float(sac.alpha)]
    for _ in range(30):
        sac.update(buf.sample(64, g), g)
        alphas.append(float(sac.alpha))
    # the policy's entropy (~ a few nats for 2-d tanh Gaussians) is below +5 -> alpha rises; above -50 -> it falls
    assert direction * (alphas[-1] - alphas[0]) > 0.1
    assert all(direction * (b - a) >= 0 for a, b in zip(alphas, alphas[1:], strict=False))


def test_update_changes_only_what_it_should():
    torch.manual_seed(0)
    policy = SACPolicy(3, 2, NET)
    sac = make_sac(policy, SACConfig(actor_update_every=2, tau=0.5))
    buf = filled_buffer()
    g = torch.Generator().manual_seed(0)
    actor_before = [p.clone() for p in policy.actor.parameters()]
    target_before = [p.clone() for p in policy.critic_target.parameters()]
    sac.update(buf.sample(32, g), g)  # update 0: critic + actor
    assert any(not torch.equal(a, p) for a, p in zip(actor_before, policy.actor.parameters(), strict=True))
    # target moved by Polyak toward the critic
    assert any(not torch.equal(a, p) for a, p in zip(target_before, policy.critic_target.parameters(), strict=True))
    actor_mid = [p.clone() for p in policy.actor.parameters()]
    stats = sac.update(buf.sample(32, g), g)  # update 1: critic only (delayed actor)
    assert "actor_loss" not in stats
    assert all(torch.equal(a, p) for a, p in zip(actor_mid, policy.actor.parameters(), strict=True))
    for p in policy.critic.parameters():
        assert p.requires_grad  # restored after the actor step


def test_actor_step_leaves_no_gradient_in_the_critics():
    torch.manual_seed(0)
    policy = SACPolicy(3, 2, NET)
    sac = make_sac(policy, SACConfig())
    buf = filled_buffer()
    g = torch.Generator().manual_seed(0)
    sac.update(buf.sample(32, g), g)
    # the last backward was the actor's (then alpha's): critic grads are those of the critic step, untouched since
    grads = [p.grad.clone() for p in policy.critic.parameters()]
    batch = buf.sample(32, g)
    policy.critic.requires_grad_(False)
    action, log_prob = policy.actor.sample(policy.features(batch["obs"]))
    (sac.alpha * log_prob - policy.critic(policy.features(batch["obs"]), action).min(0).values).mean().backward()
    policy.critic.requires_grad_(True)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, policy.critic.parameters(), strict=True))


def test_target_uses_discount_and_terminal_mask():
    """Target critics frozen at Q' = 10 (tau ~ 0) and alpha ~ 0: the TD target is r + discount x 10, where the batch's
    discount is gamma^n and 0 past a termination (as the replay buffer writes it). The loss of a mixed batch is the
    hand-computed one, and critic steps on a terminal batch regress Q toward r alone (3, not 3 + gamma x 10)."""
    torch.manual_seed(0)
    policy = SACPolicy(2, 1, NET)
    sac = make_sac(policy, SACConfig(init_alpha=1e-8, autotune_alpha=False, critic_lr=1e-2, tau=1e-9))
    with torch.no_grad():
        for p in policy.critic_target.parameters():
            p.zero_()
        policy.critic_target.net[-1].bias.fill_(10.0)
    obs = {"state": torch.randn(64, 2)}
    x, actions = policy.features(obs), torch.zeros(64, 1)
    discount = torch.tensor([0.0, 0.5, 0.99, 0.25]).repeat(16)
    mixed = {"obs": obs, "next_obs": obs, "actions": actions, "rewards": torch.arange(64.0) / 10,
             "terminated": discount == 0, "discount": discount}
    with torch.no_grad():
        loss, _ = sac.critic_loss(x, mixed, torch.Generator().manual_seed(0))
        q = policy.critic(x, actions)
    expected = (q - (mixed["rewards"] + 10.0 * discount)).square().mean(1).sum()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    terminal = {**mixed, "rewards": torch.full((64,), 3.0), "terminated": torch.ones(64, dtype=torch.bool),
                "discount": torch.zeros(64)}
    for _ in range(300):
        sac.update(terminal)
    assert torch.allclose(policy.critic_target(x, actions), torch.full((2, 64), 10.0), atol=1e-4)  # still frozen
    q = policy.critic(x, actions)
    assert torch.allclose(q, torch.full_like(q, 3.0), atol=0.1)


def test_config_rejects_bad_values():
    from rlrobot.config import train_config

    def run(**sac):
        return train_config("sac", task="gym:Pendulum-v1", num_envs=4, sac=SACConfig(**sac), policy=net(num_critics=2))

    with pytest.raises(ValueError, match="sac.utd must be > 0"):
        run(utd=0).validate()
    with pytest.raises(ValueError, match="batch_size=512 is larger than the replay contents at learning start"):
        run(batch_size=512, learning_starts=100).validate()
    with pytest.raises(ValueError, match="buffer_size=2 is smaller than num_envs=4"):
        run(buffer_size=2, learning_starts=0, batch_size=1).validate()
    with pytest.raises(ValueError, match="num_target_critics=3 exceeds policy.num_critics=2"):
        run(num_target_critics=3).validate()
    with pytest.raises(ValueError, match="actor_q"):
        run(actor_q="max").validate()


@pytest.mark.slow
def test_sac_learns_pendulum(tmp_path):
    """A real, seeded, small run through the gymnasium adapter: random policies score about -1200 on Pendulum-v1."""
    from rlrobot.config import train_config
    from rlrobot.runners.off_policy import OffPolicyRunner

    torch.set_num_threads(1)
    cfg = train_config("sac", task="gym:Pendulum-v1", num_envs=4, total_steps=PENDULUM_STEPS, seed=0,
                       out=str(tmp_path / "pendulum"), logger="none", checkpoint_every=1000, eval_every=0,
                       eval_envs=8, eval_episodes=8, video=False, update_threads=1,
                       sac=SACConfig(batch_size=128, utd=1.0, learning_starts=500, rollout_steps=25,
                                     buffer_size=20_000),
                       policy=SACPolicyConfig(actor_hidden=(64, 64), critic_hidden=(64, 64), activation="relu",
                                              normalize_obs=False))
    summary = OffPolicyRunner(cfg).learn()
    assert summary["env_steps"] == PENDULUM_STEPS
    assert summary["eval"]["return_mean"] >= PENDULUM_THRESHOLD, summary["eval"]


PENDULUM_STEPS = 6_000
PENDULUM_THRESHOLD = -400.0


def test_seeded_updates_are_bit_identical():
    """Same seed, same batches: the same networks, temperature and targets to the last bit (SAC's update and the
    actor / temperature / Polyak step it shares with cal-ql-online)."""
    def run():
        torch.manual_seed(0)
        policy = SACPolicy(3, 2, NET)
        sac = make_sac(policy, SACConfig(actor_update_every=2))
        buf, g = filled_buffer(), torch.Generator().manual_seed(0)
        for _ in range(5):
            sac.update(buf.sample(32, g), g)
        return {**policy.state_dict(), "log_alpha": sac.log_alpha.detach()}

    a, b = run(), run()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("utd", "actor_batch"), [(1.0, "last"), (4.0, "round"), (20.0, "last"), (0.5, "last")])
def test_utd_counts_critic_steps_with_one_actor_and_temperature_step_per_env_step(utd, actor_batch):
    torch.manual_seed(0)
    policy = SACPolicy(3, 2, NET)
    sac = make_sac(policy, SACConfig(utd=utd, batch_size=64, actor_batch=actor_batch))
    buf = filled_buffer()
    steps = {"critic": 0, "actor": 0, "alpha": 0}
    actor_rows: list[int] = []
    for name, optimizer in sac.optimizers.items():
        original = optimizer.step

        def counted(*args, _name=name, _original=original, **kwargs):
            steps[_name] += 1
            return _original(*args, **kwargs)

        optimizer.step = counted
    original_actor_step = sac.actor_step
    sac.actor_step = lambda x, stats: (actor_rows.append(len(x)), original_actor_step(x, stats))[1]
    transitions, sampled = 16, 0  # 2 vector steps of 8 envs
    for critic_steps in sac.rounds_due(transitions):
        batches = [buf.sample(64) for _ in range(critic_steps)]
        sampled += sum(len(b["actions"]) for b in batches)
        sac.update_round(batches)
    assert steps["critic"] == utd * transitions == sac.num_updates
    assert sampled == utd * transitions * 64  # critic samples: batch_size per critic step
    assert steps["actor"] == steps["alpha"] == min(utd, 1.0) * transitions
    assert set(actor_rows) == {64 * (int(utd) if actor_batch == "round" else 1)}
