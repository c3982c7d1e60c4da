import json
import os

import pytest
import torch
from safetensors.torch import load_file

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.checkpoints import resolve_checkpoint, save_checkpoint
from rlrobot.config import train_config
from rlrobot.policies import ActorCriticConfig
from rlrobot.runners.on_policy import OnPolicyRunner


def small_cfg(out, total_iterations, ppo=None, **kw):
    kw.setdefault("logger", "none")
    return train_config("ppo", task="so101-push", num_envs=8, total_steps=8 * 6 * total_iterations, seed=3,
                        out=str(out), ppo=PPOConfig(rollout_steps=6, num_minibatches=2, num_epochs=2, **(ppo or {})),
                        policy=ActorCriticConfig(actor_hidden=(16,), critic_hidden=(16,)), checkpoint_every=2,
                        eval_every=0, eval_episodes=2, eval_envs=2, video=False, max_episode_steps=10, **kw)


@pytest.mark.parametrize("ppo", [{}, {"normalize_rewards": True, "lr_schedule": "linear"}, {"overlap": True}],
                         ids=["default", "cleanrl", "overlap"])
def test_resume_continues_exactly(tmp_path, ppo):
    straight = OnPolicyRunner(small_cfg(tmp_path / "a", 4, ppo))
    straight.learn()
    # the same run, stopped after 2 iterations, then resumed to 4 (crosses episode boundaries and autoresets);
    # with the linear schedule the stopped run's lr fell over its own 2 iterations, so its checkpoint differs from
    # the straight run's: resume from a run of 4 that was interrupted after 2 instead
    if ppo.get("lr_schedule") == "linear":
        interrupted = OnPolicyRunner(small_cfg(tmp_path / "b", 4, ppo))
        interrupted._start()
        for _ in range(2):  # as a Ctrl-C after iteration 2: the iteration finishes, a checkpoint is written
            interrupted._train_and_log(None)
        interrupted.save()
    else:
        OnPolicyRunner(small_cfg(tmp_path / "b", 2, ppo)).learn()
    resumed = OnPolicyRunner(small_cfg(tmp_path / "b", 4, ppo, resume=True))
    resumed.learn()
    a = load_file(resolve_checkpoint(tmp_path / "a") / "model.safetensors")
    b = load_file(resolve_checkpoint(tmp_path / "b") / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed.iteration == 4 and resumed.env_steps == straight.env_steps


def test_existing_run_is_not_overwritten_without_resume(tmp_path):
    OnPolicyRunner(small_cfg(tmp_path / "c", 2)).learn()
    with pytest.raises(FileExistsError, match="--resume"):
        OnPolicyRunner(small_cfg(tmp_path / "c", 2)).learn()


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, "iter_000001", model, {"a": 1})
    import rlrobot.checkpoints as ck

    def crash(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ck, "save_file", crash)
    with pytest.raises(RuntimeError, match="disk full"):  # the write's own error, passed on
        save_checkpoint(tmp_path, "iter_000002", model, {"a": 2})
    # the previous checkpoint is intact and still the latest; no half-written directory is left
    assert resolve_checkpoint(tmp_path).name == "iter_000001"
    assert not (tmp_path / "iter_000002").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".iter")] == []
    assert json.loads((tmp_path / "iter_000001" / "config.json").read_text()) == {"a": 1}


@pytest.mark.slow
def test_loggers_tensorboard_and_wandb_offline(tmp_path):
    OnPolicyRunner(small_cfg(tmp_path / "tb", 2, logger="tensorboard")).learn()
    assert list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))
    pytest.importorskip("wandb", reason="wandb is an optional extra (pip install 'rlrobot[wandb]')")
    OnPolicyRunner(small_cfg(tmp_path / "wb", 2, logger="wandb", wandb_mode="offline")).learn()
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb"))
