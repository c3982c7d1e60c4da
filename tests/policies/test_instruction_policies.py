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


def test_flow_tokens_keep_the_word_order_and_film_on_tokens_starts_unconditioned():
    """Token ids reach the network per position: two instructions with the same words in another order encode
    differently (a sentence embedding hardly separates them: cosine 0.993 for the suite's swapped push-to pair)."""
    torch.manual_seed(0)
    space = {"state": (STATE,), "instruction_tokens": (6,)}
    tokens = torch.tensor([[3, 4, 5, 0, 0, 0], [3, 5, 4, 0, 0, 0]])
    obs = {"state": torch.zeros(2, STATE), "instruction_tokens": tokens.float()}  # rollout storage keeps floats
    concat = MLPFlowPolicy(space, ACT, FlowPolicyConfig(obs_keys=("state", "instruction_tokens")))
    emb = concat.encode(obs)
    assert not torch.allclose(emb[0], emb[1])
    torch.testing.assert_close(emb, concat.encode({**obs, "instruction_tokens": tokens}))
    film = MLPFlowPolicy(space, ACT, FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), instruction_fusion="film"))
    emb = film.encode(obs)
    torch.testing.assert_close(emb[0], emb[1])  # zero-initialised modulation
    with pytest.raises(ValueError, match="pick one instruction form"):
        FlowPolicyConfig(obs_keys=("state", "instruction_tokens", "instruction_embedding")).validate()


@pytest.mark.parametrize("names", [(), ("2", "3", "4")])
def test_entity_attention_reads_the_entity_the_words_name_and_generalises_to_new_layouts(names):
    """Three entities at random positions, the instruction names one, the target chunk is that entity's position:
    from 48 examples the entity-attention encoder predicts it for new layouts, and follows the words (the wrong word
    gives the other entity's position, not this one's). With identity keys and with keys made from the entities'
    names (token i + 2 names entity i)."""
    torch.manual_seed(0)
    arm, entities = 2, 3
    cfg = FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), chunk_size=1, state_entities=(f"{arm}:{entities}:2",),
                           state_hidden=(32, 32), embed_dim=64, velocity_hidden=(128, 128), time_embed_dim=16,
                           noise_hidden=(16,), value_hidden=(16,), entity_dim=32, entity_queries=1, instruction_vocab=8,
                           entity_names=names)
    cfg.validate()
    policy = MLPFlowPolicy({"state": (arm + 2 * entities,), "instruction_tokens": (3,)}, 2, cfg)

    def layouts(n: int, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        state = torch.rand(n, arm + 2 * entities, generator=g) * 2 - 1
        named = torch.randint(entities, (n,), generator=g)
        tokens = torch.stack([torch.ones(n, dtype=torch.long), 2 + named, torch.zeros(n, dtype=torch.long)], 1)
        return {"state": state, "instruction_tokens": tokens}, named, state[:, arm:].reshape(n, entities, 2)

    obs, named, pos = layouts(48, 1)
    policy.fit_observation_stats(obs)
    target = pos[torch.arange(48), named][:, None]
    opt = torch.optim.Adam(policy.flow_matching_parameters(), lr=3e-3)
    for _ in range(400):
        loss = policy.flow_matching_loss(obs, target, torch.rand(48), torch.randn(48, 1, 2))
        opt.zero_grad()
        loss.backward()
        opt.step()
    obs, named, pos = layouts(256, 2)
    rows = torch.arange(256)
    error = (policy.sample_actions(obs)[:, 0] - pos[rows, named]).norm(dim=-1)
    other = (named + 1) % entities
    wrong = {**obs, "instruction_tokens": torch.stack([obs["instruction_tokens"][:, 0], 2 + other,
                                                        obs["instruction_tokens"][:, 2]], 1)}
    follows = (policy.sample_actions(wrong)[:, 0] - pos[rows, other]).norm(dim=-1)
    spread = (pos[rows, named] - pos[rows, other]).norm(dim=-1).mean()  # ~1.0: what ignoring the words costs
    assert error.mean() < 0.25 * spread and follows.mean() < 0.25 * spread


def test_named_entity_keys_pick_the_named_entity_before_any_training_and_check_their_config():
    """Keys are the names' mean word embedding, queries pool the instruction's words: with the identity maps they
    start as, an instruction made of one entity's name words already attends to that entity most."""
    torch.manual_seed(0)
    arm = 2
    names = ("2 5", "3 5", "2 6", "4 7")  # "red cube", "green cube", "red zone", "blue bin"
    cfg = FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), state_entities=(f"{arm}:4:3",),
                           entity_names=names, entity_queries=1, instruction_vocab=8)
    policy = MLPFlowPolicy({"state": (arm + 12,), "instruction_tokens": (4,)}, ACT, cfg)
    tokens = torch.tensor([[int(x) for x in n.split()] + [0, 0] for n in names])
    attention = policy.entities.attention(torch.zeros(4, cfg.instruction_dim), tokens)[:, 0]  # [4 names, 4 entities]
    assert (attention.argmax(-1) == torch.arange(4)).all()
    for bad, match in [(dict(entity_names=("2 5",)), "has 1 names"), (dict(entity_names=("2 x", "3", "4", "5")), "token ids"),
                       (dict(entity_names=("9", "3", "4", "5")), "token ids")]:
        with pytest.raises(ValueError, match=match):
            c = FlowPolicyConfig(**{**cfg.__dict__, **bad})
            c.validate()
            MLPFlowPolicy({"state": (arm + 12,), "instruction_tokens": (4,)}, ACT, c)
    with pytest.raises(ValueError, match="entity_names needs"):
        FlowPolicyConfig(obs_keys=("state", "instruction_embedding"), state_entities=(f"{arm}:4:3",),
                         entity_names=names).validate()


