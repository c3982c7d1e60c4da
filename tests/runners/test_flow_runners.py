"""collect -> SFT -> eval -> flow-policy RL through the CLI on a tiny budget, and the errors that guard it."""

import json

import numpy as np
import pytest
import torch

from rlrobot.cli import main
from rlrobot.commands.collect import CollectArgs, collect_demonstrations
from rlrobot.data.demonstrations import load_demonstrations
from rlrobot.data.lerobot_dataset import read_lerobot_dataset

SMALL = ["--flow.state-hidden", "32", "32", "--flow.embed-dim", "32", "--flow.velocity-hidden", "64", "64",
         "--flow.time-embed-dim", "16", "--flow.value-hidden", "32", "--num-threads", "1", "--logger", "none",
         "--no-video", "--eval-episodes", "4", "--eval-envs", "4"]


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "reach"
    main(["collect", "--task", "so101-reach", "--episodes", "3", "--out", str(out), "--num-envs", "2",
          "--success-only", "--noise", "0.05"])
    return out


def test_collect_writes_a_lerobot_dataset(reach_demos):
    ds = read_lerobot_dataset(reach_demos)
    info = ds["info"]
    assert info["total_episodes"] == 3 and info["fps"] == 25
    assert info["features"]["observation.state"]["shape"] == [27]
    assert info["features"]["action"]["shape"] == [5]
    frames = ds["frames"]
    assert len(frames["action"]) == info["total_frames"]
    assert np.all(np.abs(frames["action"]) <= 1.0)
    # success-only: every episode ends in success, and only the last frame of an episode is done
    ends = np.flatnonzero(frames["next.done"].reshape(-1))
    assert len(ends) == 3 and frames["next.success"].reshape(-1)[ends].all()
    assert list(ds["tasks"]) == ["move the gripper to the green marker"]
    meta = json.loads((reach_demos / "meta" / "rlrobot.json").read_text())
    assert meta["task"] == "so101-reach" and meta["control_mode"] == "ee_delta"
    demos = load_demonstrations(reach_demos, {"state": (27,)}, 5, 4, ("state",))
    assert demos.chunks.shape == (info["total_frames"], 4, 5)
    # the chunk of frame i starts with action i; past an episode's end it is padded and masked
    assert np.allclose(demos.chunks[:, 0].numpy(), frames["action"])
    last = ends[0]
    assert not demos.mask[last, 1:].any() and demos.mask[last, 0]


def test_lerobot_opens_collected_demonstrations(reach_demos):
    pytest.importorskip("lerobot", reason="lerobot is not installed (optional extra: pip install 'rlrobot[lerobot]')")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/rlrobot_demos", root=reach_demos)
    assert ds.num_episodes == 3
    item = ds[0]
    assert item["action"].shape == (5,) and item["task"] == "move the gripper to the green marker"


def test_collect_images(tmp_path):
    out = tmp_path / "rgb"
    collect_demonstrations(CollectArgs(task="so101-lift", episodes=1, out=str(out), obs_mode="state+rgb", num_envs=1,
                                       image_size=32))
    ds = read_lerobot_dataset(out)
    assert ds["frames"]["observation.images.front"].shape[1:] == (32, 32, 3)
    assert ds["frames"]["observation.images.front"].dtype == np.uint8
    demos = load_demonstrations(out, {"state": (33,), "image_front": (3, 32, 32)}, 5, 5, ("state", "image_front"))
    assert demos.obs["image_front"].shape[1:] == (3, 32, 32)


