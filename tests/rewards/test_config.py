"""``--reward.*`` (rlrobot.rewards.config): RewardConfig is made from the registered kinds (one section per kind with
settings, nothing per kind in its code), the selected kind's needs and its own section are validated, the flags parse,
and a saved run config with the flat reward fields of config version 2 loads into the sections."""

from __future__ import annotations

import dataclasses

import pytest
import tyro

from rlrobot.checkpoints import CONFIG_VERSION, upgrade_config
from rlrobot.config import config_class, config_from_dict, train_config
from rlrobot.rewards import RewardConfig
from rlrobot.rewards.progress_reward import ProgressRewardConfig
from rlrobot.rewards.registry import REWARD_KINDS
from rlrobot.rewards.srpo import SRPORewardConfig


def test_reward_config_has_the_shared_fields_and_a_section_per_kind_with_settings():
    fields = {f.name: f.type for f in dataclasses.fields(RewardConfig)}
    with_settings = {spec.config_field: spec.config for spec in REWARD_KINDS.specs() if spec.config is not None}
    assert list(fields) == ["shaping", "gamma", *sorted(with_settings)]
    assert with_settings["prm"] is ProgressRewardConfig and with_settings["srpo"] is SRPORewardConfig
    assert "dense-potential" in REWARD_KINDS and "dense_potential" not in fields  # a kind without settings: no section
    assert all(fields[name] is cls for name, cls in with_settings.items())
    assert RewardConfig.__module__ == "rlrobot.rewards.config"  # pickle and copy find the made class by name


def test_the_nested_flags_parse_into_the_kinds_sections():
    cfg = tyro.cli(config_class("ppo"), args=["--reward.shaping", "prm:runs/prm", "--reward.prm.mode", "progress",
                                              "--reward.prm.scale", "0.5", "--reward.prm.done", "--reward.srpo.memory", "8"])
    assert cfg.reward.shaping == "prm:runs/prm"
    assert cfg.reward.prm == ProgressRewardConfig(mode="progress", scale=0.5, done=True)
    assert cfg.reward.srpo.memory == 8
    with pytest.raises(SystemExit):
        tyro.cli(config_class("ppo"), args=["--reward.prm-scale", "0.5"])  # the flat flag is gone


def test_only_the_selected_kind_is_validated_and_its_needs_come_from_its_spec():
    cfg = train_config("ppo", reward=RewardConfig(shaping="dense-potential", prm=ProgressRewardConfig(mode="level")))
    cfg.validate()  # the prm section is not used
    cfg.reward.shaping = "prm:runs/prm"
    with pytest.raises(ValueError, match="reward.prm.mode='level' is not one of"):
        cfg.validate()
    adapter = train_config("ppo", task="gym:Pendulum-v1", reward=RewardConfig(shaping="srpo"))
    with pytest.raises(ValueError, match=r"needs a native task \(instructions and success per episode\); "
                                         r"task='gym:Pendulum-v1' is an adapter"):
        adapter.reward.validate(adapter)
    pixels = train_config("ppo", obs_mode="rgb", reward=RewardConfig(shaping="srpo"))
    with pytest.raises(ValueError, match="embeds episodes by their state; obs_mode='rgb' has no state"):
        pixels.reward.validate(pixels)
    with pytest.raises(ValueError, match="reward.gamma must be in"):
        train_config("ppo", reward=RewardConfig(shaping="srpo", gamma=0.0)).validate()


def test_the_wrappers_take_the_algorithms_discount_unless_gamma_is_set():
    assert RewardConfig().wrappers(0.99) == []
    env_gammas = []
    spec = REWARD_KINDS.get("dense-potential")
    original = spec.make
    try:
        object.__setattr__(spec, "make", lambda gamma, settings, argument: env_gammas.append(gamma) or (lambda env: env))
        RewardConfig(shaping="dense-potential").wrappers(0.97)
        RewardConfig(shaping="dense-potential", gamma=0.5).wrappers(0.97)
    finally:
        object.__setattr__(spec, "make", original)
    assert env_gammas == [0.97, 0.5]


def test_a_version_2_run_config_with_flat_reward_fields_loads_into_the_sections():
    saved = {"config_version": 2, "algo": "ppo", "task": "so101-reach", "ppo": {"rollout_steps": 12},
             "reward": {"shaping": "prm:runs/prm", "gamma": 0.9, "prm_mode": "progress", "prm_scale": 0.5,
                        "prm_done": True, "srpo_scale": 0.7, "srpo_memory": 8}}
    upgraded = upgrade_config(saved)
    assert upgraded["config_version"] == CONFIG_VERSION == 3 and saved["reward"]["prm_scale"] == 0.5  # not in place
    assert upgraded["reward"] == {"shaping": "prm:runs/prm", "gamma": 0.9, "prm": {"mode": "progress", "scale": 0.5,
                                                                                   "done": True},
                                  "srpo": {"scale": 0.7, "memory": 8}}
    cfg = config_from_dict(saved)
    assert cfg.reward == RewardConfig(shaping="prm:runs/prm", gamma=0.9,
                                      prm=ProgressRewardConfig(mode="progress", scale=0.5, done=True),
                                      srpo=SRPORewardConfig(scale=0.7, memory=8))
    assert cfg.ppo.rollout_steps == 12
    # version 1 (before the algorithm registry) goes through both upgrades
    old = config_from_dict({"algo": "ppo", "ppo": {"num_steps": 6}, "reward": {"shaping": "srpo", "srpo_memory": 4}})
    assert old.ppo.rollout_steps == 6 and old.reward.srpo.memory == 4
    assert config_from_dict(cfg.to_dict()) == cfg  # today's layout round-trips