def test_named_entity_keys_have_no_identity_key_layers_and_load_checkpoints_that_had_them():
    """Named keys never used the identity-key query / key layers: they are not built, and the weights of a
    checkpoint written while they were (an earlier version) still load, strictly, to the same outputs."""
    names = ("2 5", "3 5", "2 6", "4 7")
    spaces = {"state": (14,), "instruction_tokens": (4,)}
    named = FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), state_entities=("2:4:3",), entity_names=names,
                             entity_queries=1, instruction_vocab=8)
    policy = MLPFlowPolicy(spaces, ACT, named)
    keys = policy.state_dict().keys()
    assert not any(k.startswith(("entities.query.", "entities.key.")) for k in keys)
    old = dict(policy.state_dict())
    old.update({"entities.query.weight": torch.zeros(64, 128), "entities.query.bias": torch.zeros(64),
                "entities.key.weight": torch.zeros(64, 64), "entities.key.bias": torch.zeros(64)})
    fresh = MLPFlowPolicy(spaces, ACT, named)
    fresh.load_state_dict(old)  # strict
    obs = {"state": torch.randn(3, 14), "instruction_tokens": torch.tensor([[2, 5, 0, 0]] * 3)}
    torch.testing.assert_close(fresh.encode(obs), policy.encode(obs))
    identity = MLPFlowPolicy(spaces, ACT, FlowPolicyConfig(obs_keys=("state", "instruction_tokens"),
                                                           state_entities=("2:4:3",), entity_queries=1,
                                                           instruction_vocab=8))
    assert {"entities.query.weight", "entities.key.weight"} <= identity.state_dict().keys()


def test_entity_relations_are_the_picked_positions_relative_to_the_gripper_and_to_each_other():
    """flow.entity_anchor: with one-hot attention the relational features are exactly (entity - gripper) and
    (entity b - entity a) in metres x 10, with their lengths; a 2-wide entity (a zone) gets z = 0."""
    cfg = FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), state_entities=("3:2:3", "9:1:2"),
                           entity_queries=2, entity_anchor=0)
    policy = MLPFlowPolicy({"state": (11,), "instruction_tokens": (4,)}, ACT, cfg)
    raw = torch.randn(5, 11)
    attention = torch.zeros(5, 2, 3)
    attention[:, 0, 1] = 1.0  # query 0: the second object; query 1: the zone
    attention[:, 1, 2] = 1.0
    features = policy.entities.relations(raw, attention)
    gripper, obj = raw[:, 0:3], raw[:, 6:9]
    zone = torch.cat([raw[:, 9:11], torch.zeros(5, 1)], 1)
    vectors = torch.stack([obj - gripper, zone - gripper, zone - obj], 1) * 10.0
    torch.testing.assert_close(features, torch.cat([vectors.flatten(1), vectors.norm(dim=-1)], 1))
    assert policy.encode({"state": raw, "instruction_tokens": torch.ones(5, 4)}).shape == (5, cfg.embed_dim)
    with pytest.raises(ValueError, match="entity_anchor"):
        FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), entity_anchor=0).validate()
