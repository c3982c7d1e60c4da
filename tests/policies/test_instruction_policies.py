"""Policies that read an instruction embedding: the MLP actor-critic and SAC (concatenation) and the flow policy
(concatenation or FiLM). Off by default: the parameters of a policy without it are those of old checkpoints."""

import pytest
import torch

from rlrobot.policies.actor_critic import ActorCritic, ActorCriticConfig
from rlrobot.policies.flow import FlowPolicyConfig, MLPFlowPolicy
from rlrobot.policies.registry import build_policy, policy_spec
from rlrobot.policies.sac_policy import SACPolicy, SACPolicyConfig

STATE, EMB, ACT = 10, 384, 5


def batch(n: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, EMB, generator=g), dim=-1)
    return {"state": torch.randn(n, STATE, generator=g), "instruction_embedding": emb}


@pytest.mark.parametrize("cls, cfg_cls", [(ActorCritic, ActorCriticConfig), (SACPolicy, SACPolicyConfig)])
def test_mlp_policies_read_the_instruction_only_when_asked(cls, cfg_cls):
    plain = cls(STATE, ACT, cfg_cls())
    assert cls(STATE, ACT, cfg_cls(), instruction_dim=EMB).state_dict().keys() == plain.state_dict().keys()
    torch.manual_seed(0)
    policy = cls(STATE, ACT, cfg_cls(instruction_key="instruction_embedding"), instruction_dim=EMB)
    obs = batch()
    swapped = {**obs, "instruction_embedding": obs["instruction_embedding"].flip(0)}
    a, b = policy.act(obs, deterministic=True), policy.act(swapped, deterministic=True)
    assert a.shape == (4, ACT) and not torch.allclose(a, b)
    torch.testing.assert_close(policy(obs["state"], obs["instruction_embedding"]), a)
    with pytest.raises(KeyError, match="instruction_embedding"):
        policy.act({"state": obs["state"]})


def test_registry_builds_the_instruction_input_from_checkpoint_metadata():
    meta = {"policy_kind": "actor-critic", "task": "so101-suite", "obs_dim": STATE, "action_dim": ACT,
            "observation_space": {"state": [STATE], "instruction_tokens": [24], "instruction_embedding": [EMB]}}
    run = type("Run", (), {"policy": ActorCriticConfig(instruction_key="instruction_embedding")})()
    assert build_policy(meta, run).instruction_dim == EMB
    run.policy = ActorCriticConfig(instruction_key="instruction_tokens_missing")
    with pytest.raises(ValueError, match="instruction_key"):
        policy_spec("actor-critic").build(meta, run.policy)


@pytest.mark.parametrize("fusion", ["concat", "film"])
def test_flow_policy_learns_to_follow_the_words(fusion):
    """Two instructions, same states, opposite target chunks: only the instruction tells them apart, and 150
    flow-matching steps make the deterministic chunk follow it."""
    torch.manual_seed(0)
    cfg = FlowPolicyConfig(obs_keys=("state", "instruction_embedding"), instruction_fusion=fusion, chunk_size=2,
                           state_hidden=(32, 32), embed_dim=32, velocity_hidden=(64, 64), time_embed_dim=16,
                           noise_hidden=(16,), value_hidden=(16,))
    policy = MLPFlowPolicy({"state": (STATE,), "instruction_embedding": (EMB,)}, ACT, cfg)
    obs = batch(32)
    words = torch.nn.functional.normalize(torch.randn(2, EMB), dim=-1)
    which = torch.arange(32) % 2
    obs["instruction_embedding"] = words[which]
    target = torch.where(which[:, None, None] == 0, 0.6, -0.6).expand(32, 2, ACT)
    opt = torch.optim.Adam(policy.flow_matching_parameters(), lr=3e-3)
    for _ in range(150):
        loss = policy.flow_matching_loss(obs, target, torch.rand(32), torch.randn(32, 2, ACT))
        opt.zero_grad()
        loss.backward()
        opt.step()
    chunk = policy.sample_actions(obs)
    assert (chunk[which == 0] > 0.3).all() and (chunk[which == 1] < -0.3).all()


def test_flow_film_starts_as_the_unconditioned_policy_and_checks_its_inputs():
    cfg = FlowPolicyConfig(obs_keys=("state", "instruction_embedding"), instruction_fusion="film")
    policy = MLPFlowPolicy({"state": (STATE,), "instruction_embedding": (EMB,)}, ACT, cfg)
    obs = batch()
    swapped = {**obs, "instruction_embedding": obs["instruction_embedding"].flip(0)}
    torch.testing.assert_close(policy.encode(obs), policy.encode(swapped))  # zero-initialised modulation
    with pytest.raises(ValueError, match="instruction_fusion"):
        FlowPolicyConfig(obs_keys=("instruction_embedding",), instruction_fusion="film").validate()
    with pytest.raises(ValueError, match="instruction_fusion"):
        FlowPolicyConfig(instruction_fusion="gate").validate()
