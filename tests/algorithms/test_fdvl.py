"""f-DVL (rlrobot/algorithms/fdvl.py): the three conjugate losses by hand, where each puts V among the data's Q-values
(an implicit maximiser), the Gumbel loss's outlier scaling, a seeded learning run on the bandit where behaviour cloning
stays at the data's mean, checkpoints, the registry and bad values."""

from __future__ import annotations

import io
import math

import pytest
import torch

from rlrobot.algorithms.bc import BC, BCConfig
from rlrobot.algorithms.fdvl import (
    FDVL,
    FDVLConfig,
    chi_square_loss,
    dual_value_loss,
    reverse_kl_loss,
    total_variation_loss,
    with_random_actions,
)
from rlrobot.algorithms.offline import OFFLINE_POLICY_KIND, offline_algorithm_names
from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.config import train_config

from .offline_bandit import bandit_transitions, mean_distance_to_best


def small(data, seed: int = 0, **cfg) -> FDVL:
    torch.manual_seed(seed)
    return FDVL(FDVLConfig(**{"hidden": (16,), "batch_size": 8, **cfg}), 2, 2, data, "cpu", torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- the losses
def test_the_conjugate_losses_equal_their_formulas():
    x = torch.tensor([-6.0, -4.0, -1.0, 0.0, 0.5, 3.0])
    expected_chi = 0.7 * torch.tensor([6 * 6 / 4 - 6, 0.0, 0.0, 0.0, 0.5 + 0.0625, 3 + 2.25]) - 0.3 * x
    assert torch.allclose(chi_square_loss(x, 0.7), expected_chi)
    assert torch.allclose(total_variation_loss(x, 0.7), 0.7 * x.clamp(min=0) - 0.3 * x)
    z = x / 2.0
    m = z.max()
    assert torch.allclose(reverse_kl_loss(x, 2.0), torch.exp(z - m) - z * torch.exp(-m) - torch.exp(-m))


def minimiser(divergence: str, q: torch.Tensor, alpha: float) -> float:
    """argmin_v mean loss(q - v) by gradient descent from the mean of q."""
    v = q.mean().clone().requires_grad_(True)
    opt = torch.optim.Adam([v], lr=0.05)
    for _ in range(600):
        opt.zero_grad()
        dual_value_loss(q - v, divergence, alpha).mean().backward()
        opt.step()
    return float(v.detach())


def test_each_loss_puts_v_high_among_the_datas_q_values():
    """An implicit maximiser: over Q ~ N(0, 1), total variation at alpha puts V where a share (1 - alpha) / alpha of Q
    lies above it (alpha 0.7: 43 %, 0.9: 11 %); chi-square and the Gumbel loss also settle above the mean, higher for
    a larger alpha (chi-square) or a smaller temperature (Gumbel: V -> max as the temperature -> 0)."""
    q = torch.randn(2048, generator=torch.Generator().manual_seed(0))
    for alpha in (0.7, 0.9):
        above = float((q > minimiser("total-variation", q, alpha)).float().mean())
        assert above == pytest.approx((1 - alpha) / alpha, abs=0.03)
    chi = [minimiser("chi-square", q, a) for a in (0.6, 0.8, 0.95)]
    assert 0 < chi[0] < chi[1] < chi[2] < float(q.max())
    gumbel = [minimiser("reverse-kl", q, a) for a in (1.0, 0.3)]
    assert 0 < gumbel[0] < gumbel[1] < float(q.max())


def test_the_gumbel_loss_scales_an_outliers_gradient_down_and_chi_square_never_explodes():
    """XQL's instability: the gradient of e^z - z - 1 grows as e^z. With an outlier z = 30 the scaled reverse-KL loss
    keeps every gradient within 1 (the reference's e^(-max z) factor) and chi-square's gradient is linear in x."""
    x = torch.tensor([0.1, -0.2, 30.0], requires_grad=True)
    reverse_kl_loss(x, 1.0).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() <= 1.0
    raw = torch.tensor([30.0], requires_grad=True)
    (torch.exp(raw) - raw - 1).sum().backward()
    assert raw.grad.item() > 1e12
    y = torch.tensor([30.0], requires_grad=True)
    chi_square_loss(y, 1.0).sum().backward()
    assert y.grad.item() == pytest.approx(1 + 30 / 2)


def test_random_actions_join_the_values_batch_state_by_state():
    s = torch.arange(6.0).view(3, 2)
    a = torch.zeros(3, 2)
    s2, a2 = with_random_actions(s, a, 2, torch.Generator().manual_seed(0))
    assert torch.equal(s2, torch.cat([s, s, s])) and torch.equal(a2[:3], a)
    assert a2[3:].abs().max() <= 1.0 and a2[3:].std() > 0.3
    assert with_random_actions(s, a, 0, torch.Generator())[0] is s


# ---------------------------------------------------------------------- learning
def test_f_dvl_beats_behaviour_cloning_on_the_uniformly_random_bandit():
    """Uniformly random actions, r = -|a - 0.6 s|^2 (BC stays at the data's mean: 0.47-0.48 from the best action).
    Chi-square f-DVL at alpha 0.7, beta 10, 32x32 networks, 500 steps, seeds 0-2: 0.085, 0.087, 0.091 (IQL with the
    same networks and expectile 0.9 at 250 steps: 0.11-0.13). With the reference's cosine decay of the actor's
    learning rate over a 250-step run: 0.31, 0.46, 0.44 (hence its default off here)."""
    data = bandit_transitions(2048, seed=0)
    fdvl = small(data, hidden=(32, 32), batch_size=256, lr=1e-3, beta=10.0, temperature=0.7, random_actions=0,
                 gradient_steps=500)
    torch.manual_seed(0)
    bc = BC(BCConfig(hidden=(32, 32), lr=1e-3), 2, 2, data, "cpu", torch.Generator().manual_seed(0))
    for _ in range(500):
        stats = fdvl.update()
        bc.update()
    with torch.no_grad():
        d_fdvl = mean_distance_to_best(fdvl.act(data.obs), data.obs["state"])
        d_bc = mean_distance_to_best(bc.act(data.obs), data.obs["state"])
    assert d_fdvl < 0.15 and d_bc > 0.4, (d_fdvl, d_bc)
    assert 0.2 < stats["above_v"] < 0.6  # V is an upper value of the data's Q (total variation's 43 % at 0.7)


def test_the_actor_learning_rate_follows_a_cosine_when_asked():
    data = bandit_transitions(32)
    algo = small(data, gradient_steps=100, actor_cosine_decay=True, lr=1e-3)
    assert algo.actor_lr() == pytest.approx(1e-3)
    algo.updates = 50
    assert algo.actor_lr() == pytest.approx(5e-4)
    algo.updates = 100
    assert algo.actor_lr() == pytest.approx(0.0, abs=1e-12)
    assert small(data, gradient_steps=100).actor_lr() == pytest.approx(FDVLConfig().lr)


# ---------------------------------------------------------------------- checkpoints and the registry
def test_checkpoint_round_trip_continues_the_same_run():
    data = bandit_transitions(64, seed=0)
    algo = small(data)
    for _ in range(3):
        algo.update()
    buffer = io.BytesIO()
    torch.save({"weights": algo.policy.state_dict(), "state": algo.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    acting = FDVL(algo.cfg, 2, 2, None, "cpu")
    acting.policy.load_state_dict(saved["weights"])
    acting.load_state_dict(saved["state"])
    obs = {"state": torch.randn(5, 2) * 2}
    assert torch.equal(acting.policy.act(obs), algo.policy.act(obs)) and acting.updates == 3
    resumed = small(data, seed=5)
    resumed.policy.load_state_dict(saved["weights"])
    resumed.load_state_dict(saved["state"])
    resumed.generator.set_state(algo.generator.get_state())
    algo.update()
    resumed.update()
    for (name, a), b in zip(algo.policy.state_dict().items(), resumed.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_registry_and_the_presets():
    from rlrobot.configs import preset

    spec = algorithm_spec("f-dvl")
    assert spec.learner is FDVL and spec.config_field == "f_dvl" and spec.policy_kind == OFFLINE_POLICY_KIND
    assert "f-dvl" in offline_algorithm_names()
    for task in ("so101-push", "so101-lift"):
        cfg, iql = preset(task, "f-dvl"), preset(task, "iql")
        assert cfg.f_dvl.divergence == "chi-square" and cfg.f_dvl.temperature == FDVLConfig().temperature == 0.8
        assert (cfg.f_dvl.gradient_steps, cfg.f_dvl.hidden, cfg.f_dvl.gamma, cfg.f_dvl.beta) == \
            (iql.iql.gradient_steps, iql.iql.hidden, iql.iql.gamma, iql.iql.beta)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("divergence", "kl", r"f_dvl.divergence='kl' is not one of"),
    ("temperature", 1.5, r"f_dvl.temperature must be in \(0, 1\] for chi-square"),
    ("temperature", 0.0, r"f_dvl.temperature must be"), ("max_clip", -1.0, r"f_dvl.max_clip must be"),
    ("random_actions", -1, r"f_dvl.random_actions must be >= 0"), ("beta", -1.0, r"f_dvl.beta must be >= 0"),
    ("tau", math.inf, r"f_dvl.tau must be"),
])
def test_bad_values_are_refused_naming_the_field(field, value, match):
    run = train_config("f-dvl", task="so101-push", dataset="somewhere")
    setattr(run.f_dvl, field, value)
    with pytest.raises(ValueError, match=match):
        run.validate()


def test_reverse_kl_accepts_a_temperature_above_one():
    run = train_config("f-dvl", task="so101-push", dataset="somewhere")
    run.f_dvl.divergence, run.f_dvl.temperature = "reverse-kl", 8.0
    run.validate()
