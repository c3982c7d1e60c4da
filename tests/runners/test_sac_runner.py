"""Off-policy runner: exact resume with the replay buffer, cold-buffer resume without it, SAC checkpoints in eval."""

import pytest
import torch
from safetensors.torch import load_file

from rlrobot.algorithms.sac import SACConfig
from rlrobot.checkpoints import resolve_checkpoint
from rlrobot.config import train_config
from rlrobot.policies.sac_policy import SACPolicyConfig
from rlrobot.runners.off_policy import OffPolicyRunner


def sac_cfg(out, total_iterations, save_replay=False, **kw):
    kw.setdefault("logger", "none")
    return train_config("sac", task="so101-push", num_envs=4, total_steps=4 * 4 * total_iterations, seed=5,
                        out=str(out), max_episode_steps=10, checkpoint_every=2, eval_every=0, eval_episodes=2,
                        eval_envs=2, video=False,
                        sac=SACConfig(batch_size=16, learning_starts=32, rollout_steps=4, utd=0.75,
                                      buffer_size=400, num_target_critics=2, save_replay=save_replay),
                        policy=SACPolicyConfig(actor_hidden=(16,), critic_hidden=(16,), activation="relu",
                                               normalize_obs=False, num_critics=3), **kw)


def weights(run):
    return load_file(resolve_checkpoint(run) / "model.safetensors")


@pytest.mark.slow
def test_resume_with_saved_replay_continues_exactly(tmp_path):
    straight = OffPolicyRunner(sac_cfg(tmp_path / "a", 8))
    straight.learn()
    # stopped after 4 iterations (past learning_starts: updates already running), resumed to 8; crosses episodes
    OffPolicyRunner(sac_cfg(tmp_path / "b", 4, save_replay=True)).learn()
    assert (resolve_checkpoint(tmp_path / "b") / "replay.safetensors").is_file()
    resumed = OffPolicyRunner(sac_cfg(tmp_path / "b", 8, resume=True, save_replay=True))
    resumed.learn()
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert a.keys() == b.keys() and any(k.startswith("critic_target.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed.algo.num_updates == straight.algo.num_updates > 0
    assert float(resumed.algo.alpha) == float(straight.algo.alpha)


@pytest.mark.slow
def test_resume_without_replay_refills_the_buffer_then_continues(tmp_path):
    OffPolicyRunner(sac_cfg(tmp_path / "c", 4)).learn()
    assert not (resolve_checkpoint(tmp_path / "c") / "replay.safetensors").exists()
    before = weights(tmp_path / "c")
    resumed = OffPolicyRunner(sac_cfg(tmp_path / "c", 8, resume=True))
    resumed.learn()
    # 16 transitions an iteration, 12 updates once learning_starts=32 are stored: iterations 2-4 before the stop,
    # and after the cold resume iteration 5 only refills, 6-8 update again
    assert resumed.algo.num_updates == 3 * 12 + 3 * 12
    after = weights(tmp_path / "c")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert resumed.env_steps == 8 * 16


def test_resume_with_another_algo_is_refused(tmp_path):
    from rlrobot.runners.on_policy import OnPolicyRunner

    OffPolicyRunner(sac_cfg(tmp_path / "d", 2)).learn()
    cfg = train_config("ppo", task="so101-push", num_envs=4, out=str(tmp_path / "d"), resume=True, logger="none",
                       max_episode_steps=10, total_steps=10_000)
    with pytest.raises(ValueError, match="holds a 'sac' policy; algo='ppo' trains a 'actor-critic' policy"):
        OnPolicyRunner(cfg).learn()
    with pytest.raises(ValueError, match="needs its own config class"):
        cfg = sac_cfg(tmp_path / "e", 4)
        cfg.algo = "ppo"
        cfg.validate()
