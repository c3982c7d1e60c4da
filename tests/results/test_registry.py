"""Every registered entry's command lines parse with today's flags (train lines also validate), before anyone spends
hours on them; names are unique; figures name steps of the entry."""

import pytest
import tyro

from rlrobot.results.registry import ENTRIES
from rlrobot.results.runner import step_argv


def _argv(entry, step, tmp_path):
    return step_argv(entry, step, 0, tmp_path / entry.name / "s0")


def test_names_unique_and_figures_from_own_steps():
    names = [e.name for e in ENTRIES]
    assert len(names) == len(set(names))
    for e in ENTRIES:
        steps = {s.name for s in e.steps}
        assert e.figures and all(f.key.split(".", 1)[0] in steps for f in e.figures), e.name
        assert not e.curve or e.curve.split(".", 1)[0] in steps, e.name
        assert e.group != "headline" or e.seeds >= 3, e.name


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_command_lines_parse(entry, tmp_path):
    from rlrobot.commands.bench import BenchArgs
    from rlrobot.commands.collect import CollectArgs
    from rlrobot.commands.train import parse_train_args
    from rlrobot.results.experts import ExpertsArgs
    from rlrobot.results.twin import TwinDeployArgs

    for step in entry.steps:
        argv = _argv(entry, step, tmp_path)
        if argv[0] == "train":
            cfg = parse_train_args(argv[1:])
            assert cfg.seed == 0 and cfg.out.endswith(f"s0/{step.name}") and not cfg.video
            if "--dataset" not in argv and "--init" not in argv and not cfg.task.startswith("maniskill:"):
                cfg.validate()  # runs reading an earlier step's output validate when they run
        elif argv[0] == "collect":
            tyro.cli(CollectArgs, args=argv[1:])
        elif argv[0] == "eval":
            from rlrobot.commands.eval import EvalArgs

            tyro.cli(EvalArgs, args=argv[1:])
        elif argv[0] == "bench":
            tyro.cli(BenchArgs, args=argv[1:])
        elif argv[:2] == ["results", "experts"]:
            tyro.cli(ExpertsArgs, args=argv[2:])
        elif argv[:2] == ["results", "deploy-twin"]:
            tyro.cli(TwinDeployArgs, args=argv[2:])
        else:
            raise AssertionError(f"{entry.name}: unknown step command {argv}")
