"""The CLI end to end in real subprocesses: train -> checkpoint -> resume -> eval, and bad input."""

import json
import os
import subprocess
import sys

import pytest

from rlrobot.algorithms.registry import algorithm_names

SMALL = ["--num-envs", "8", "--ppo.rollout-steps", "8", "--ppo.num-minibatches", "2", "--policy.actor-hidden", "16",
         "--policy.critic-hidden", "16", "--eval-envs", "4", "--eval-episodes", "4", "--logger", "none",
         "--checkpoint-every", "1", "--video-episodes", "1"]


def rlrobot(*args, check=True):
    env = {**os.environ, "MUJOCO_GL": "egl"}
    p = subprocess.run([sys.executable, "-m", "rlrobot", *args], capture_output=True, text=True, env=env, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"rlrobot {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return p


@pytest.mark.slow
def test_train_resume_eval_round_trip(tmp_path):
    out = tmp_path / "run"
    p = rlrobot("train", "--task", "so101-reach", "--total-steps", "128", "--out", str(out), *SMALL)
    assert "checkpoint:" in p.stdout and "learning curve:" in p.stdout
    assert (out / "checkpoints" / "iter_000002" / "model.safetensors").is_file()
    assert (out / "learning_curve.png").stat().st_size > 1000
    videos = list((out / "videos").glob("*.mp4"))
    assert videos and videos[0].stat().st_size > 1000
    first = json.loads((out / "summary.json").read_text())
    assert first["env_steps"] == 128

    rlrobot("train", "--resume", "--out", str(out), "--total-steps", "256")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 256 and summary["checkpoint"].endswith("iter_000004")

    p = rlrobot("eval", "--checkpoint", str(out), "--episodes", "4", "--num-envs", "4", "--out", str(tmp_path / "ev"))
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert {"success_rate", "return_mean", "episodes"} <= set(result) and result["episodes"] == 4
    assert (tmp_path / "ev" / "eval.mp4").is_file()

    # a checkpoint from another task with other spaces is refused, naming the mismatch
    p = rlrobot("eval", "--checkpoint", str(out), "--task", "so101-lift", check=False)
    assert p.returncode != 0 and "obs_dim" in p.stdout + p.stderr


@pytest.mark.parametrize("args, message", [
    (["--task", "so101-fly"], "valid tasks"),
    (["--algo", "dqn"], "algo"),
    (["--obs-mode", "depth"], "obs_mode"),
    (["--control-mode", "torque"], "control_mode"),
    (["--backend", "bullet"], "backend"),
    (["--num-envs", "0"], "num_envs"),
    (["--total-steps", "10"], "less than one iteration of ppo"),
    (["--algo", "dqn"], "registered: " + ", ".join(sorted(algorithm_names()))),
    (["--checkpoint-every", "0"], "checkpoint_every must be >= 1"),
    (["--algo", "flow-noise"], "--init none"),
    (["--reward.shaping", "magic"], "reward.shaping"),
    (["--algo", "sac", "--sac.utd", "0"], "sac.utd must be > 0"),
    (["--algo", "sac", "--sac.batch-size", "100000"], "larger than the replay contents at learning start"),
    (["--algo", "sac", "--sac.buffer-size", "8"], "smaller than num_envs"),
    (["--algo", "sac", "--sac.actor-q", "max"], "invalid choice 'max'"),
    (["--instruction", "put the red cube in the bin"], "instruction applies to the tasks so101-long-horizon"),
    (["--task", "so101-pick-place", "--instruction", "put the red cube in the box"], "is not one of the 12 instructions"),
])
@pytest.mark.slow
def test_bad_input_is_rejected_before_compute(tmp_path, args, message):
    p = rlrobot("train", "--out", str(tmp_path / "x"), *args, check=False)
    assert p.returncode != 0
    assert message in p.stdout + p.stderr
    assert not (tmp_path / "x").exists()  # nothing ran


SAC_SMALL = ["--num-envs", "4", "--sac.rollout-steps", "4", "--sac.learning-starts", "32", "--sac.batch-size", "16",
             "--policy.actor-hidden", "16", "--policy.critic-hidden", "16", "--eval-envs", "4", "--eval-episodes", "4",
             "--logger", "none", "--checkpoint-every", "2", "--no-video"]


@pytest.mark.slow
def test_sac_train_resume_eval_round_trip(tmp_path):
    out = tmp_path / "sac"
    rlrobot("train", "--task", "so101-reach", "--algo", "sac", "--total-steps", "64", "--sac.save-replay", "--out", str(out),
            *SAC_SMALL)
    ckpt = out / "checkpoints" / "iter_000004"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "replay.safetensors").is_file()
    assert json.loads((ckpt / "config.json").read_text())["policy_kind"] == "sac"
    p = rlrobot("train", "--resume", "--out", str(out), "--total-steps", "96")
    assert "replay buffer restored: 64 transitions" in p.stdout
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 96
    rlrobot("eval", "--checkpoint", str(out), "--episodes", "4", "--num-envs", "4", "--no-video", "--out", str(tmp_path / "ev"))
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["episodes"] == 4


