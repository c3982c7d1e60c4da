"""--reward.shaping prm:PATH: the wrapper keeps final_obs / episode stats / success consistent, the potential mode
differs from the task's discounted return only by the boundary term, the model's done ends episodes cleanly, its
state travels with checkpoints, and a PRM of another observation space or a missing path is refused before any
compute."""

import pytest
import torch

import rlrobot
from rlrobot.checkpoints import save_checkpoint
from rlrobot.config import train_config
from rlrobot.rewards import RewardConfig
from rlrobot.rewards.progress_model import PRMNetConfig, VLACProgressModel, prm_metadata
from rlrobot.rewards.progress_reward import PRMReward, ProgressRewardConfig

GAMMA = 0.9
TINY = PRMNetConfig(obs_keys=("state",), state_hidden=(16,), embed_dim=8, text_dim=8, head_hidden=(16,))


TASK = "so101-push-to"  # a suite task: the instruction embedding is an observation (no sentence encoder to load)


def tiny_prm(tmp_path, task=TASK):
    """A (random-weight) PRM checkpoint in the layout of rlrobot train --algo prm, for ``task``'s state."""
    env = rlrobot.make(task, 1, seed=0)
    space = {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()}
    env.close()
    torch.manual_seed(0)
    model = VLACProgressModel(space, TINY)
    for p in model.parameters():  # larger weights: deltas spread over (-1, 1) rather than near 0
        p.data.mul_(3.0)
    model.head[-1].bias.data.fill_(1.0)  # and mostly positive: the clamped potential is not always 0
    return save_checkpoint(tmp_path / task, "ckpt", model, {"prm": prm_metadata(model)})


def test_prm_wrapper_keeps_episode_stats_and_the_potential_boundary_identity(tmp_path):
    ckpt = tiny_prm(tmp_path)
    env = rlrobot.make(TASK, 4, seed=0, reward_mode="sparse", max_episode_steps=10,
                       reward_wrappers=RewardConfig(shaping=f"prm:{ckpt}", gamma=GAMMA).wrappers(0.99))
    obs, _ = env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    t = torch.zeros(4)
    task_disc, shaped_disc, task_sum, shaped_sum = (torch.zeros(4) for _ in range(4))
    checked, largest = 0, 0.0
    for _ in range(30):
        action = (env.expert_action() + 0.3 * torch.randn(4, 5, generator=gen)).clamp(-1, 1)
        obs, shaped, terminated, truncated, info = env.step(action)
        task = info["success"].float()
        largest = max(largest, float((shaped - task).abs().max()))
        task_disc += GAMMA**t * task
        shaped_disc += GAMMA**t * shaped
        task_sum += task
        shaped_sum += shaped
        t += 1
        assert info["prm_progress"].shape == (4,) and ((info["prm_done"] >= 0) & (info["prm_done"] <= 1)).all()
        done = terminated | truncated
        if done.any():
            ids = info["episode"]["env_ids"]
            phi_end = info["prm_progress"].clamp_min(0.0) * (~terminated).float()  # Phi(s_T); Phi(s_0) = 0
            assert torch.allclose((shaped_disc - task_disc)[done], (GAMMA**t * phi_end)[done], atol=1e-4)
            assert torch.allclose(info["episode"]["return"], shaped_sum[ids], atol=1e-4)
            assert torch.allclose(info["episode"]["task_return"], task_sum[ids], atol=1e-4)
            assert torch.equal(info["final_obs"]["state"][~done], obs["state"][~done])
            checked += int(done.sum())
            for x in (t, task_disc, shaped_disc, task_sum, shaped_sum):
                x[done] = 0.0
    assert checked == 12 and largest > 0.01
    env.close()


def test_prm_progress_mode_pays_the_progress_of_the_frame_reached_from_the_first(tmp_path):
    ckpt = tiny_prm(tmp_path)
    cfg = RewardConfig(shaping=f"prm:{ckpt}", prm=ProgressRewardConfig(mode="progress", scale=0.5))
    env = rlrobot.make(TASK, 3, seed=0, reward_mode="sparse", max_episode_steps=6, reward_wrappers=cfg.wrappers(0.99))
    model = env.model
    obs, _ = env.reset(seed=0)
    first = obs["state"].clone()
    gen = torch.Generator().manual_seed(0)
    paid = []
    for _ in range(12):
        obs, reward, terminated, truncated, info = env.step(torch.rand(3, 5, generator=gen) * 2 - 1)
        emb = info["final_obs"]["instruction_embedding"]
        delta, _ = model.progress({"state": first}, {"state": info["final_obs"]["state"]}, emb)
        expected = info["success"].float() + 0.5 * delta.clamp_min(0.0)  # Phi(s_t+1) from the episode's first frame
        assert torch.allclose(reward, expected, atol=1e-5)
        paid.append(float((reward - info["success"].float()).abs().max()))
        done = terminated | truncated
        first = torch.where(done[:, None], obs["state"], first)  # new episodes measure from their own first frame
    assert max(paid) > 0.01  # the term is not trivially zero
    with pytest.raises(ValueError, match="reward.prm.mode='level' is not one of"):
        RewardConfig(shaping=f"prm:{ckpt}", prm=ProgressRewardConfig(mode="level")).validate(train_config("ppo", task=TASK))
    env.close()


