"""EDP (rlrobot/algorithms/edp.py): the DPM-Solver against the exact probability-flow ODE of a Gaussian, the action
approximation as the inverse of the corruption, the IQL objective's losses by hand, seeded learning runs on a bandit
where behaviour cloning stays at the data's mean (both objectives), checkpoints, the registry and bad values."""

from __future__ import annotations

import dataclasses
import io
import math

import pytest
import torch

from rlrobot.algorithms.bc import BC, BCConfig
from rlrobot.algorithms.edp import EDP, EDPConfig, VPSchedule, dpm_solver_sample, solver_grid
from rlrobot.algorithms.offline import OFFLINE_POLICY_KIND, offline_algorithm_names
from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.config import train_config

from .offline_bandit import bandit_transitions, mean_distance_to_best


def small(data, seed: int = 0, **cfg) -> EDP:
    torch.manual_seed(seed)  # network initialisation
    return EDP(EDPConfig(**{"hidden": (16,), "batch_size": 8, "diffusion_steps": 100, "sampler_steps": 5, **cfg}), 2, 2,
               data, "cpu", torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- the diffusion
def gaussian_noise_predictor(schedule: VPSchedule, mean: float, std: float):
    """The exact eps-prediction E[eps | x_k] of data N(mean, std^2): sigma_k (x - alpha_k mean) / (alpha_k^2 std^2 +
    sigma_k^2)."""
    def eps(s, x, k):
        a, sg = schedule.alpha[k][:, None], schedule.sigma[k][:, None]
        return sg * (x - a * mean) / (a**2 * std**2 + sg**2)
    return eps


def test_the_solver_follows_the_exact_probability_flow_of_a_gaussian():
    """The probability-flow ODE maps noise z to mean + std z. With the exact noise predictor of N(0.2, 0.1^2) and
    K = 1,000: 10 steps of DPM-Solver++(2M) land within 0.003 of it on average (measured 0.0012), DDIM's 10 steps
    miss by over 5x more (measured 0.017); for a point mass a any number of steps gives the ODE's exact end point at
    k = 0, alpha_0 a + sigma_0 z."""
    schedule = VPSchedule(1000)
    z = torch.randn(20_000, 1, generator=torch.Generator().manual_seed(0))
    eps = gaussian_noise_predictor(schedule, 0.2, 0.1)
    second = (dpm_solver_sample(eps, schedule, None, z, 10, order=2) - (0.2 + 0.1 * z)).abs().mean().item()
    first = (dpm_solver_sample(eps, schedule, None, z, 10, order=1) - (0.2 + 0.1 * z)).abs().mean().item()
    assert second < 0.003 and first > 5 * second, (second, first)
    point = dpm_solver_sample(gaussian_noise_predictor(schedule, -0.4, 0.0), schedule, None, z, 3)
    assert torch.allclose(point, schedule.alpha[0] * -0.4 + schedule.sigma[0] * z, atol=1e-4)


def test_the_solver_grid_runs_from_the_noisiest_step_to_the_cleanest_evenly_in_log_snr():
    schedule = VPSchedule(1000)
    grid = solver_grid(schedule, 15)
    assert grid[0] == 999 and grid[-1] == 0 and (grid.diff() < 0).all() and len(grid) == 16
    gaps = schedule.lam[grid].diff()
    assert gaps.min() > 0.5 * gaps.mean() and gaps.max() < 1.5 * gaps.mean()  # about even in lambda
    assert len(solver_grid(VPSchedule(10), 50)) <= 10  # never more points than steps


def test_the_action_approximation_inverts_the_corruption_and_the_schedule_is_ddpms():
    """a_hat(a_k, k, eps) = a for the noise that made a_k; alpha_bar falls from 1 - 1e-4 to ~4e-5 over K = 1,000 (the
    linear betas 1e-4 .. 0.02), and K = 100 scales the betas by 10 (an end point of the same order, 2e-5)."""
    schedule = VPSchedule(1000)
    a = torch.rand(64, 3) * 1.8 - 0.9
    k = torch.randint(1000, (64,))
    noise = torch.randn(64, 3)
    assert torch.allclose(schedule.predict_action(schedule.corrupt(a, k, noise), k, noise), a, atol=2e-3)
    assert float(schedule.alpha[0] ** 2) == pytest.approx(1 - 1e-4, rel=1e-6)
    assert float(schedule.alpha[-1] ** 2) == pytest.approx(4.0e-5, rel=0.1)
    assert 1e-5 < float(VPSchedule(100).alpha[-1] ** 2) < 1e-4


def test_iql_losses_equal_a_hand_computation():
    """L_diff = mean ||eps_theta(s, a_k, k) - eps||^2 and the guide -mean_i w_i log N(a_i | a_hat_i, I) with
    w = min(exp(beta (min Q'(s, a) - V(s))), 100), replayed from the learner's generator."""
    data = bandit_transitions(16)
    algo = small(data, beta=2.0)
    batch = data.index(torch.arange(6))
    s, s_next = algo.normalize(batch.obs), algo.normalize(batch.next_obs)
    state = algo.generator.get_state()
    out = algo.iql_losses(batch, s, s_next)
    replay = torch.Generator().manual_seed(0)
    replay.set_state(state)
    with torch.no_grad():
        k = torch.randint(100, (6,), generator=replay)
        noise = torch.randn(6, 2, generator=replay)
        x = algo.schedule.corrupt(batch.actions, k, noise)
        eps = algo.networks["actor"](s, x, k)
        a_hat = ((x - algo.schedule.sigma[k, None] * eps) / algo.schedule.alpha[k, None]).clamp(-1, 1)
        w = torch.exp(2.0 * (algo.networks["critic_target"](s, batch.actions).min(0).values
                             - algo.networks["value"](s).squeeze(-1))).clamp(max=100)
        log_n = (-0.5 * (batch.actions - a_hat) ** 2 - 0.5 * math.log(2 * math.pi)).sum(1)
    assert out["diffusion"].item() == pytest.approx(((eps - noise) ** 2).mean().item(), rel=1e-5)
    assert out["guide"].item() == pytest.approx(-(w * log_n).mean().item(), rel=1e-5)


# ---------------------------------------------------------------------- learning
@pytest.mark.parametrize(("objective", "limit"), [("iql", 0.35), ("td3", 0.35)])
def test_edp_beats_behaviour_cloning_on_the_uniformly_random_bandit(objective, limit):
    """Uniformly random actions, r = -10 |a - 0.6 s|^2 (the bandit's reward x 10, so that the advantages dominate a
    temperature-1 softmax of Q). BC acts near the data's mean: 0.48-0.50 from the best action 0.6 s. EDP, evaluated as
    the reference (50 solver samples, one picked by softmax(min Q)), after 600 steps with 64x64 networks, seeds 0-2:
    IQL objective 0.27, 0.27, 0.27; TD3 0.23, 0.24 (its raw samples, one per state: IQL 0.56-0.65, TD3 0.38-0.41: the
    unweighted diffusion loss keeps the sampler near the data; the Q pick does the rest, as in the reference)."""
    data = bandit_transitions(2048, seed=0)
    data = dataclasses.replace(data, rewards=data.rewards * 10)
    edp = small(data, hidden=(64, 64), batch_size=256, lr=1e-3, beta=3.0, diffusion_steps=1000, sampler_steps=10,
                objective=objective)
    torch.manual_seed(0)
    bc = BC(BCConfig(hidden=(64, 64), lr=1e-3), 2, 2, data, "cpu", torch.Generator().manual_seed(0))
    for _ in range(600):
        stats = edp.update()
        bc.update()
    obs = {"state": data.obs["state"][:256]}
    torch.manual_seed(1)
    with torch.no_grad():
        d_edp, d_bc = mean_distance_to_best(edp.act(obs), obs["state"]), mean_distance_to_best(bc.act(obs), obs["state"])
    assert d_edp < limit and d_bc > 0.45, (d_edp, d_bc)
    assert all(math.isfinite(v) for v in stats.values())


def test_td3_target_policy_trails_the_actor_only_after_the_warm_up():
    data = bandit_transitions(64)
    algo = small(data, objective="td3")
    before = [p.clone() for p in algo.networks["actor_target"].parameters()]
    for _ in range(5):
        algo.update()
    assert all(torch.equal(a, b) for a, b in zip(before, algo.networks["actor_target"].parameters(), strict=True))
    algo.updates = 999  # the next updates are the 1,000th ... 1,005th: the 1,005th moves the target policy
    for _ in range(6):
        algo.update()
    assert any(not torch.equal(a, b) for a, b in zip(before, algo.networks["actor_target"].parameters(), strict=True))


# ---------------------------------------------------------------------- checkpoints and the registry
def test_checkpoint_round_trip_acts_and_continues_as_the_original():
    data = bandit_transitions(64, seed=0)
    algo = small(data)
    for _ in range(3):
        algo.update()
    buffer = io.BytesIO()
    torch.save({"weights": algo.policy.state_dict(), "state": algo.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    acting = EDP(algo.cfg, 2, 2, None, "cpu")
    acting.policy.load_state_dict(saved["weights"])
    acting.load_state_dict(saved["state"])
    obs = {"state": torch.randn(5, 2) * 2}
    torch.manual_seed(3)
    first = acting.policy.act(obs)
    torch.manual_seed(3)
    assert torch.equal(first, algo.policy.act(obs)) and acting.updates == 3 and first.abs().max() <= 1.0

    resumed = small(data, seed=5)
    resumed.policy.load_state_dict(saved["weights"])
    resumed.load_state_dict(saved["state"])
    resumed.generator.set_state(algo.generator.get_state())
    algo.update()
    resumed.update()
    for (name, a), b in zip(algo.policy.state_dict().items(), resumed.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_registry_builds_edp_and_a_checkpoint_rebuilds_its_policy():
    from rlrobot.policies.registry import build_policy

    spec = algorithm_spec("edp")
    assert spec.learner is EDP and spec.policy_kind == OFFLINE_POLICY_KIND and "edp" in offline_algorithm_names()
    cfg = train_config("edp", task="so101-push", dataset="x")
    cfg.edp.hidden, cfg.edp.diffusion_steps, cfg.edp.act_samples = (16,), 50, 4
    learner = spec.learner(cfg.edp, 2, 2, bandit_transitions(32), "cpu", torch.Generator().manual_seed(0))
    learner.update()
    meta = {"train": cfg.to_dict(), "policy_kind": OFFLINE_POLICY_KIND, "obs_dim": 2, "action_dim": 2}
    rebuilt = build_policy(meta, cfg)
    rebuilt.load_state_dict(learner.policy.state_dict())
    obs = {"state": torch.randn(4, 2)}
    torch.manual_seed(0)
    a = rebuilt.act(obs)
    torch.manual_seed(0)
    assert torch.equal(a, learner.policy.act(obs))


def test_the_presets_have_iqls_budget():
    from rlrobot.configs import preset

    for task in ("so101-push", "so101-lift"):
        edp, iql = preset(task, "edp"), preset(task, "iql")
        assert edp.task == task and edp.edp.objective == "iql"
        assert (edp.edp.gradient_steps, edp.edp.batch_size, edp.edp.gamma, edp.edp.beta, edp.edp.expectile) == \
            (iql.iql.gradient_steps, iql.iql.batch_size, iql.iql.gamma, iql.iql.beta, iql.iql.expectile)
        assert (edp.edp.diffusion_steps, edp.edp.sampler_steps, edp.edp.act_samples) == (1000, 15, 50)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("objective", "crr", r"edp.objective='crr' is not one of \('iql', 'td3'\)"),
    ("diffusion_steps", 0, r"edp.diffusion_steps must be >= 1"), ("sampler_steps", 0, r"edp.sampler_steps must be >= 1"),
    ("time_dim", 15, r"edp.time_dim must be even"), ("sampler_order", 3, r"edp.sampler_order must be 1 or 2"),
    ("expectile", 1.0, r"edp.expectile must be in \(0, 1\)"), ("beta", -1.0, r"edp.beta must be >= 0"),
    ("tau", 0.0, r"edp.tau must be"), ("act_pick", "mean", r"edp.act_pick='mean' is not one of"),
])
def test_bad_values_are_refused_naming_the_field(field, value, match):
    run = train_config("edp", task="so101-push", dataset="somewhere")
    setattr(run.edp, field, value)
    with pytest.raises(ValueError, match=match):
        run.validate()
