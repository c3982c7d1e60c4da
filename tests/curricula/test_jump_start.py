"""JSRL (rlrobot.curricula.jump_start): the stage rule, the random variant's h, learner-only training data (PPO storage
mask, SAC replay), learner-alone evaluation, resume mid-curriculum, and one-line errors for bad input. Real MuJoCo
tasks (so101-reach with its scripted expert), tiny networks."""

import json

import numpy as np
import pytest
import torch

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.algorithms.sac import SACConfig
from rlrobot.config import train_config
from rlrobot.curricula.jump_start import STAGES_FILE, GuidedEnv, HorizonCurriculum, horizon_of_stage
from rlrobot.data.rollout_storage import masked_mean
from rlrobot.envs.vec_env import POLICY_ACTED
from rlrobot.policies.actor_critic import ActorCriticConfig
from rlrobot.policies.sac_policy import SACPolicyConfig

EPISODE = 10


def ppo_cfg(out, total_steps=8 * 20 * 2, **jsrl):
    from rlrobot.curricula.jump_start import JSRLConfig

    kw = {k: jsrl.pop(k) for k in ("resume", "task", "max_episode_steps", "num_envs") if k in jsrl}
    kw.setdefault("max_episode_steps", EPISODE)
    kw.setdefault("num_envs", 8)
    return train_config("ppo", task=kw.pop("task", "so101-reach"), total_steps=total_steps, seed=3, out=str(out),
                        checkpoint_every=1, eval_every=0, eval_episodes=8, eval_envs=8, video=False, logger="none",
                        ppo=PPOConfig(rollout_steps=20, num_epochs=1, num_minibatches=2),
                        policy=ActorCriticConfig(actor_hidden=(16,), critic_hidden=(16,)),
                        jsrl=JSRLConfig(**{"guide": "expert", **jsrl}), **kw)


# ---------------------------------------------------------------------- the stage rule
def test_horizon_runs_from_H_to_0_by_stages_and_never_below_0():
    assert [horizon_of_stage(100, s, 4) for s in range(6)] == [100, 75, 50, 25, 0, 0]
    assert horizon_of_stage(7, -1, 3) == 7 and horizon_of_stage(7, 99, 3) == 0


def test_stage_advances_only_when_the_moving_mean_holds_the_best():
    cur = HorizonCurriculum(horizon=10, stages=2, tolerance=0.2, window=4)
    assert not cur.record([1, 1, 1])  # the window is not full yet
    assert cur.record([1]) and (cur.stage, cur.h, cur.best) == (1, 5, 1.0)
    assert not cur.record([1, 0, 0, 0]) and cur.stage == 1  # 0.25 < 1.0 - 0.2 x 1.0
    assert not cur.record([1, 1]) and cur.stage == 1  # window [0, 0, 1, 1]: 0.5
    assert not cur.record([1]) and cur.stage == 1  # [0, 1, 1, 1]: 0.75 < 0.8
    assert cur.record([1]) and (cur.stage, cur.h) == (2, 0)  # [1, 1, 1, 1]
    for _ in range(5):  # the last stage: h stays 0
        assert not cur.record([1, 1, 1, 1])
    assert (cur.stage, cur.h) == (2, 0)
    assert [r["h"] for r in cur.history] == [10, 5]


def test_a_stage_that_never_succeeds_does_not_advance():
    cur = HorizonCurriculum(horizon=10, stages=5, tolerance=0.1, window=2)
    for _ in range(4):
        assert not cur.record([0, 0])
    assert cur.stage == 0 and cur.h == 10
    cur.record([1, 0])  # 0.5 is the best so far: held
    assert cur.stage == 1


def test_curriculum_state_round_trips():
    cur = HorizonCurriculum(horizon=20, stages=4, tolerance=0.1, window=3)
    cur.record([1, 1, 1], env_steps=30)
    cur.record([1, 0])
    other = HorizonCurriculum(horizon=20, stages=4, tolerance=0.1, window=3)
    other.load_state_arrays(cur.state_arrays())
    assert (other.stage, other.h, other.best, list(other.recent), other.history) == \
        (cur.stage, cur.h, cur.best, list(cur.recent), cur.history)