@pytest.mark.slow
def test_collect_sft_eval_rl_round_trip(reach_demos, tmp_path):
    sft = tmp_path / "sft"
    main(["train", "--algo", "sft", "--task", "so101-reach", "--dataset", str(reach_demos), "--out", str(sft),
          "--num-envs", "2", "--sft.num-updates", "40", "--sft.updates-per-iteration", "20", "--sft.batch-size", "64",
          "--flow.chunk-size", "4", "--flow.denoising-steps", "3", "--flow.execute-steps", "2", *SMALL])
    summary = json.loads((sft / "summary.json").read_text())
    assert summary["eval"]["episodes"] == 4
    lines = [json.loads(x) for x in (sft / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss/flow_matching"] for x in lines if "loss/flow_matching" in x]
    assert len(losses) == 2 and losses[-1] < losses[0]
    config = json.loads((sft / "checkpoints" / "latest").parent.joinpath(
        (sft / "checkpoints" / "latest").read_text().strip(), "config.json").read_text())
    assert config["policy_kind"] == "flow" and config["dataset"]["episodes"] == 3

    # the checkpoint evaluates as the trained policy did at the end of the run (eval defaults: its seed, episodes, envs)
    main(["eval", "--checkpoint", str(sft), "--no-video", "--out", str(tmp_path / "ev")])
    first = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert (first["episodes"], first["return_mean"], first["success_rate"]) == \
        (4, summary["eval"]["return_mean"], summary["eval"]["success_rate"])
    main(["eval", "--checkpoint", str(sft), "--episodes", "4", "--num-envs", "2", "--no-video", "--out", str(tmp_path / "ev")])
    second = json.loads((tmp_path / "ev" / "eval.json").read_text())
    main(["eval", "--checkpoint", str(sft), "--episodes", "4", "--num-envs", "2", "--no-video", "--out", str(tmp_path / "ev")])
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["return_mean"] == second["return_mean"]  # deterministic

    # the same checkpoint serves action chunks to the robot side (rlrobot serve / deploy)
    from rlrobot.real_robot.policy_runtime import LoadedPolicy

    loaded = LoadedPolicy(str(sft))
    assert loaded.metadata["chunk_size"] == 4 and loaded.metadata["execute_steps"] == 2
    state = torch.randn(27, generator=torch.Generator().manual_seed(0))
    chunk = loaded.infer({"state": state.numpy()})
    assert chunk.shape == (4, 5) and np.array_equal(chunk, loaded.infer({"state": state.numpy()}))
    # the chunk the checkpoint's policy, rebuilt from its weights and config, samples deterministically
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.config import config_from_checkpoint
    from rlrobot.policies.registry import build_policy

    weights, meta, _ = load_checkpoint(sft)
    policy = build_policy(meta, config_from_checkpoint(meta))
    policy.load_state_dict(weights)
    with torch.no_grad():
        expected = policy.sample_actions({"state": state[None]}, deterministic=True)[0]
    np.testing.assert_allclose(chunk, expected.numpy(), atol=1e-6)

    rl = tmp_path / "rl"
    main(["train", "--algo", "flow-sde", "--task", "so101-reach", "--init", str(sft), "--out", str(rl), "--num-envs", "4",
          "--flow-ppo.rollout-chunks", "2", "--flow-ppo.num-minibatches", "2", "--total-steps", "16", "--logger", "none",
          "--no-video", "--eval-episodes", "4", "--eval-envs", "4", "--num-threads", "1"])
    saved = json.loads((rl / "config.json").read_text())
    # the architecture comes from the SFT checkpoint, so are its execute steps
    assert saved["train"]["flow"]["chunk_size"] == 4 and saved["train"]["flow"]["velocity_hidden"] == [64, 64]
    assert saved["train"]["flow"]["execute_steps"] == 2
    assert json.loads((rl / "summary.json").read_text())["env_steps"] == 16
    # and the run resumes
    main(["train", "--resume", "--out", str(rl), "--total-steps", "32"])
    assert json.loads((rl / "summary.json").read_text())["env_steps"] == 32


def test_dataset_that_does_not_match_the_task(reach_demos, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--algo", "sft", "--task", "so101-lift", "--dataset", str(reach_demos), "--out",
              str(tmp_path / "x"), "--num-envs", "1", *SMALL])
    assert "observation.state' has shape [27]; task 'so101-lift' observation 'state' needs [33]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--algo", "sft", "--task", "so101-reach", "--control-mode", "joint_pos", "--dataset",
              str(reach_demos), "--out", str(tmp_path / "y"), "--num-envs", "1", *SMALL])
    out = capsys.readouterr().out
    assert "control_mode='ee_delta'" in out
    with pytest.raises(SystemExit):
        main(["train", "--algo", "sft", "--task", "so101-reach", "--dataset", str(tmp_path / "none"), "--out",
              str(tmp_path / "z"), *SMALL])
    assert "not a LeRobotDataset" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--algo", "sft", "--task", "so101-reach", "--dataset", str(reach_demos), "--flow.denoising-steps", "0",
              "--out", str(tmp_path / "w"), *SMALL])
    assert "flow.denoising_steps must be >= 1, got 0" in capsys.readouterr().out


def test_init_adopts_the_checkpoint_architecture_but_keeps_this_runs_sampling_settings(tmp_path):
    """--init: the SFT checkpoint's network shapes win; execute steps and Flow-Noise's noise bounds set on the
    fine-tuning run win over the checkpoint's (they were silently replaced by the SFT run's before)."""
    from rlrobot.algorithms.flow_ppo import adopt_init_architecture
    from rlrobot.checkpoints import save_checkpoint
    from rlrobot.config import train_config
    from rlrobot.policies.flow import FlowPolicyConfig

    sft = train_config("sft", task="so101-reach", flow=FlowPolicyConfig(velocity_hidden=(32, 32), execute_steps=3))
    ckpt = tmp_path / "sft" / "checkpoints"
    save_checkpoint(ckpt, "iter_000001", torch.nn.Linear(1, 1), {"train": sft.to_dict(), "policy_kind": "flow"})
    run = train_config("flow-noise", task="so101-reach", init=str(tmp_path / "sft"),
                       flow=FlowPolicyConfig(noise_std_min=0.02, noise_std_max=0.05))
    adopt_init_architecture(run)
    assert run.flow.velocity_hidden == (32, 32) and run.flow.execute_steps == 3
    assert (run.flow.noise_std_min, run.flow.noise_std_max) == (0.02, 0.05)
    run = train_config("flow-noise", task="so101-reach", init=str(tmp_path / "sft"), flow=FlowPolicyConfig(execute_steps=2))
    adopt_init_architecture(run)
    assert run.flow.execute_steps == 2 and run.flow.noise_std_max == FlowPolicyConfig().noise_std_max


def test_init_from_another_policy_type(tmp_path, capsys):
    ppo = tmp_path / "ppo"
    main(["train", "--task", "so101-reach", "--num-envs", "4", "--ppo.rollout-steps", "4", "--ppo.num-minibatches", "2",
          "--total-steps", "16", "--out", str(ppo), "--logger", "none", "--no-video", "--eval-episodes", "2",
          "--eval-envs", "2", "--num-threads", "1"])
    with pytest.raises(SystemExit):
        main(["train", "--algo", "flow-noise", "--task", "so101-reach", "--init", str(ppo), "--out", str(tmp_path / "f"),
              "--num-envs", "4", "--total-steps", "200", *SMALL])
    assert "holds a 'actor-critic' policy; algo='flow-noise' fine-tunes a 'flow' policy" in capsys.readouterr().out
