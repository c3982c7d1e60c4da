"""Run directories written before the algorithm registry (config.json version 1, fixtures made with rlrobot at
d2f24da: tiny PPO so101-reach, SAC gym:Pendulum-v1, SFT and Flow-Noise so101-reach runs) still load for eval and
serve with the same actions, and --resume refuses them with a message naming what changed."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rlrobot.checkpoints import load_checkpoint
from rlrobot.cli import main
from rlrobot.config import config_from_checkpoint
from rlrobot.policies.registry import build_policy, policy_kind_of

OLD = Path(__file__).parent.parent / "fixtures" / "runs_v0_1"
RUNS = {"ppo": "actor-critic", "sac": "sac", "sft": "flow", "flownoise": "flow"}


@pytest.mark.parametrize("run, kind", RUNS.items())
def test_old_checkpoints_build_the_same_policy(run, kind):
    weights, saved, _ = load_checkpoint(OLD / run)
    assert "config_version" not in saved["train"] and policy_kind_of(saved) == kind
    cfg = config_from_checkpoint(saved)
    policy = build_policy(saved, cfg)
    policy.load_state_dict(weights)
    policy.eval()
    obs = {"state": torch.randn(3, saved["obs_dim"], generator=torch.Generator().manual_seed(0))}
    with torch.no_grad():
        actions = policy.sample_actions(obs) if kind == "flow" else policy.act(obs, deterministic=True)
    reference = json.loads((OLD / "reference_actions.json").read_text())[run]  # what the old code computed
    assert torch.allclose(actions.reshape(3, -1), torch.tensor(reference), atol=1e-6)
    if kind == "flow":  # renamed fields moved: num_steps -> denoising_steps, execute_steps -> flow.execute_steps
        assert cfg.flow.denoising_steps == saved["train"]["flow"]["num_steps"] == 2
        assert policy.execute_steps == saved["train"]["execute_steps"] == 2


def test_old_runs_evaluate_and_serve(tmp_path):
    main(["eval", "--checkpoint", str(OLD / "ppo"), "--episodes", "2", "--num-envs", "2", "--no-video",
          "--out", str(tmp_path / "ppo")])
    assert json.loads((tmp_path / "ppo" / "eval.json").read_text())["episodes"] == 2
    main(["eval", "--checkpoint", str(OLD / "sac"), "--episodes", "1", "--num-envs", "1", "--no-video",
          "--out", str(tmp_path / "sac")])
    assert json.loads((tmp_path / "sac" / "eval.json").read_text())["episodes"] == 1
    from rlrobot.real_robot.policy_runtime import LoadedPolicy

    loaded = LoadedPolicy(str(OLD / "flownoise"))
    assert loaded.metadata["chunk_size"] == 4 and loaded.metadata["execute_steps"] == 2
    assert loaded.infer({"state": np.zeros(27, np.float32)}).shape == (4, 5)
    # the served actions are those the old code computed (for the first of the reference observations)
    reference = json.loads((OLD / "reference_actions.json").read_text())
    for run in RUNS:
        served = LoadedPolicy(str(OLD / run))
        _, saved, _ = load_checkpoint(OLD / run)
        state = torch.randn(3, saved["obs_dim"], generator=torch.Generator().manual_seed(0))[0].numpy()
        np.testing.assert_allclose(served.infer({"state": state}).reshape(-1), reference[run][0], atol=1e-6, err_msg=run)


def test_resuming_an_old_run_is_refused_naming_what_changed(tmp_path, capsys):
    run = tmp_path / "ppo"
    shutil.copytree(OLD / "ppo", run)
    with pytest.raises(SystemExit):
        main(["train", "--resume", "--out", str(run), "--total-steps", "128"])
    out = capsys.readouterr().out
    assert "before the algorithm registry" in out and "cannot be resumed" in out and "--init" in out
