"""Reward kinds (rlrobot.rewards.registry): each built-in kind is one registered spec with what it needs as data; a
kind without settings registers by name and factory; a kind registered twice or unknown is refused naming the kinds."""

from __future__ import annotations

import pytest

from rlrobot.config import train_config
from rlrobot.rewards import RewardConfig, RewardSpec, register_reward, reward_names
from rlrobot.rewards.registry import REWARD_KINDS, split_shaping


def test_the_built_in_kinds_are_registered_with_their_settings_and_needs():
    names = reward_names()
    assert names[0] == "none" and {"dense-potential", "prm", "srpo"} <= set(names) and list(names[1:]) == sorted(names[1:])
    prm, srpo, dense = (REWARD_KINDS.get(name) for name in ("prm", "srpo", "dense-potential"))
    assert (prm.config_field, prm.argument, prm.shown, prm.native_task) == ("prm", "PATH", "prm:PATH", "")
    assert (srpo.config_field, bool(srpo.native_task), bool(srpo.state_observation)) == ("srpo", True, True)
    assert (dense.config, dense.config_field, bool(dense.native_task)) == (None, None, True)
    assert split_shaping("prm:runs/a,runs/b") == ("prm", "runs/a,runs/b") and split_shaping("srpo") == ("srpo", "")


def test_a_kind_without_settings_registers_by_name_and_is_selected_by_shaping():
    made = []

    def make_factory(gamma):
        made.append(gamma)
        return lambda env: env

    spec = register_reward("identity-for-a-test", make_factory)
    try:
        assert "identity-for-a-test" in reward_names() and spec.config is None
        cfg = train_config("ppo", reward=RewardConfig(shaping="identity-for-a-test"))
        cfg.validate()
        (factory,) = cfg.reward_wrappers()
        assert made == [cfg.ppo.gamma] and factory("env") == "env"
        with pytest.raises(ValueError, match="reward kind 'identity-for-a-test' is registered twice"):
            register_reward("identity-for-a-test", lambda gamma: (lambda env: env))
        with pytest.raises(ValueError, match="identity-for-a-test takes no argument"):
            train_config("ppo", reward=RewardConfig(shaping="identity-for-a-test:x")).validate()
    finally:
        REWARD_KINDS._specs.pop("identity-for-a-test")


def test_a_spec_needs_its_section_and_its_field_together():
    with pytest.raises(ValueError, match="config and config_field go together"):
        RewardSpec("half", "a spec with a section but no field", lambda gamma, settings, argument: None,
                   config=RewardConfig)


def test_an_unknown_kind_is_refused_naming_every_kind():
    shown = ("none", *(spec.shown for spec in REWARD_KINDS.specs()))
    assert "prm:PATH" in shown
    with pytest.raises(ValueError) as refused:
        train_config("ppo", reward=RewardConfig(shaping="magic")).validate()
    assert str(refused.value) == f"reward.shaping='magic' is not one of {shown}"
