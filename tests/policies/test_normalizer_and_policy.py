import torch

from rlrobot.policies import ActorCritic, ActorCriticConfig, RunningNormalizer


def test_running_normalizer_matches_batch_statistics():
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(1000, 3, generator=gen) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.5])
    norm = RunningNormalizer(3)
    for chunk in data.split(137):
        norm.update(chunk)
    assert torch.allclose(norm.mean, data.mean(0), atol=1e-4)
    assert torch.allclose(norm.var, data.var(0, unbiased=False), rtol=1e-3)
    z = norm(data)
    assert torch.allclose(z.mean(0), torch.zeros(3), atol=1e-3)


def test_normalizer_is_saved_with_the_policy():
    policy = ActorCritic(4, 2, ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)))
    policy.normalizer.update(torch.randn(50, 4) + 3)
    state = policy.state_dict()
    assert "normalizer.mean" in state and "normalizer.var" in state
    other = ActorCritic(4, 2, ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)))
    other.load_state_dict(state)
    x = torch.randn(5, 4)
    assert torch.equal(policy(x), other(x))
    # the exported forward includes the normaliser and bounds the action
    exported = torch.export.export(policy, (x,)).module()
    assert torch.allclose(exported(x), policy(x))
    assert policy(x * 1e3).abs().max() <= 1.0


def test_deterministic_action_is_the_mean():
    torch.manual_seed(0)
    policy = ActorCritic(3, 2, ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)))
    with torch.no_grad():  # a mean well away from 0, inside the action bounds
        policy.actor[-1].bias.copy_(torch.tensor([0.5, -0.4]))
    obs = {"state": torch.randn(6, 3)}
    mean = policy.distribution(policy.features(obs)).mean
    assert 0.3 < mean.abs().min() and mean.abs().max() < 1.0  # the clamp leaves this mean as it is
    a1 = policy.act(obs, deterministic=True)
    assert torch.equal(a1, mean)
    assert not torch.equal(policy.act(obs), policy.act(obs))
    # the stochastic actions scatter around that mean: 4,000 draws average to it
    draws = torch.stack([policy.act(obs) for _ in range(4000)])
    assert torch.allclose(draws.mean(0), mean, atol=0.05)
    # a mean beyond the bounds is clamped to them
    with torch.no_grad():
        policy.actor[-1].bias.fill_(5.0)
    assert torch.equal(policy.act(obs, deterministic=True), torch.ones(6, 2))


def test_fast_tanh_matches_tanh_and_its_gradient():
    from rlrobot.policies.actor_critic import FastTanh

    x = torch.linspace(-20, 20, 40001, dtype=torch.float32).requires_grad_()
    y = FastTanh()(x)
    assert (y - torch.tanh(x)).abs().max() < 2e-7
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.allclose(g, 1 - torch.tanh(x.detach()) ** 2, atol=1e-6)
    policy = ActorCritic(4, 2, ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,), activation="tanh-fast"))
    assert isinstance(policy.actor[1], FastTanh)
