"""FlowPolicy: exact chain log-likelihoods, SDE vs ODE marginals on a Gaussian target, deterministic evaluation."""

import math

import pytest
import torch
from torch.distributions import Normal

from rlrobot.algorithms.flow_ppo import chain_log_likelihood
from rlrobot.policies.flow import FlowPolicy, FlowPolicyConfig, MLPFlowPolicy, sde_sigmas, time_grid

OBS = {"state": (7,)}


def tiny_policy(**kw) -> MLPFlowPolicy:
    cfg = FlowPolicyConfig(chunk_size=3, denoising_steps=4, state_hidden=(32, 32), embed_dim=32, time_embed_dim=16,
                           velocity_hidden=(64, 64), noise_hidden=(16,), value_hidden=(16,), **kw)
    torch.manual_seed(0)
    return MLPFlowPolicy(OBS, 2, cfg)


def test_flow_noise_chain_log_prob_is_the_sum_of_its_gaussian_steps():
    policy = tiny_policy()
    obs = {"state": torch.randn(5, 7, generator=torch.Generator().manual_seed(1))}
    with torch.no_grad():
        chain, step_log_probs = policy.sample_chain(obs, "noise", generator=torch.Generator().manual_seed(2))
        # independently: replay the chain step by step with torch.distributions
        emb = policy.encode(obs)
        grid = time_grid(policy.denoising_steps)
        expected = Normal(0.0, 1.0).log_prob(chain[:, 0]).sum(-1)
        per_step = []
        for k in range(policy.denoising_steps):
            t, t_next = grid[k], grid[k + 1]
            x = chain[:, k]
            v, features = policy.velocity(x, t.expand(len(x)), emb)
            mean = x - (t - t_next) * v  # the ODE Euler step
            std = policy.noise_std(features)
            assert torch.all(std >= 0.08 - 1e-6) and torch.all(std <= 0.16 + 1e-6)
            lp = Normal(mean, std).log_prob(chain[:, k + 1]).sum(-1)
            per_step.append(lp)
            expected = expected + lp
        exact = chain_log_likelihood(policy, obs, chain, "noise")
    assert torch.allclose(exact, expected, atol=1e-3, rtol=1e-5)
    assert torch.allclose(step_log_probs.sum(-1), torch.stack(per_step, 1), atol=1e-3, rtol=1e-5)


class GaussianTargetFlow(MLPFlowPolicy):
    """The exact velocity field of a 1-D Gaussian target a ~ N(m, s^2) under x_t = t eps + (1 - t) a."""

    m, s = 0.7, 0.4

    def encode(self, obs):
        return torch.zeros(len(obs["state"]), 1)

    def velocity(self, x_t, t, emb):
        t = t[:, None]
        mean_t = (1 - t) * self.m
        var_t = t**2 + (1 - t) ** 2 * self.s**2
        cov = t - (1 - t) * self.s**2  # Cov(eps - a, x_t)
        return -self.m + cov / var_t * (x_t - mean_t), x_t


@pytest.mark.parametrize("noise_level", [0.3, 0.5])
def test_sde_and_ode_sampling_give_the_same_marginal(noise_level):
    cfg = FlowPolicyConfig(chunk_size=1, denoising_steps=50, state_hidden=(4,), embed_dim=4, time_embed_dim=4,
                           velocity_hidden=(4,), noise_hidden=(4,), value_hidden=(4,))
    policy = GaussianTargetFlow({"state": (1,)}, 1, cfg)
    obs = {"state": torch.zeros(40_000, 1)}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ode, _ = policy.sample_chain(obs, "ode", generator=gen)
        sde, _ = policy.sample_chain(obs, "sde", noise_level=noise_level, generator=gen)
    a_ode, a_sde = ode[:, -1, 0], sde[:, -1, 0]
    assert abs(a_ode.mean() - policy.m) < 0.02 and abs(a_ode.std() - policy.s) < 0.02
    assert abs(a_sde.mean() - a_ode.mean()) < 0.03
    assert abs(a_sde.var() - a_ode.var()) < 0.03
    # and the SDE really is stochastic given the initial noise
    assert not torch.allclose(sde[:, -1], ode[:, -1])


