"""Overlapped rollout and update (--ppo.overlap, --flow-ppo.overlap): each rollout acts with the policy from before the
previous update while that update runs on the worker thread, evaluations and checkpoints see a whole policy, seeded
runs reproduce, and what cannot overlap is refused."""

import dataclasses
import json
import threading

import pytest
import torch

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import train_config
from rlrobot.policies import ActorCriticConfig
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.runners.flow_on_policy import FlowOnPolicyRunner
from rlrobot.runners.on_policy import OnPolicyRunner

SMALL_FLOW = FlowPolicyConfig(chunk_size=5, denoising_steps=3, state_hidden=(32, 32), embed_dim=32, time_embed_dim=16,
                              velocity_hidden=(64, 64), noise_hidden=(16,), value_hidden=(32,))


def ppo_config(tmp_path, iterations: int, **fields):
    fields.setdefault("checkpoint_every", 100)
    return train_config("ppo", task="so101-reach", num_envs=8, total_steps=8 * 6 * iterations, seed=3,
                        out=str(tmp_path / "ppo"), logger="none", video=False, eval_every=0, eval_episodes=2, eval_envs=2,
                        num_threads=1, update_threads=1,
                        ppo=PPOConfig(rollout_steps=6, num_minibatches=2, num_epochs=2, overlap=True),
                        policy=ActorCriticConfig(actor_hidden=(16,), critic_hidden=(16,)), **fields)


def flow_config(tmp_path, iterations: int):
    cfg = train_config("flow-noise", task="so101-reach", num_envs=4, total_steps=4 * 2 * 5 * iterations, seed=3,
                       out=str(tmp_path / "flow"), logger="none", video=False, eval_every=0, eval_episodes=2, eval_envs=2,
                       flow=dataclasses.replace(SMALL_FLOW), num_threads=1, update_threads=1, init="none",
                       checkpoint_every=100)
    cfg.flow_ppo.rollout_chunks, cfg.flow_ppo.num_minibatches, cfg.flow_ppo.overlap = 2, 2, True
    return cfg


def weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


@pytest.mark.parametrize("algo", ["ppo", "flow-noise"])
def test_each_rollout_acts_with_the_policy_from_before_the_previous_update(tmp_path, algo):
    runner = OnPolicyRunner(ppo_config(tmp_path, 5)) if algo == "ppo" else FlowOnPolicyRunner(flow_config(tmp_path, 5))
    learner, acting, updated, threads = runner.policy, {}, [], []
    act_name = "act" if algo == "ppo" else "rollout_act"
    act, update = getattr(runner.algo, act_name), runner.algo.update

    def recording_act(obs, *args):
        policy = args[-1]
        acting.setdefault(runner.iteration, weights(policy))
        assert policy is not learner  # the rollout never reads the weights the update is changing
        return act(obs, *args)

    def recording_update(generator=None):
        stats = update(generator)
        updated.append(weights(learner))  # on the worker thread, right after its own optimizer steps
        threads.append(threading.current_thread().name)
        return stats

    setattr(runner.algo, act_name, recording_act)
    runner.algo.update = recording_update
    initial = weights(learner)
    summary = runner.learn()
    assert summary["env_steps"] == runner.cfg.total_steps
    assert len(updated) == 5 and all(name.startswith("rlrobot-update") for name in threads)
    # rollouts 0 and 1 act with the initial policy (1 while update 0 runs); rollout i >= 2 with update i - 2's result
    expected = [initial, initial] + updated[:3]
    for i in range(5):
        assert all(torch.equal(a, b) for a, b in zip(acting[i], expected[i], strict=True)), i
    assert not all(torch.equal(a, b) for a, b in zip(updated[0], updated[1], strict=True))
    # the final evaluation and checkpoint saw the last update's policy
    assert all(torch.equal(a, b) for a, b in zip(weights(learner), updated[-1], strict=True))


