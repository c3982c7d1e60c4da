"""What a new user trips over, each through the real CLI or runner: resume takes the directory given,
damaged checkpoints are named and skipped, Ctrl-C checkpoints at the iteration boundary, metrics stay monotonic,
resume refuses flags it cannot honour, budgets and devices are checked before compute, help and version."""

import json
import os
import shutil
import signal
import stat

import pytest
import torch
from safetensors.torch import load_file

from rlrobot.checkpoints import resolve_checkpoint
from rlrobot.cli import main
from rlrobot.commands.train import _normalise_numbers

RUN = ["--task", "so101-reach", "--num-envs", "8", "--ppo.rollout-steps", "8", "--ppo.num-minibatches", "2",
       "--policy.actor-hidden", "16", "--policy.critic-hidden", "16", "--eval-envs", "4", "--eval-episodes", "4",
       "--logger", "none", "--no-video", "--checkpoint-every", "2", "--num-threads", "1", "--eval-every", "0",
       "--max-episode-steps", "20"]
PER_ITERATION = 64


def train(out, iterations, *extra):
    main(["train", "--out", str(out), "--total-steps", str(PER_ITERATION * iterations), *RUN, *extra])


def ckpts(run):
    return sorted(p.name for p in (run / "checkpoints").glob("iter_*"))