def test_list_tasks():
    p = rlrobot("list-tasks")
    for task in ("so101-reach", "so101-push", "so101-lift"):
        assert task in p.stdout
    p = rlrobot("list-tasks", "--instructions", "so101-push-to")
    assert p.stdout.splitlines()[0] == "push the red cube to the green zone" and len(p.stdout.splitlines()) == 12


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    """SIGKILL mid-training loses at most the work since the last checkpoint; --resume finishes the run."""
    import signal
    import time

    out = tmp_path / "killed"
    env = {**os.environ, "MUJOCO_GL": "egl"}
    proc = subprocess.Popen([sys.executable, "-m", "rlrobot", "train", "--total-steps", "2000000", "--out", str(out),
                             "--eval-every", "0", *SMALL], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = out / "checkpoints" / "latest"

    def checkpoints_done() -> int:  # only the newest 3 checkpoints are kept, so read the pointer, not a name
        return int(latest.read_text().split("_")[1]) if latest.exists() else 0

    deadline = time.time() + 120
    while checkpoints_done() < 3 and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    ckpt = (out / "checkpoints" / "latest").read_text().strip()
    done_before = int(ckpt.split("_")[1])
    assert done_before >= 3
    rlrobot("train", "--resume", "--out", str(out), "--total-steps", str(8 * 8 * (done_before + 2)))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 8 * 8 * (done_before + 2)


def test_eval_overrides_a_flow_policys_sampling_and_reports_chunk_use(tmp_path):
    """`rlrobot eval --denoising-steps K --execute-steps E`: a flow checkpoint is evaluated with another K and open-loop
    length (PolicyTrim's and few-step NFT's measurements); the result says what ran and what a chunk cost."""
    from pathlib import Path

    from rlrobot.commands.eval import EvalArgs, evaluate_checkpoint

    fixtures = Path(__file__).parents[1] / "fixtures" / "runs_v0_1"
    result = evaluate_checkpoint(EvalArgs(checkpoint=str(fixtures / "sft"), episodes=2, num_envs=2, video=False,
                                          denoising_steps=1, execute_steps=2, out=str(tmp_path)))
    assert (result["denoising_steps"], result["execute_steps"], result["chunk_utilisation"]) == (1, 2, 0.5)
    assert result["chunk_latency_ms"] > 0 and result["episodes"] == 2
    with pytest.raises(ValueError, match="execute_steps must be in \\[1, chunk_size=4\\]"):
        evaluate_checkpoint(EvalArgs(checkpoint=str(fixtures / "sft"), execute_steps=5, out=str(tmp_path)))
    with pytest.raises(ValueError, match="apply to flow policies"):
        evaluate_checkpoint(EvalArgs(checkpoint=str(fixtures / "ppo"), denoising_steps=2, out=str(tmp_path)))