@pytest.mark.parametrize("algo", ["ppo", "flow-noise"])
def test_each_update_takes_its_ratio_and_kl_around_the_policy_it_starts_from(tmp_path, algo):
    """The rollouts are one update stale; decoupled PPO takes the ratio, its clip and the adaptive lr's KL around the
    policy each update starts from, so each update's first minibatch (no step taken yet) has zero KL and clips
    nothing, while later minibatches move (around the acting policy the first minibatches would already clip)."""
    runner = OnPolicyRunner(ppo_config(tmp_path, 4)) if algo == "ppo" else FlowOnPolicyRunner(flow_config(tmp_path, 4))
    kls, clips, step, losses = [], [], runner.algo.lr_schedule.step, runner.algo._losses

    def recording_step(kl):
        kls.append(float(kl))
        step(kl)

    def recording_losses(*args):
        out = losses(*args)
        clips.append(float(out[-1]))  # the clip fraction
        return out

    runner.algo.lr_schedule.step, runner.algo._losses = recording_step, recording_losses
    runner.learn()
    per_update = len(kls) // 4
    assert len(kls) == len(clips) == 4 * per_update and per_update > 1
    assert max(abs(k) for k in kls[::per_update]) < 1e-5 and max(kls) > 1e-4
    assert max(clips[::per_update]) == 0.0 and max(clips) > 0.0


def test_an_overlapped_run_logs_each_update_once_it_finished(tmp_path):
    cfg = ppo_config(tmp_path, 4)
    OnPolicyRunner(cfg).learn()
    rows = [json.loads(line) for line in open(tmp_path / "ppo" / "metrics.jsonl") if "perf/rollout_fraction" in line]
    assert len(rows) == 4
    assert "loss/policy_loss" not in rows[0]  # update 0 runs during iteration 1
    assert all("loss/policy_loss" in r and 0 <= r["perf/update_wait_fraction"] <= 1 for r in rows[1:])


def test_a_seeded_overlapped_run_is_reproducible_and_not_the_synchronous_run(tmp_path):
    def final(out, **ppo):
        cfg = ppo_config(out, 4)
        for k, v in ppo.items():
            setattr(cfg.ppo, k, v)
        runner = OnPolicyRunner(cfg)
        runner.learn()
        return weights(runner.policy)

    a, b, sync = final(tmp_path / "a"), final(tmp_path / "b"), final(tmp_path / "c", overlap=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, sync, strict=True))


def test_overlap_is_refused_where_it_cannot_run(tmp_path):
    cfg = ppo_config(tmp_path, 2, distributed=True)
    with pytest.raises(ValueError, match="ppo.overlap .* --distributed"):
        cfg.validate()
    cfg = train_config("flow-srpo", task="so101-reach", num_envs=8, init="none")
    cfg.flow_srpo.overlap = True
    with pytest.raises(ValueError, match="flow_srpo.overlap"):
        cfg.flow_srpo.validate(cfg)
    cfg = train_config("vla-flow-noise", task="so101-lift", init="runs/some-vla")
    cfg.flow_ppo.overlap = True
    with pytest.raises(ValueError, match="flow_ppo.overlap .* VLA"):
        cfg.flow_ppo.validate(cfg)


@pytest.mark.slow
def test_overlapped_ppo_learns_reach(tmp_path):
    """A real, seeded, small run (test_ppo_learns_reach's) with the rollout one update behind: deterministic eval
    success on so101-reach must reach 0.8, as the synchronous run's must (about 2 minutes on one loaded core)."""
    cfg = train_config("ppo", task="so101-reach", num_envs=128, total_steps=128 * 24 * 90, seed=1, logger="none",
                       out=str(tmp_path / "learn"), eval_every=0, eval_episodes=64, eval_envs=32, video=False,
                       ppo=PPOConfig(overlap=True))
    summary = OnPolicyRunner(cfg).learn()
    print(json.dumps(summary["eval"]))
    assert summary["eval"]["success_rate"] >= 0.8
