"""The algorithm and policy registries: unknown names refused with the registered ones, every registered algorithm
has a config that validates and trains one iteration, per-algorithm CLI help, config round trips."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from rlrobot.algorithms.registry import algorithm_names, algorithm_spec
from rlrobot.checkpoints import CONFIG_VERSION
from rlrobot.config import TrainConfig, config_class, config_from_dict, train_config
from rlrobot.policies.registry import policy_kinds, policy_spec

REGISTERED = ("ppo", "sac", "sft", "flow-noise", "flow-sde")


def test_builtin_algorithms_and_policy_kinds_are_registered():
    assert set(REGISTERED) <= set(algorithm_names())
    assert {"actor-critic", "sac", "flow"} <= set(policy_kinds())
    for name in algorithm_names():
        spec = algorithm_spec(name)
        assert spec.policy_kind in policy_kinds()
        assert issubclass(config_class(name), TrainConfig)


def test_unknown_algorithm_and_policy_kind_are_refused_with_the_registered_names():
    registered = ", ".join(sorted(algorithm_names()))
    with pytest.raises(ValueError, match=f"algo='dqn' is not a registered algorithm; registered: {registered}$"):
        algorithm_spec("dqn")
    cfg = train_config("ppo")
    cfg.algo = "dqn"
    with pytest.raises(ValueError, match="algo='dqn' is not a registered algorithm"):
        cfg.validate()
    with pytest.raises(ValueError, match="policy kind 'mlp' is not registered; registered: actor-critic"):
        policy_spec("mlp")
    from rlrobot.policies.registry import build_policy

    with pytest.raises(ValueError, match="policy_class='Transformer' is not one of"):
        build_policy({"policy_class": "Transformer"}, train_config("ppo"))


def test_each_config_has_only_its_own_sections():
    sections = {f.name for f in dataclasses.fields(config_class("sac"))}
    assert {"sac", "policy"} <= sections and not {"ppo", "flow", "flow_ppo", "sft", "dataset", "init"} & sections
    sections = {f.name for f in dataclasses.fields(config_class("flow-sde"))}
    assert {"flow_ppo", "flow", "init"} <= sections and not {"ppo", "sac", "policy", "dataset"} & sections
    assert {"sft", "flow", "dataset"} <= {f.name for f in dataclasses.fields(config_class("sft"))}


def algo_spec_kind(algo: str) -> str:
    return algorithm_spec(algo).policy_kind


def _smoke_config(algo: str, tmp_path, demos) -> TrainConfig:
    common = dict(task="so101-reach", num_envs=4, out=str(tmp_path / algo), logger="none", video=False, eval_episodes=2,
                  eval_envs=2, num_threads=1, max_episode_steps=20)
    small_flow = dict(chunk_size=4, denoising_steps=2, state_hidden=(16,), embed_dim=16, time_embed_dim=8,
                      velocity_hidden=(16,), noise_hidden=(8,), value_hidden=(8,))
    cfg = train_config(algo, **common)
    if algo == "ppo":
        cfg.ppo.rollout_steps, cfg.ppo.num_minibatches = 4, 2
    elif algo == "sac":
        cfg.sac = dataclasses.replace(cfg.sac, learning_starts=8, batch_size=8, rollout_steps=4)
    elif algo in ("wsrl", "rlpd", "cal-ql-online"):  # warm starts: --init a 2-step Cal-QL run, --dataset demos
        if algo != "rlpd":
            pre = train_config("cal-ql", **{**common, "out": str(tmp_path / "pre")}, dataset=str(demos))
            pre.num_envs, pre.cal_ql.gradient_steps, pre.cal_ql.updates_per_iteration = 1, 2, 2
            pre.cal_ql.batch_size, pre.cal_ql.hidden = 8, (16,)
            from rlrobot.runners.base import make_runner

            make_runner(pre).learn()
            cfg.init = str(tmp_path / "pre")
        if algo != "wsrl":
            cfg.dataset = str(demos)
        setattr(cfg, cfg.spec.config_field, dataclasses.replace(cfg.algorithm, learning_starts=16, batch_size=8,
                                                                rollout_steps=4, utd=0.5, buffer_size=1_000))
    elif algo == "sft":
        cfg.dataset, cfg.sft.num_updates, cfg.sft.updates_per_iteration, cfg.num_envs = str(demos), 4, 2, 1
    elif algo in ("flow-noise", "flow-sde"):
        cfg.init, cfg.flow_ppo.rollout_chunks, cfg.flow_ppo.num_minibatches = "none", 2, 2
    elif algo == "flow-nft":
        cfg.init, cfg.flow_nft.rollout_chunks, cfg.flow_nft.num_minibatches = "none", 2, 2
    elif algo == "flow-srpo":  # whole 20-step episodes: 5 chunks of 4 actions, groups of 2 envs, every group kept
        cfg.init, cfg.flow_srpo.rollout_chunks, cfg.flow_srpo.num_minibatches, cfg.flow_srpo.group_size = "none", 5, 2, 2
        cfg.flow_srpo.low, cfg.flow_srpo.high = 0.0, 1.0
    elif algo == "prm":  # the process reward model: a few updates on the demos, evaluated on them
        cfg.dataset, cfg.num_envs = str(demos), 1
        cfg.prm = dataclasses.replace(cfg.prm, num_updates=4, updates_per_iteration=2, batch_size=16, eval_dataset=str(demos))
        cfg.prm_net = dataclasses.replace(cfg.prm_net, state_hidden=(16,), embed_dim=8, text_dim=8, head_hidden=(16,))
    elif algo == "sarm":  # LeRobot's SARM on the demos' progress labels (the vla extra: its venv runs this)
        pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12)")
        cfg.dataset, cfg.num_envs = str(demos), 1
        cfg.sarm = dataclasses.replace(cfg.sarm, num_updates=4, updates_per_iteration=2, batch_size=8,
                                       eval_dataset=str(demos), calibration_episodes=0)
        cfg.sarm_net = dataclasses.replace(cfg.sarm_net, hidden_dim=16, num_layers=1, n_obs_steps=2, frame_gap=2,
                                           max_rewind_steps=1)
    elif algo_spec_kind(algo) == "offline":  # every offline algorithm (rlrobot.algorithms.offline): a few updates
        cfg.dataset, cfg.num_envs = str(demos), 1
        imitation = {"expert_dataset": str(demos)} if hasattr(cfg.algorithm, "expert_dataset") else {}  # its demos too
        setattr(cfg, cfg.spec.config_field, dataclasses.replace(cfg.algorithm, gradient_steps=4, updates_per_iteration=2,
                                                                batch_size=16, hidden=(16,), **imitation))
    elif algo.startswith("vla-"):  # a LeRobot VLA: trained through the CLI in tests/policies/vla (in .venv-vla)
        pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12)")
        pytest.skip("vla-* algorithms are smoke-tested with tiny LeRobot checkpoints in tests/policies/vla")
    else:
        pytest.fail(f"give the registered algorithm {algo!r} small smoke-test settings here")
    if algo_spec_kind(algo) == "flow":
        cfg.flow = dataclasses.replace(cfg.flow, **small_flow)
    cfg.total_steps = 2 * cfg.steps_per_iteration()
    return cfg


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    out = tmp_path_factory.mktemp("demos") / "reach"
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=2, out=str(out), num_envs=2))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("algo", algorithm_names())
def test_every_registered_algorithm_validates_trains_and_round_trips(algo, tmp_path, demos):
    from rlrobot.runners.base import make_runner

    cfg = _smoke_config(algo, tmp_path, demos)
    cfg.validate()
    runner = make_runner(cfg)
    before = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    summary = runner.learn()
    assert summary["eval"]["episodes"] == 2 and runner.iteration == 2
    assert any(not torch.equal(before[k], v) for k, v in runner.policy.state_dict().items())  # it trained
    saved = json.loads((tmp_path / algo / "config.json").read_text())
    assert saved["policy_kind"] == algorithm_spec(algo).policy_kind
    assert saved["train"]["config_version"] == CONFIG_VERSION
    assert config_from_dict(saved["train"]) == cfg  # what a run saves loads back as the same config


@pytest.mark.parametrize("algo, shown, hidden", [
    ("sac", ["--sac.utd", "--policy.num-critics", "--sac.save-replay", "--num-envs", "--reward.shaping"],
     ["--ppo.", "--flow.", "--flow-ppo.", "--sft.", "--dataset", "--init"]),
    ("ppo", ["--ppo.rollout-steps", "--policy.actor-hidden"], ["--sac.", "--flow.", "--sft.", "--dataset"]),
    ("flow-noise", ["--flow-ppo.rollout-chunks", "--flow.execute-steps", "--init"], ["--sac.", "--ppo.", "--policy."]),
    ("sft", ["--sft.num-updates", "--dataset", "--flow.chunk-size"], ["--sac.", "--flow-ppo.", "--init "]),
])
def test_train_help_shows_only_the_algorithms_options(algo, shown, hidden):
    out = subprocess.run([sys.executable, "-m", "rlrobot", "train", "--algo", algo, "--help-all"], capture_output=True,
                         text=True, check=True, env={"COLUMNS": "200", "PATH": ""}).stdout
    for flag in shown:
        assert flag in out, flag
    for flag in hidden:
        assert flag not in out, flag


def test_every_flow_policy_ppo_algorithm_names_its_flow_variant():
    from rlrobot.algorithms.flow_ppo import FLOW_VARIANTS
    from rlrobot.algorithms.registry import ALGORITHMS

    flow_ppo = [spec for spec in ALGORITHMS.specs() if spec.runner.endswith((":VLAFlowRunner", ":FlowOnPolicyRunner"))]
    assert {spec.name for spec in flow_ppo} == {"flow-noise", "flow-sde", "vla-flow-noise", "vla-flow-sde"}
    assert all(spec.flow_variant in FLOW_VARIANTS for spec in flow_ppo)