def error_of(capsys, argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and "Traceback" not in out
    return out


@pytest.mark.slow
def test_resume_takes_the_directory_given(tmp_path, capsys):
    original = tmp_path / "a"
    train(original, 2)
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    before = ckpts(original)
    main(["train", "--resume", "--out", str(copy), "--total-steps", str(PER_ITERATION * 4)])
    assert ckpts(original) == before  # the original run is untouched
    assert "iter_000004" in ckpts(copy)
    missing = tmp_path / "nowhere"
    assert "holds no checkpoints" in error_of(capsys, ["train", "--resume", "--out", str(missing)])
    assert not missing.exists()  # a failed resume leaves no empty directory behind


@pytest.mark.slow
def test_damaged_checkpoints_are_named_and_resume_falls_back(tmp_path, capsys):
    run = tmp_path / "run"
    train(run, 4)  # checkpoints at iterations 2 and 4
    latest = resolve_checkpoint(run)
    assert latest.name == "iter_000004"
    model = latest / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # truncated
    out = error_of(capsys, ["eval", "--checkpoint", str(run), "--episodes", "2", "--num-envs", "2", "--no-video"])
    assert str(model) in out and "damaged" in out
    main(["train", "--resume", "--out", str(run), "--total-steps", str(PER_ITERATION * 6)])
    out = capsys.readouterr().out
    assert f"{model} is damaged" in out and "resuming from the newest intact checkpoint" in out and "iter_000002" in out
    assert json.loads((run / "summary.json").read_text())["env_steps"] == PER_ITERATION * 6
    # a garbled config.json in a checkpoint without checksums (as written before them) is named too
    old = tmp_path / "old"
    shutil.copytree(resolve_checkpoint(run), old)
    (old / "checksums.json").unlink()
    (old / "config.json").write_text("{ not json")
    assert f"{old / 'config.json'} is not valid JSON" in error_of(capsys, ["eval", "--checkpoint", str(old)])


def test_checkpoints_are_readable_by_the_group(tmp_path):
    run = tmp_path / "run"
    train(run, 2)
    ckpt = resolve_checkpoint(run)
    umask = os.umask(0)
    os.umask(umask)
    if umask & stat.S_IRGRP:
        pytest.skip(f"this process's umask {umask:o} itself hides files from the group")
    assert ckpt.stat().st_mode & stat.S_IRGRP and ckpt.stat().st_mode & stat.S_IXGRP
    assert all(f.stat().st_mode & stat.S_IRGRP for f in ckpt.iterdir())


@pytest.mark.slow
def test_ctrl_c_checkpoints_at_the_iteration_boundary_and_resume_is_exact(tmp_path, monkeypatch):
    from rlrobot.runners.on_policy import OnPolicyRunner

    original = OnPolicyRunner.train_iteration

    def interrupted_at_3(self):
        metrics = original(self)
        if self.iteration == 2:  # Ctrl-C during the third iteration (self.iteration counts finished ones)
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    train(tmp_path / "straight", 6)
    monkeypatch.setattr(OnPolicyRunner, "train_iteration", interrupted_at_3)
    with pytest.raises(SystemExit) as stopped:
        train(tmp_path / "stopped", 6, "--checkpoint-every", "5")
    assert stopped.value.code == 130  # 128 + SIGINT: not a finished run to a script
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["interrupted"] and summary["iteration"] == 3
    assert ckpts(tmp_path / "stopped") == ["iter_000003"]  # saved at the boundary although checkpoint_every is 5
    monkeypatch.setattr(OnPolicyRunner, "train_iteration", original)
    main(["train", "--resume", "--out", str(tmp_path / "stopped"), "--checkpoint-every", "2"])
    a = load_file(resolve_checkpoint(tmp_path / "straight") / "model.safetensors")
    b = load_file(resolve_checkpoint(tmp_path / "stopped") / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the curve never goes back in time, and holds no fake return before the first episode ended
    rows = [json.loads(x) for x in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["env_steps"] for r in rows if "perf/iterations_per_s" in r]
    assert steps == [PER_ITERATION * i for i in range(1, 7)]
    first = rows[0]
    assert "train/return" not in first  # 8 steps of 20-step episodes: none finished in the first iteration


def test_the_resume_hint_pastes_into_a_shell_with_spaces_in_the_path(tmp_path, monkeypatch, capsys):
    import shlex

    from rlrobot.runners.on_policy import OnPolicyRunner

    original = OnPolicyRunner.train_iteration

    def interrupted(self):
        metrics = original(self)
        os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(OnPolicyRunner, "train_iteration", interrupted)
    run = tmp_path / "my runs" / "first try"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train(run, 2)
    hint = next(line for line in capsys.readouterr().out.splitlines() if "resume with:" in line).split("resume with:")[1]
    assert shlex.split(hint) == ["rlrobot", "train", "--resume", "--out", str(run)]


@pytest.mark.slow
def test_metrics_after_the_resumed_checkpoint_are_dropped(tmp_path):
    run = tmp_path / "run"
    train(run, 4)
    shutil.rmtree(run / "checkpoints" / "iter_000004")  # a crash after iterations 3-4 were logged, before their save
    (run / "checkpoints" / "latest").write_text("iter_000002")
    main(["train", "--resume", "--out", str(run)])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["env_steps"] for r in rows if "perf/iterations_per_s" in r]
    assert steps == [PER_ITERATION * i for i in range(1, 5)]


@pytest.mark.slow
def test_resume_refuses_flags_it_cannot_honour_and_honours_the_others(tmp_path, capsys):
    run = tmp_path / "run"
    train(run, 2)
    out = error_of(capsys, ["train", "--resume", "--out", str(run), "--num-envs", "64", "--ppo.lr", "0.1"])
    assert "--num-envs (run: 8, given: 64)" in out and "--ppo.lr" in out and "--total-steps" in out
    main(["train", "--resume", "--out", str(run), "--total-steps", str(PER_ITERATION * 3), "--video",
          "--video-episodes", "1", "--eval-episodes", "2"])
    saved = json.loads((run / "config.json").read_text())["train"]
    assert saved["video"] is True and saved["eval_episodes"] == 2 and saved["num_envs"] == 8
    assert json.loads((run / "summary.json").read_text())["eval"]["episodes"] == 2


def test_budgets_and_devices_are_checked_before_compute(tmp_path, capsys):
    out = error_of(capsys, ["train", "--algo", "sft", "--dataset", str(tmp_path), "--total-steps", "1000",
                            "--out", str(tmp_path / "s")])
    assert "--total-steps does not apply to algo='sft'" in out and "--sft.num-updates" in out
    if not torch.cuda.is_available():
        out = error_of(capsys, ["train", "--device", "cuda", "--out", str(tmp_path / "c")])
        assert "device='cuda'" in out and "--device cpu" in out
    assert "eval_every must be >= 0" in error_of(capsys, ["train", "--eval-every", "-1", "--out", str(tmp_path / "e")])
    assert _normalise_numbers(["--total-steps", "1e5", "--ppo.lr", "3e-4", "--seed", "2"]) == \
        ["--total-steps", "100000", "--ppo.lr", "3e-4", "--seed", "2"]
    train(tmp_path / "sci", 1, "--total-steps", "6.4e1")
    assert json.loads((tmp_path / "sci" / "summary.json").read_text())["env_steps"] == 64


@pytest.mark.slow
def test_an_offline_runs_budget_is_its_own_flag_and_changes_on_resume_without_repeating_the_algo(tmp_path, capsys):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    data = tmp_path / "data"
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=2, out=str(data), num_envs=2, seed=0))
    bc = ["train", "--algo", "bc", "--task", "so101-reach", "--dataset", str(data), "--logger", "none", "--no-video",
          "--eval-episodes", "2", "--eval-envs", "2", "--bc.updates-per-iteration", "10", "--checkpoint-every", "1"]
    out = error_of(capsys, [*bc, "--total-steps", "1000", "--out", str(tmp_path / "x")])
    assert "--total-steps does not apply to algo='bc'" in out and "its budget is --bc.gradient-steps" in out
    run = tmp_path / "bc"
    main([*bc, "--bc.gradient-steps", "20", "--out", str(run)])
    assert json.loads((run / "summary.json").read_text())["log_step"] == 20
    # a longer budget on resume, by the algorithm's own flag, without --algo
    main(["train", "--resume", "--out", str(run), "--bc.gradient-steps", "40"])
    assert json.loads((run / "summary.json").read_text())["log_step"] == 40
    out = error_of(capsys, ["train", "--resume", "--out", str(run), "--total-steps", "100000"])
    assert "its budget is --bc.gradient-steps" in out  # never silently ignored
    out = error_of(capsys, ["train", "--resume", "--out", str(run), "--bc.lr", "0.5"])
    assert "--bc.lr" in out and "--bc.gradient-steps" in out and "--total-steps" not in out
    # no preset for bc on so101-reach: the budget is scaled to the 2 x 50-frame dataset, and the run says so
    from rlrobot.commands.train import parse_train_args

    capsys.readouterr()
    cfg = parse_train_args(["--algo", "bc", "--task", "so101-reach", "--dataset", str(data)])
    cfg.prepare()
    assert cfg.bc.gradient_steps == 2_000
    assert "bc: no preset budget for task 'so101-reach': 2,000 gradient steps, scaled to the dataset (100 frames" in \
        capsys.readouterr().out
    push = parse_train_args(["--algo", "bc", "--task", "so101-push", "--dataset", str(data)])
    assert push.bc.gradient_steps == 3_000  # the so101-push preset's