class DoneOnEnvZero:
    """A stub PRM (the protocol: obs_keys, done_threshold, progress): progress 0.1 per step; env 0 is 'done' from its
    3rd step on (in the state it reads: the episode step is counted by the stub per env)."""

    obs_keys = ("state",)
    done_threshold = 0.9

    def __init__(self, n):
        self.steps = torch.zeros(n)

    def progress(self, before, after, instruction):
        assert instruction.shape == (len(self.steps), 384)
        self.steps += 1
        self.after = after["state"].clone()  # the frame it judges
        done = torch.zeros(len(self.steps))
        done[0] = float(self.steps[0] >= 3)
        return torch.full_like(done, 0.1), done


def test_prm_done_ends_episodes_and_reports_them():
    base = rlrobot.make(TASK, 3, seed=0, reward_mode="sparse", max_episode_steps=8)
    stub = DoneOnEnvZero(3)
    env = PRMReward(base, stub, GAMMA, mode="raw", end_on_done=True)
    obs, _ = env.reset(seed=0)
    ended = []
    for step in range(8):
        obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 5))
        assert torch.allclose(reward, info["success"].float() + 0.1)  # raw: the delta itself
        if terminated[0]:
            ep = info["episode"]
            assert ep["env_ids"].tolist() == [0] and ep["length"].tolist() == [3] and not terminated[1:].any()
            assert not torch.equal(info["final_obs"]["state"][0], obs["state"][0])  # env 0 restarted
            assert torch.equal(info["final_obs"]["state"][0], stub.after[0])  # its final_obs: the frame judged done
            assert torch.equal(info["final_obs"]["state"][1:], obs["state"][1:])
            assert int(base.elapsed_steps[0]) == 0
            stub.steps[0] = 0
            ended.append(step)
    assert ended == [2, 5]  # every 3 steps; the other envs ran their 8 steps
    assert truncated[1:].all() and info["episode"]["env_ids"].tolist() == [1, 2]
    env.close()


def test_prm_wrapper_state_travels_with_checkpoints(tmp_path):
    ckpt = tiny_prm(tmp_path)

    def make():
        return rlrobot.make(TASK, 3, seed=0, reward_mode="sparse", max_episode_steps=7,
                            reward_wrappers=RewardConfig(shaping=f"prm:{ckpt}").wrappers(0.99))

    def run(env, steps, seed):
        gen = torch.Generator().manual_seed(seed)
        return torch.stack([env.step(torch.randn(3, 5, generator=gen).clamp(-1, 1))[1] for _ in range(steps)])

    a, b = make(), make()
    a.reset(seed=1)
    run(a, 10, 0)
    b.reset(seed=4)
    run(b, 3, 2)
    b.set_state(a.get_state())
    assert torch.equal(run(a, 12, 1), run(b, 12, 1))
    a.close()
    b.close()


def test_prm_reward_trains_ppo_and_refuses_bad_input(tmp_path):
    from rlrobot.algorithms.ppo import PPOConfig
    from rlrobot.policies import ActorCriticConfig
    from rlrobot.runners.on_policy import OnPolicyRunner

    ckpt = tiny_prm(tmp_path)
    cfg = train_config("ppo", task=TASK, num_envs=4, total_steps=4 * 6 * 2, seed=0, out=str(tmp_path / "run"),
                       reward_mode="sparse", reward=RewardConfig(shaping=f"prm:{ckpt}"), logger="none",
                       ppo=PPOConfig(rollout_steps=6, num_minibatches=2, num_epochs=1), max_episode_steps=5,
                       policy=ActorCriticConfig(actor_hidden=(8,), critic_hidden=(8,)), eval_every=0, eval_episodes=2,
                       eval_envs=2, video=False)
    summary = OnPolicyRunner(cfg).learn()
    assert summary["env_steps"] == 48
    with pytest.raises(ValueError, match="does not exist"):  # read when the training env is wrapped, before any step
        rlrobot.make(TASK, 2, seed=0, reward_wrappers=RewardConfig(shaping=f"prm:{tmp_path / 'missing'}").wrappers(0.99))
    with pytest.raises(ValueError, match="reward.shaping: prm:PATH needs its PATH"):
        train_config("ppo", reward=RewardConfig(shaping="prm:")).validate()
    with pytest.raises(ValueError, match="reward.prm.mode='sum' is not one of"):
        train_config("ppo", reward=RewardConfig(shaping=f"prm:{ckpt}", prm=ProgressRewardConfig(mode="sum"))).validate()
    with pytest.raises(ValueError, match="reward.prm.done ends single episodes, which needs a native task"):
        cfg = train_config("ppo", task="gym:Pendulum-v1", reward=RewardConfig(shaping=f"prm:{ckpt}",
                                                                           prm=ProgressRewardConfig(done=True)))
        cfg.reward.validate(cfg)
    other = tiny_prm(tmp_path, "so101-push")  # another state size: refused when the env is built, before any step
    with pytest.raises(ValueError, match="PRM observation 'state' has shape"):
        rlrobot.make(TASK, 2, seed=0, reward_wrappers=RewardConfig(shaping=f"prm:{other}").wrappers(0.99))
