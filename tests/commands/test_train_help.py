import dataclasses

import pytest

from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.cli import main
from rlrobot.config import config_class


def help_of(capsys, *argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["train", *argv])
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("algo", ["ppo", "sac", "iql", "flow-noise"])
def test_train_help_groups_the_common_flags_and_names_every_other_one_in_half_the_length(capsys, algo):
    short = help_of(capsys, "--algo", algo, "--help")
    full = help_of(capsys, "--algo", algo, "--help-all")
    assert len(short.splitlines()) < 0.6 * len(full.splitlines())
    section = algorithm_spec(algo).config_field.replace("_", "-")
    assert short.index("run:") < short.index("environment:") < short.index(f"(--{section}.*):")
    for f in dataclasses.fields(config_class(algo)):  # every flag is described or named
        assert f"--{f.name.replace('_', '-')}" in short, f.name
    assert "--help-all describes every flag" in short


def test_train_help_shows_the_presets_values(capsys):
    short = help_of(capsys, "--task", "so101-lift", "--algo", "ppo", "--help")
    assert "preset of --task so101-lift --algo ppo" in short
    assert "--num-envs INT\n      parallel envs (per rank in distributed runs) [128]" in short