def test_eval_reproduces_the_runs_own_evaluation_by_default(tmp_path, capsys):
    run = tmp_path / "run"
    train(run, 2)
    reported = json.loads((run / "eval.json").read_text())
    main(["eval", "--checkpoint", str(run), "--no-video", "--out", str(tmp_path / "ev")])
    out = capsys.readouterr().out
    again = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert again["return_mean"] == reported["return_mean"] and "same seed, episodes and envs" in out
    main(["eval", "--checkpoint", str(run), "--no-video", "--seed", "5", "--out", str(tmp_path / "ev2")])
    assert "numbers differ by sampling" in capsys.readouterr().out


def test_top_level_help_and_version(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    assert "rlrobot <command> [options]" in out and all(c in out for c in ("train", "eval", "list-algos", "deploy"))
    main(["--version"])
    assert capsys.readouterr().out.startswith("rlrobot 0.")


def test_a_total_steps_that_is_not_whole_iterations_says_what_it_runs(tmp_path, capsys):
    main(["train", "--out", str(tmp_path / "r"), "--total-steps", str(PER_ITERATION + 36), *RUN])
    out = capsys.readouterr().out
    assert f"--total-steps {PER_ITERATION + 36} runs {PER_ITERATION} env steps: whole iterations of {PER_ITERATION}" in out
    main(["train", "--out", str(tmp_path / "whole"), "--total-steps", str(PER_ITERATION), *RUN])
    assert "whole iterations" not in capsys.readouterr().out


def test_a_cli_run_prepares_its_config_once(tmp_path, monkeypatch):
    from rlrobot.config import TrainConfig

    calls = []
    prepare = TrainConfig.prepare
    monkeypatch.setattr(TrainConfig, "prepare", lambda self: (calls.append(1), prepare(self))[1])
    train(tmp_path / "r", 1)
    assert len(calls) == 1  # --init / --dataset are read once
