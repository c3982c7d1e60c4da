"""The results runner on a tiny real entry (PPO on so101-reach, a few iterations, real MuJoCo, real subprocesses):
per-seed figures, mean +- std, provenance, reuse of finished steps, and reproducibility: the same seed on the same
thread counts gives identical metrics and weights."""

import json
import shutil

import pytest
import torch

from rlrobot.results.registry import Entry, Figure, Step
from rlrobot.results.runner import aggregate, command_template, run_entry, step_argv

TINY = ("--num-envs", "8", "--total-steps", "384", "--ppo.rollout-steps", "24", "--eval-episodes", "4",
        "--eval-envs", "4", "--eval-every", "0", "--num-threads", "1", "--torch-threads", "1", "--update-threads", "1",
        "--logger", "none")
ENTRY = Entry(name="tiny-ppo", title="tiny PPO so101-reach", task="so101-reach", budget="384 env steps", seeds=1,
              steps=(Step("train", "train", ("train", "--task", "so101-reach", "--algo", "ppo", "--seed", "{seed}",
                                             "--out", "{out}", "--no-video", *TINY)),),
              figures=(Figure("train.return", "return", ".3f", per_seed=True), Figure("train.env_steps", "env steps")),
              curve="train.eval/return_mean")
TIMING = ("time/", "perf/")


def _metrics(path):
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture(scope="module")
def seed0(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    result = run_entry(ENTRY, [0], root=root / "runs", results_dir=root / "results", log=lambda m: None)
    return root, result


def test_entry_writes_figures_and_provenance(seed0):
    root, result = seed0
    saved = json.loads((root / "results" / "tiny-ppo.json").read_text())
    assert saved["seeds"] == [0] and saved["summary"]["train.env_steps"]["values"] == [384.0]
    assert saved["summary"]["train.return"] == aggregate([saved["per_seed"][0]["figures"]["train.return"]])
    step = saved["per_seed"][0]["steps"][0]
    assert step["returncode"] == 0 and len(step["git_commit"]) == 40 and isinstance(step["git_dirty"], bool)
    assert step["command"].startswith("rlrobot train --task so101-reach --algo ppo --seed 0 --out ")
    assert saved["machine"]["cores"] >= 1 and saved["machine"]["torch"] == torch.__version__
    assert saved["per_seed"][0]["curve"]["x"] == [384.0]  # --eval-every 0: the final evaluation only
    assert saved["commands"] == [command_template(ENTRY, ENTRY.steps[0], root / "runs")]
    assert "--seed $S" in saved["commands"][0] and "/s$S/train" in saved["commands"][0]


def test_finished_steps_are_reused_not_rerun(seed0):
    root, result = seed0
    again = run_entry(ENTRY, [0], root=root / "runs", results_dir=root / "again", log=lambda m: None)
    assert again["per_seed"][0]["figures"] == result["per_seed"][0]["figures"]
    assert again["per_seed"][0]["steps"][0]["started"] == result["per_seed"][0]["steps"][0]["started"]


def test_force_reruns_a_finished_step_in_place(seed0, tmp_path):
    """--force replaces the step's earlier output (the run directory a train step refuses to overwrite) and runs it
    again; the same seed on the same threads gives the same figures."""
    root, result = seed0
    shutil.copytree(root / "runs", tmp_path / "runs")  # the module's runs stay as they are for the other tests
    forced = run_entry(ENTRY, [0], root=tmp_path / "runs", results_dir=tmp_path / "forced", force=True,
                       log=lambda m: None)
    step = forced["per_seed"][0]["steps"][0]
    assert step["returncode"] == 0 and not step.get("reused")
    learned = {k: v for k, v in forced["per_seed"][0]["figures"].items() if not k.endswith("wall_s")}  # timing aside
    assert learned == {k: v for k, v in result["per_seed"][0]["figures"].items() if not k.endswith("wall_s")}
    assert "train.success" in learned and "train.return" in learned


def test_same_seed_same_threads_is_bit_identical(seed0, tmp_path):
    """Seed 0 again, from scratch in another directory (in this process, to save the imports): identical metrics
    (timing aside), final evaluation and weights."""
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.commands.train import train

    root, result = seed0
    first = root / "runs" / "tiny-ppo" / "s0" / "train"
    argv = step_argv(ENTRY, ENTRY.steps[0], 0, tmp_path)[1:]
    second = tmp_path / "train"
    assert argv[argv.index("--out") + 1] == str(second)
    summary = train(argv)
    assert summary["eval"]["return_mean"] == result["per_seed"][0]["figures"]["train.return"]
    assert _metrics(first / "metrics.jsonl") == _metrics(second / "metrics.jsonl")
    w1, _, _ = load_checkpoint(str(first))
    w2, _, _ = load_checkpoint(str(second))
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)


def test_mean_and_sample_std_over_seeds():
    s = aggregate([0.9, 1.0, 0.8])
    assert s["mean"] == pytest.approx(0.9) and s["std"] == pytest.approx(0.1) and s["n"] == 3
    assert aggregate([0.5])["std"] == 0.0


def test_placeholders_name_earlier_steps_only(tmp_path):
    bad = Entry(name="bad", title="", task="so101-reach", budget="", figures=(),
                steps=(Step("a", "train", ("train", "--init", "{b}")), Step("b", "train", ("train",))))
    with pytest.raises(ValueError, match="placeholder 'b'"):
        step_argv(bad, bad.steps[0], 0, tmp_path)


def test_git_state_names_modified_paths_exactly(tmp_path):
    """Porcelain lines start with a blank status column for unstaged changes: the first path keeps its first letter."""
    import subprocess

    from rlrobot.results.runner import git_state

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    for name in ("configs.py", "b.py"):
        (tmp_path / name).write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "init")
    for name in ("configs.py", "b.py"):
        (tmp_path / name).write_text("x = 2\n")
    state = git_state(tmp_path)
    assert state["git_dirty"] and sorted(state["dirty_paths"]) == ["b.py", "configs.py"]
    assert len(state["git_commit"]) == 40


def test_eval_step_reads_the_checkpoint_and_reports_its_figures(seed0):
    """An eval step (`rlrobot eval` on an earlier step's run) reuses the finished train step and reports eval.json's
    numbers; on the train run's own evaluation episodes it reproduces the run's final evaluation."""
    root, result = seed0
    evaluate = Step("final", "eval", ("eval", "--checkpoint", "{train}", "--episodes", "4", "--num-envs", "4",
                                      "--no-video", "--out", "{out}"))
    with_eval = Entry(name="tiny-ppo", title=ENTRY.title, task=ENTRY.task, budget=ENTRY.budget, seeds=1,
                      steps=(ENTRY.steps[0], evaluate), figures=(Figure("final.success_rate", "success"),))
    again = run_entry(with_eval, [0], root=root / "runs", results_dir=root / "with_eval", log=lambda m: None)
    steps = again["per_seed"][0]["steps"]
    assert steps[0]["started"] == result["per_seed"][0]["steps"][0]["started"]  # the train step was reused
    figures = again["per_seed"][0]["figures"]
    assert figures["final.return_mean"] == result["per_seed"][0]["figures"]["train.return"]
    assert figures["final.episodes"] == 4.0 and "final.success_rate" in figures
