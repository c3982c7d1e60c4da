"""Data-parallel training with torch.distributed (gloo, 2 CPU processes).

1. One PPO update on two ranks, each holding half of a batch, equals the update of one process on the whole batch
   (gradients all-reduced, advantage statistics and the adaptive-lr KL reduced across ranks).
2. ``torchrun -m rlrobot train --distributed`` runs PPO, SAC and Flow-Noise PPO on two processes; parameters are
   bit-identical across ranks at the end, rank 0 alone writes the run directory.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlrobot.algorithms.ppo import PPO, PPOConfig
from rlrobot.policies.actor_critic import ActorCritic

STEPS, ENVS, OBS, ACT = 6, 16, 8, 3


def fixed_rollout(env_slice: slice) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    data = {"obs": torch.randn(STEPS, ENVS, OBS, generator=gen), "actions": torch.randn(STEPS, ENVS, ACT, generator=gen),
            "log_probs": torch.randn(STEPS, ENVS, generator=gen) - 3, "values": torch.randn(STEPS, ENVS, generator=gen),
            "rewards": torch.randn(STEPS, ENVS, generator=gen), "dones": (torch.rand(STEPS, ENVS, generator=gen) < 0.1).float(),
            "mean": torch.randn(STEPS, ENVS, ACT, generator=gen) * 0.1, "last": torch.randn(ENVS, generator=gen)}
    return {k: v[..., env_slice] if k == "last" else v[:, env_slice] for k, v in data.items()}


def run_update(data: dict[str, torch.Tensor], sync=None) -> tuple[dict, float]:
    torch.manual_seed(0)
    policy = ActorCritic(OBS, ACT)
    n = data["obs"].shape[1]
    algo = PPO(policy, PPOConfig(rollout_steps=STEPS, num_epochs=3, num_minibatches=1, lr=3e-3), torch.device("cpu"), n,
               {"state": ((OBS,), torch.float32)}, sync=sync)
    for t in range(STEPS):
        algo.storage.add({"state": data["obs"][t]}, actions=data["actions"][t], log_probs=data["log_probs"][t],
                         values=data["values"][t], rewards=data["rewards"][t], dones=data["dones"][t],
                         action_mean=data["mean"][t], action_std=torch.ones(n, ACT))
    algo.storage.compute_returns(data["last"], 0.99, 0.95)
    algo.update(torch.Generator().manual_seed(0))
    return {k: v.clone() for k, v in policy.state_dict().items()}, algo.lr_schedule.lr


def _rank_main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from rlrobot.runners.distributed import DataParallel

    half = ENVS // world
    state, lr = run_update(fixed_rollout(slice(rank * half, (rank + 1) * half)), DataParallel())
    torch.save({"state": state, "lr": lr}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_rank_update_equals_single_process_on_the_whole_batch(tmp_path):
    mp.start_processes(_rank_main, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    single_state, single_lr = run_update(fixed_rollout(slice(0, ENVS)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for k, v in single_state.items():
        assert torch.equal(ranks[0]["state"][k], ranks[1]["state"][k]), k  # ranks stay identical
        assert torch.allclose(ranks[0]["state"][k], v, atol=1e-5, rtol=1e-4), k  # and match one process
    assert ranks[0]["lr"] == ranks[1]["lr"] == single_lr
    initial = ActorCritic(OBS, ACT)
    assert not torch.allclose(single_state["actor.0.weight"], initial.state_dict()["actor.0.weight"])


def torchrun(tmp_path, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "rlrobot", "train",
           "--distributed", "--logger", "none", "--no-video", "--num-threads", "1", "--eval-episodes", "4",
           "--eval-envs", "4", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("algo, iterations, extra", [
    ("ppo", 4, ["--ppo.rollout-steps", "8", "--ppo.num-minibatches", "2", "--total-steps", str(2 * 8 * 8 * 4)]),
    ("sac", 3, ["--sac.learning-starts", "64", "--sac.batch-size", "32", "--sac.rollout-steps", "8",
             "--total-steps", str(2 * 8 * 8 * 3)]),
    ("flow-noise", 2, ["--init", "none", "--flow-ppo.rollout-chunks", "2", "--flow-ppo.num-minibatches", "2",
                    "--flow.velocity-hidden", "64", "64", "--total-steps", str(2 * 8 * 2 * 5 * 2)]),
])
def test_torchrun_training_keeps_ranks_identical(tmp_path, algo, iterations, extra):
    out = tmp_path / "run"
    torchrun(tmp_path, "--task", "so101-reach", "--algo", algo, "--num-envs", "8", "--out", str(out), *extra)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["distributed"] == {"world_size": 2, "parameters_identical": True}
    total = int(extra[extra.index("--total-steps") + 1])
    assert summary["env_steps"] == total  # total_steps counts both ranks' env steps
    assert summary["eval"]["episodes"] == 4
    # rank 0 alone logs: one metrics line per iteration
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len([x for x in lines if "perf/iterations_per_s" in x]) == iterations


@pytest.mark.slow
def test_torchrun_resume_continues_from_rank_zeros_checkpoint(tmp_path):
    """Rank 0 alone writes checkpoints (ranks writing one directory raced on its rename); every rank resumes from it."""
    out = tmp_path / "run"
    ppo = ["--task", "so101-reach", "--algo", "ppo", "--num-envs", "8", "--out", str(out), "--ppo.rollout-steps", "8",
           "--ppo.num-minibatches", "2", "--checkpoint-every", "1"]
    torchrun(tmp_path, *ppo, "--total-steps", str(2 * 8 * 8 * 2))
    assert (out / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]  # no temporary left over
    torchrun(tmp_path, *ppo, "--total-steps", str(2 * 8 * 8 * 3), "--resume")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 2 * 8 * 8 * 3
    assert summary["distributed"] == {"world_size": 2, "parameters_identical": True}
    assert (out / "checkpoints" / "latest").read_text().strip() == "iter_000003"


def test_distributed_outside_torchrun_is_refused(tmp_path, capsys):
    from rlrobot.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--distributed", "--out", str(tmp_path / "x"), "--logger", "none"])
    assert "launched by torchrun" in capsys.readouterr().out
