"""Preset lookup: a task x algorithm module, the suite's preset for a suite family, else the algorithm's defaults."""

import pytest

from rlrobot.commands.train import parse_train_args
from rlrobot.configs import preset


@pytest.mark.parametrize("family", ["so101-pick-place", "so101-push-to", "so101-stack", "so101-long-horizon"])
def test_suite_family_takes_the_suite_preset(family: str) -> None:
    suite = preset("so101-suite", "sft")
    cfg = preset(family, "sft")
    assert cfg.task == family
    assert cfg.flow == suite.flow and cfg.sft == suite.sft
    assert cfg.flow.entity_names  # the named entity attention a family's demos need, not the plain flow default
    prm = preset(family, "prm")
    assert prm.task == family and prm.prm == preset("so101-suite", "prm").prm


def test_a_family_preset_of_its_own_wins_over_the_suite_preset() -> None:
    own, suite = preset("so101-pick-place", "flow-noise"), preset("so101-suite", "flow-noise")
    assert own.task == "so101-pick-place" and own.num_envs == 64 and own.flow_ppo.lr == 1e-5
    assert own.flow_ppo != suite.flow_ppo  # its own RL settings, the suite's policy
    assert own.flow == preset("so101-suite", "sft").flow and own.flow.noise_std_min != suite.flow.noise_std_min
    push_to = preset("so101-push-to", "flow-noise")
    assert push_to.task == "so101-push-to" and push_to.flow_ppo == suite.flow_ppo


def test_flags_still_override_a_family_preset() -> None:
    cfg = parse_train_args(["--algo", "sft", "--task", "so101-push-to", "--sft.num-updates", "123"])
    assert cfg.task == "so101-push-to" and cfg.sft.num_updates == 123 and cfg.flow.entity_names


def test_pairs_without_a_preset_get_the_defaults() -> None:
    cfg = preset("so101-pick-place", "ppo")  # no ppo_so101_suite preset either
    assert cfg.task == "so101-pick-place" and cfg.algo == "ppo"
    assert preset("so101-reach", "sac").task == "so101-reach"


def test_suite_flow_srpo_preset_scores_whole_suite_episodes() -> None:
    """Flow-SRPO rewards whole episodes: the suite preset's chunks must cover its 150-step episode exactly, and a family
    with shorter episodes gets the one-line fix (its own rollout_chunks) before anything runs."""
    cfg = preset("so101-suite", "flow-srpo")
    execute = cfg.flow.execute_steps or cfg.flow.chunk_size
    assert cfg.flow_srpo.rollout_chunks * execute == cfg.episode_steps() == 150
    assert cfg.flow.entity_names and cfg.num_envs % cfg.flow_srpo.group_size == 0
    family = parse_train_args(["--algo", "flow-srpo", "--task", "so101-push-to", "--init", "none"])
    with pytest.raises(ValueError, match="flow_srpo.rollout_chunks=16"):
        family.validate()