def test_sde_sigma_schedule():
    grid = time_grid(4)
    assert torch.allclose(grid, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    sig = sde_sigmas(grid, 0.5)
    # at t = 1 the denominator uses the next grid point: 0.5 * sqrt(1 / 0.25) = 1
    assert torch.allclose(sig, torch.tensor([1.0, 0.5 * math.sqrt(3.0), 0.5, 0.5 * math.sqrt(1 / 3)]))


def test_evaluation_sampling_is_deterministic():
    policy = tiny_policy()
    obs = {"state": torch.randn(6, 7)}
    torch.manual_seed(1)
    a = policy.sample_actions(obs, deterministic=True)
    torch.manual_seed(2)
    b = policy.sample_actions(obs, deterministic=True)
    assert a.shape == (6, 3, 2)
    assert torch.equal(a, b)
    torch.manual_seed(1)
    c = policy.sample_actions(obs, deterministic=False)
    assert not torch.equal(a, c)


def test_bad_config():
    with pytest.raises(ValueError, match="denoising_steps"):
        MLPFlowPolicy(OBS, 2, FlowPolicyConfig(denoising_steps=0))
    with pytest.raises(ValueError, match="chunk_size"):
        MLPFlowPolicy(OBS, 2, FlowPolicyConfig(chunk_size=0))
    with pytest.raises(ValueError, match="obs_keys"):
        MLPFlowPolicy(OBS, 2, FlowPolicyConfig(obs_keys=("image_front",)))


def test_image_observations():
    cfg = FlowPolicyConfig(chunk_size=2, denoising_steps=2, obs_keys=("state", "image_front"), state_hidden=(16,),
                           embed_dim=16, time_embed_dim=8, velocity_hidden=(32,), image_channels=(8, 8))
    torch.manual_seed(0)
    policy = MLPFlowPolicy({"state": (7,), "image_front": (3, 32, 32)}, 3, cfg)
    obs = {"state": torch.randn(4, 7), "image_front": torch.randint(0, 255, (4, 3, 32, 32), dtype=torch.uint8)}
    actions = policy.sample_actions(obs, deterministic=True)
    assert actions.shape == (4, 2, 3)
    inverted = {**obs, "image_front": 255 - obs["image_front"]}  # same state, another picture: other actions
    assert (policy.sample_actions(inverted, deterministic=True) - actions).abs().max() > 1e-4
    loss = policy.flow_matching_loss(obs, torch.rand(4, 2, 3), torch.rand(4), torch.randn(4, 2, 3))
    loss.backward()
    assert policy.branches["image_front"].proj.weight.grad.abs().sum() > 0  # the image branch is trained


def test_in_house_policy_implements_the_flow_policy_protocol():
    policy = tiny_policy(execute_steps=2)
    assert isinstance(policy, FlowPolicy)
    assert policy.execute_steps == 2 and tiny_policy().execute_steps == 3  # 0 = the whole chunk
    heads = {id(p) for p in policy.value_parameters()} | {id(p) for p in policy.noise_head.parameters()}
    trained = {id(p) for p in policy.flow_matching_parameters()}
    assert trained and not trained & heads and len(trained) + len(heads) == len(list(policy.parameters()))
    state = torch.randn(100, 7) * 3 + 1
    policy.fit_observation_stats({"state": state})
    assert torch.allclose(policy.state_mean, state.mean(0)) and torch.allclose(policy.state_std, state.std(0))


def _bimodal_sft(mean_flow: bool, updates: int = 600) -> MLPFlowPolicy:
    """SFT on chunks of one action that is -1 or +1 with equal probability, whatever the observation."""
    torch.manual_seed(0)
    cfg = FlowPolicyConfig(mean_flow=mean_flow, mean_flow_ratio=0.5, chunk_size=1, denoising_steps=1, state_hidden=(32, 32),
                           embed_dim=32, velocity_hidden=(64, 64), time_embed_dim=32)
    policy = MLPFlowPolicy({"state": (2,)}, 1, cfg)
    optimizer = torch.optim.Adam(policy.parameters(), 1e-3)
    g = torch.Generator().manual_seed(0)
    obs = {"state": torch.zeros(256, 2)}
    for _ in range(updates):
        chunks = (torch.randint(0, 2, (256, 1, 1), generator=g) * 2 - 1).float()
        t = torch.rand(256, generator=g) * 0.999 + 0.001
        loss = policy.flow_matching_loss(obs, chunks, t, torch.randn(256, 1, 1, generator=g), None, g)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy


def test_mean_flow_head_samples_a_bimodal_chunk_in_one_step_where_one_euler_step_gives_the_mean():
    """One Euler step of an instantaneous-velocity policy from x_1 = eps lands on E[a] = 0 (eps - v(eps, 1) = E[a | eps]);
    the average-velocity head jumps the whole interval and reaches the modes +-1."""
    g = torch.Generator().manual_seed(1)
    samples = {}
    for mean_flow in (False, True):
        policy = _bimodal_sft(mean_flow)
        with torch.no_grad():
            chain, _ = policy.sample_chain({"state": torch.zeros(512, 2)}, "ode", generator=g)
        samples[mean_flow] = chain[:, -1, 0]
    assert samples[False].abs().mean() < 0.2
    assert samples[True].abs().mean() > 0.45
    assert 0.3 < (samples[True] > 0).float().mean() < 0.7  # both modes


def test_mean_flow_training_velocity_is_the_instantaneous_velocity_on_an_empty_interval():
    torch.manual_seed(0)
    policy = MLPFlowPolicy({"state": (3,)}, 2, FlowPolicyConfig(mean_flow=True, chunk_size=2, velocity_hidden=(32,)))
    x, t, emb = torch.randn(5, 4), torch.rand(5), policy.encode({"state": torch.randn(5, 3)})
    v, _ = policy.velocity(x, t, emb)
    assert torch.allclose(policy.training_velocity(x, t, emb, t.clone()), v)
    r = t * 0.5
    induced = policy.training_velocity(x, t, emb, r)
    # V = u + (t - r) du/dt with du/dt along v: check the JVP against a finite difference of u along the trajectory
    u = lambda xx, tt: policy.average_velocity(xx, r, tt, emb)[0]  # noqa: E731
    h = 1e-3
    fd = (u(x + h * v, t + h) - u(x - h * v, t - h)) / (2 * h)
    assert torch.allclose(induced, u(x, t) + (t - r)[:, None] * fd, atol=1e-3)
    assert policy.interval_starts(torch.full((4000,), 0.8)).lt(0.8).float().mean().item() == pytest.approx(0.25, abs=0.03)