def test_masked_mean_ignores_masked_entries_even_if_not_finite():
    x = torch.tensor([[1.0, float("nan")], [3.0, float("inf")]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert masked_mean(x, mask).item() == 2.0
    assert masked_mean(torch.tensor([5.0, 7.0]), torch.zeros(2)).item() == 0.0


# ---------------------------------------------------------------------- the guided env
def test_random_variant_draws_h_uniformly_below_H():
    import rlrobot

    cfg = ppo_cfg("/tmp/unused", variant="random", horizon=8)
    env = GuidedEnv(rlrobot.make("so101-reach", 64, seed=0), cfg.jsrl, cfg)
    draws = []
    for _ in range(100):
        env._new_episodes(torch.ones(64, dtype=torch.bool))
        draws.append(env.h.clone())
    h = torch.cat(draws).numpy()
    counts = np.bincount(h, minlength=8)
    assert h.min() == 0 and h.max() == 7 and len(counts) == 8  # {0, ..., H-1}
    assert np.all(np.abs(counts / len(h) - 1 / 8) < 0.02)  # 6,400 draws: uniform within 2 points
    # stepping: the guide acts exactly while t < h of the env's episode, then the learner
    env.reset(seed=1)
    h0 = env.h.clone()
    for t in range(EPISODE):
        _, _, _, _, info = env.step(torch.zeros(64, env.single_action_space.shape[0]))
        assert torch.equal(info[POLICY_ACTED], ~(t < h0))


# ---------------------------------------------------------------------- learner-only training data
def test_ppo_storage_masks_out_the_guide_steps_and_gae_still_runs_through(tmp_path):
    from rlrobot.runners.on_policy import OnPolicyRunner

    runner = OnPolicyRunner(ppo_cfg(tmp_path / "ppo", horizon=4, window=10_000))  # stage 0 for the whole test
    runner._start()
    runner._rollout()
    storage = runner.algo.storage
    t = torch.arange(20)[:, None].expand(20, 8) % EPISODE  # step of the episode (all envs start together)
    assert torch.equal(storage.mask, (t >= 4).float())  # guide for the first h=4 steps of each episode
    assert storage.learner_steps == 8 * 12
    # GAE ran over every step: guide steps have returns too (through the episode), only the losses skip them; the
    # returns are GAE(gamma, lambda) of all the stored rewards, values and ends, recomputed here step by step
    cfg = runner.cfg.ppo
    with torch.no_grad():
        next_value = runner.policy.value(runner.obs)
    advantage, expected = torch.zeros(8), torch.zeros(20, 8)
    for t in reversed(range(20)):
        alive = 1.0 - storage.data["dones"][t]
        delta = storage.data["rewards"][t] + cfg.gamma * next_value * alive - storage.data["values"][t]
        advantage = delta + cfg.gamma * cfg.lam * alive * advantage
        expected[t] = advantage + storage.data["values"][t]
        next_value = storage.data["values"][t]
    assert storage.data["dones"][EPISODE - 1].all() and (storage.data["rewards"][:4] != 0).all()
    assert torch.allclose(storage.returns, expected, atol=1e-5)
    before = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    stats = runner.algo.update(runner.generator)
    assert stats["learner_steps"] == 96.0
    assert any(not torch.equal(before[k], v) for k, v in runner.policy.state_dict().items())
    # a rollout of guide steps only: no update at all (Adam's momentum would otherwise still move the weights)
    storage.mask.zero_()
    before = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    assert runner.algo.update(runner.generator)["learner_steps"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in runner.policy.state_dict().items())


def test_sac_replay_never_receives_a_guide_transition(tmp_path):
    from rlrobot.curricula.jump_start import JSRLConfig
    from rlrobot.runners.off_policy import OffPolicyRunner

    cfg = train_config("sac", task="so101-reach", num_envs=4, total_steps=4 * 20, seed=5, out=str(tmp_path / "sac"),
                       max_episode_steps=EPISODE, eval_every=0, video=False, logger="none",
                       sac=SACConfig(batch_size=8, learning_starts=1_000, rollout_steps=20, buffer_size=2_000),
                       policy=SACPolicyConfig(actor_hidden=(16,), critic_hidden=(16,), normalize_obs=False),
                       jsrl=JSRLConfig(guide="expert", horizon=6, window=10_000))
    runner = OffPolicyRunner(cfg)
    runner._start()
    runner._collect()
    replay = runner.replay
    assert len(replay) == 4 * 2 * (EPISODE - 6)  # 2 episodes per env, 4 learner steps each
    assert replay.count.tolist() == [8, 8, 8, 8]
    # each env's column holds its learner steps only: the 4th of every episode is its time-out
    assert replay.truncated[:8].T.tolist() == [[False, False, False, True] * 2] * 4
    batch = replay.sample(16, runner.generator)
    assert batch["obs"]["state"].shape == (16, runner.meta["obs_dim"])


def test_evaluation_runs_the_learner_alone(tmp_path):
    from rlrobot.runners.on_policy import OnPolicyRunner

    # stage 0 with H = the episode: the training episodes are the expert's alone, the evaluation the untrained learner's
    runner = OnPolicyRunner(ppo_cfg(tmp_path / "eval", max_episode_steps=30, window=10_000))
    runner._start()
    runner._rollout()
    runner.algo.storage.clear()
    runner._rollout()
    assert len(runner.recent_success) >= 8 and np.mean(runner.recent_success) >= 0.8
    assert runner.algo.storage.learner_steps == 0
    result = runner.evaluate(video=False)
    assert result["success_rate"] <= 0.25, result


# ---------------------------------------------------------------------- resume mid-curriculum
def test_resume_continues_the_curriculum_stage(tmp_path):
    from rlrobot.runners.on_policy import OnPolicyRunner

    out = tmp_path / "resume"
    kw = dict(max_episode_steps=20, horizon=20, stages=4, window=8, tolerance=0.5)
    first = OnPolicyRunner(ppo_cfg(out, total_steps=8 * 20 * 3, **kw))
    first.learn()
    stage, h, best = first.env.curriculum.stage, first.env.curriculum.h, first.env.curriculum.best
    assert stage >= 1 and h < 20  # the expert alone (h = 20) succeeded: at least one stage down
    saved = json.loads((out / STAGES_FILE).read_text())
    assert saved["stage"] == stage and saved["h"] == h
    resumed = OnPolicyRunner(ppo_cfg(out, total_steps=8 * 20 * 4, resume=True, **kw))
    assert resumed.env.curriculum.stage == 0  # a fresh env before the checkpoint is read
    resumed.restore()
    cur = resumed.env.curriculum
    assert (cur.stage, cur.h, cur.best) == (stage, h, best)
    assert cur.history == first.env.curriculum.history
    assert torch.equal(resumed.env.t, first.env.t) and torch.equal(resumed.env.h, first.env.h)


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("jsrl, message", [
    ({"guide": "runs/no-such-run"}, "jsrl.guide='runs/no-such-run' is neither 'expert' nor an existing"),
    ({"horizon": 0}, "jsrl.horizon must be >= 1"),
    ({"horizon": 11}, "jsrl.horizon=11 is longer than the episode (10 steps)"),
    ({"stages": 0}, "jsrl.stages must be >= 1"),
    ({"window": 0}, "jsrl.window must be >= 1"),
    ({"tolerance": 1.5}, "jsrl.tolerance must be in [0, 1)"),
    ({"variant": "linear"}, "jsrl.variant='linear' is not one of ('curriculum', 'random')"),
])
def test_bad_input_is_one_line_error(tmp_path, jsrl, message):
    with pytest.raises(ValueError) as e:
        ppo_cfg(tmp_path / "bad", **jsrl).prepare()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_expert_guide_needs_a_task_with_an_expert():
    from rlrobot.curricula.jump_start import JSRLConfig

    cfg = train_config("ppo", task="gym:Pendulum-v1", jsrl=JSRLConfig(guide="expert", horizon=10))
    with pytest.raises(ValueError, match=r"jsrl.guide=expert: task 'gym:Pendulum-v1' has no scripted expert"):
        cfg.validate()


def test_a_guide_checkpoint_drives_the_env_and_one_of_other_spaces_is_refused(tmp_path):
    from rlrobot.runners.on_policy import OnPolicyRunner

    guide_run = tmp_path / "guide"
    OnPolicyRunner(ppo_cfg(guide_run, total_steps=8 * 20, horizon=5)).learn()  # a reach policy (27-d state)
    runner = OnPolicyRunner(ppo_cfg(tmp_path / "guided", guide=str(guide_run), horizon=5))
    runner._start()
    runner._rollout()
    assert runner.algo.storage.learner_steps == 8 * 10  # the checkpoint guided 5 of every 10 steps
    with pytest.raises(ValueError, match=r"^jsrl.guide=.*does not match task 'so101-lift'.*obs_dim") as e:
        OnPolicyRunner(ppo_cfg(tmp_path / "lift", task="so101-lift", guide=str(guide_run), horizon=5))
    assert "\n" not in str(e.value)
