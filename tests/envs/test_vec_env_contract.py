"""The VecEnv contract, checked on the native backend, MuJoCo Warp and the gymnasium and ManiSkill adapters."""

import os

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.tasks.mujoco_vec_env import MujocoVecEnv


def _maniskill_missing() -> str | None:
    import glob

    try:
        import mani_skill.envs  # noqa: F401
    except ImportError:
        return "ManiSkill3 is not installed (pip install 'rlrobot[maniskill]'; it also needs a Vulkan driver)"
    icds = glob.glob("/usr/share/vulkan/icd.d/*.json") + glob.glob("/etc/vulkan/icd.d/*.json")
    if not icds and not os.environ.get("VK_ICD_FILENAMES"):
        return "no Vulkan driver (ManiSkill/SAPIEN needs one; Debian: mesa-vulkan-drivers >= 24.3 from bookworm-backports)"
    return None


def _mjwarp_missing() -> str | None:
    try:
        import mujoco_warp  # noqa: F401
    except ImportError:
        return "mujoco-warp is not installed (pip install 'rlrobot[warp]')"
    return None


MANISKILL = pytest.mark.skipif(_maniskill_missing() is not None, reason=str(_maniskill_missing()))
MJWARP = pytest.mark.skipif(_mjwarp_missing() is not None, reason=str(_mjwarp_missing()))
CASES = [("so101-reach", {}), ("so101-push", {"control_mode": "joint_delta"}), ("so101-lift", {"control_mode": "joint_pos"}),
         ("gym:Pendulum-v1", {}), pytest.param(("maniskill:PushCube-v1", {}), marks=MANISKILL),
         pytest.param(("maniskill:PickCube-v1", {"obs_mode": "state+rgb"}), marks=MANISKILL),
         pytest.param(("so101-push", {"backend": "mjwarp"}), marks=MJWARP),
         pytest.param(("so101-lift", {"backend": "mjwarp", "control_mode": "joint_pos"}), marks=MJWARP)]


def _case_id(case) -> str:
    task, opts = case.values[0] if hasattr(case, "values") else case
    return "-".join([task, opts.get("control_mode", opts.get("obs_mode", "default")), *opts.get("backend", "").split()])


@pytest.fixture(params=CASES, ids=[_case_id(c) for c in CASES])
def env(request):
    task, opts = request.param
    e = rlrobot.make(task, 4, seed=0, max_episode_steps=7, **opts)
    e.contract_case = (task, opts)  # to build a twin of it
    yield e
    e.close()


def test_spaces_and_shapes(env):
    obs, info = env.reset(seed=0)
    assert set(obs) == set(env.single_observation_space.spaces)
    for k, v in obs.items():
        assert v.shape == (env.num_envs, *env.single_observation_space[k].shape)
        assert v.device == env.device
    assert env.single_action_space.low.min() == -1.0 and env.single_action_space.high.max() == 1.0
    action = torch.zeros(env.num_envs, env.single_action_space.shape[0])
    obs, reward, terminated, truncated, info = env.step(action)
    assert reward.dtype == torch.float32 and reward.shape == (env.num_envs,)
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert info["success"].dtype == torch.bool and info["success"].shape == (env.num_envs,)
    assert obs["state"].dtype == torch.float32
    assert len(env.instruction) == env.num_envs and all(isinstance(s, str) and s for s in env.instruction)


def test_same_step_autoreset_final_obs_and_episode_stats(env):
    obs, _ = env.reset(seed=1)
    gen = torch.Generator().manual_seed(0)
    total = torch.zeros(env.num_envs)
    finished = 0
    for t in range(7):
        action = torch.rand(env.num_envs, env.single_action_space.shape[0], generator=gen) * 2 - 1
        prev = obs
        if t == 6:
            before_last = env.get_state() if isinstance(env, MujocoVecEnv) else None
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        done = terminated | truncated
        if t < 6:
            assert not truncated.any()
    # every env hits the 7-step limit at the same step (no early termination for these random actions)
    assert truncated.all() or done.all()
    ep = info["episode"]
    finished = len(ep["env_ids"])
    assert finished == env.num_envs
    assert torch.allclose(ep["return"], total, atol=1e-4)
    assert (ep["length"] == 7).all()
    assert ep["success"].dtype == torch.bool
    # the returned obs is the new episode's first obs, final_obs the last obs of the finished one
    assert not torch.allclose(info["final_obs"]["state"], obs["state"])
    assert not torch.allclose(info["final_obs"]["state"], prev["state"])
    if before_last is not None:  # MuJoCo tasks: a twin with a longer limit takes the same last step without a reset
        task, opts = env.contract_case
        twin = rlrobot.make(task, env.num_envs, seed=0, max_episode_steps=8, **opts)
        twin.set_state(before_last)
        twin_obs, *_, twin_info = twin.step(action)
        twin.close()
        assert "episode" not in twin_info and torch.equal(info["final_obs"]["state"], twin_obs["state"])
    # the next step starts counting a new episode
    obs, reward, *_ , info = env.step(torch.zeros(env.num_envs, env.single_action_space.shape[0]))
    assert "episode" not in info


def test_seeding_is_deterministic(env):
    def run(seed):
        obs, _ = env.reset(seed=seed)
        gen = torch.Generator().manual_seed(3)
        out = [obs["state"].clone()]
        for _ in range(10):
            a = torch.rand(env.num_envs, env.single_action_space.shape[0], generator=gen) * 2 - 1
            obs, r, *_ = env.step(a)
            out.append(obs["state"].clone())
            out.append(r.clone()[:, None].expand(-1, obs["state"].shape[1]))
        return torch.stack(out)

    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (torch.zeros(3, 5), ValueError, r"shape \(3, 5\), expected \[num_envs=4, action_dim=5\]"),  # wrong batch size
        (torch.zeros(4, 2), ValueError, r"shape \(4, 2\)"),  # wrong action dim
        (torch.zeros(4, 5, dtype=torch.int64), TypeError, "floating point"),
        (torch.full((4, 5), float("nan")), ValueError, r"NaN or Inf \(env indices \[0, 1, 2, 3\]\)"),
        (torch.full((4, 5), float("inf")), ValueError, "NaN or Inf"),
        (np.zeros((4, 5), np.float32), TypeError, "must be a torch.Tensor.*got ndarray"),
    ],
)
def test_bad_actions_are_rejected(bad, error, message):
    env = rlrobot.make("so101-reach", 4, seed=0)
    env.reset()
    with pytest.raises(error, match=message):  # the env's own check, before anything reaches the simulator
        env.step(bad)
    env.close()


def test_wrong_device_is_rejected():
    env = rlrobot.make("so101-reach", 2, seed=0)
    env.reset()
    with pytest.raises(ValueError, match="device"):
        env.step(torch.zeros(2, 5, device="meta"))
    env.close()
