import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.tasks.so101 import JOINT_HIGH, JOINT_LOW, JOINT_NAMES


def test_arm_matches_the_real_so101_joints():
    env = rlrobot.make("so101-reach", 1)
    m = env.model
    names = [m.joint(i).name for i in range(m.njnt) if m.joint(i).name in JOINT_NAMES]
    assert names == list(JOINT_NAMES)
    for i, name in enumerate(JOINT_NAMES):
        assert np.allclose(m.joint(name).range, [JOINT_LOW[i], JOINT_HIGH[i]])
        assert m.actuator(name).ctrlrange.tolist() == pytest.approx([JOINT_LOW[i], JOINT_HIGH[i]])
    # 5 revolute arm joints + a revolute gripper, position actuators
    assert all(m.joint(n).type[0] == 3 for n in JOINT_NAMES)
    env.close()


@pytest.mark.parametrize("obs_mode", ["rgb", "state+rgb"])
def test_image_observations(obs_mode):
    env = rlrobot.make("so101-lift", 2, seed=0, obs_mode=obs_mode, image_size=48)
    obs, _ = env.reset(seed=0)
    for cam in ("front", "wrist"):
        img = obs[f"image_{cam}"]
        assert img.shape == (2, 3, 48, 48) and img.dtype == torch.uint8
        assert img.float().std() > 5  # a real picture, not a blank frame
    assert ("state" in obs) == ("state" in obs_mode)
    obs2, *_ = env.step(env.expert_action())
    assert not torch.equal(obs2["image_front"], obs["image_front"])  # the scene moved
    env.close()


def test_sparse_reward_is_success():
    env = rlrobot.make("so101-reach", 16, seed=0, reward_mode="sparse")
    env.reset(seed=0)
    for _ in range(40):
        _, reward, _, _, info = env.step(env.expert_action())
        assert torch.equal(reward, info["success"].float())
    assert info["success"].any()
    env.close()


def test_domain_randomisation_varies_initial_states_and_physics():
    env = rlrobot.make("so101-push", 64, seed=0)
    env.reset(seed=0)
    cube = env.cube_pos.copy()
    assert cube[:, 0].std() > 0.005 and cube[:, 1].std() > 0.02
    assert len(set(env.model_index.tolist())) > 4
    frictions = {round(float(m.geom("cube").friction[0]), 4) for m in env.models}
    masses = {round(float(m.body("cube").mass[0]), 5) for m in env.models}
    assert len(frictions) > 4 and len(masses) > 4
    env.close()


def test_state_save_restore_continues_identically():
    env = rlrobot.make("so101-lift", 4, seed=0, max_episode_steps=12)
    env.reset(seed=0)
    for _ in range(5):
        env.step(env.expert_action())
    state = env.get_state()
    actions = [torch.rand(4, 5, generator=torch.Generator().manual_seed(i)) * 2 - 1 for i in range(10)]
    ref = [env.step(a)[0]["state"].clone() for a in actions]
    env2 = rlrobot.make("so101-lift", 4, seed=99, max_episode_steps=12)
    env2.set_state(state)
    out = [env2.step(a)[0]["state"].clone() for a in actions]  # crosses an autoreset at step 12
    for a, b in zip(ref, out, strict=True):
        assert torch.equal(a, b)
    env.close()
    env2.close()


def test_render_frame_for_videos():
    env = rlrobot.make("so101-reach", 1, seed=0)
    env.reset()
    frame = env.render(0)
    assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8 and frame.std() > 5
    env.close()


def test_push_reward_is_maximal_on_target():
    """Success pays 0.8-1.0, most with the cube at the target's centre and the arm at rest; short of it the reward
    stays below 0.55."""
    env = rlrobot.make("so101-push", 32, seed=0)
    env.reset(seed=0)
    seen_success = False
    for _ in range(100):
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        success = info["success"]
        live = (~(terminated | truncated)).numpy()  # ended envs already show their next episode's state
        dist = np.linalg.norm(env.cube_pos[:, :2] - env.target[:, :2], axis=1)
        assert torch.all(reward[success] >= 0.8)
        on = success.numpy() & live
        still = 1.0 - np.tanh(5.0 * np.linalg.norm(env.qvel[:, :5], axis=1))
        expected = 0.8 + 0.1 * (1.0 - np.tanh(40 * dist)) + 0.1 * still
        np.testing.assert_allclose(reward.numpy()[on], expected[on], atol=1e-5)
        assert torch.all(reward[~success] <= 0.55)
        seen_success |= bool(success.any())
    assert seen_success


def _jaw_table_force(env, i: int) -> float:
    import mujoco

    model, data = env.model, env.datas[i]
    total = 0.0
    for k in range(data.ncon):
        names = model.geom(data.contact[k].geom1).name + model.geom(data.contact[k].geom2).name
        if "jaw" in names and "table" in names:
            force = np.zeros(6)
            mujoco.mj_contactForce(model, data, k, force)
            total += force[0]
    return total


def test_cartesian_floor_keeps_jaws_off_the_table():
    """Holding "down" at any gripper opening stops the jaw tips at the floor: no pressing force that jams the arm
    (without the floor the closed jaws pressed 13 N and moved 6 mm in 5 steps of full sideways command)."""
    from rlrobot.tasks.so101 import JAW_TIP_FLOOR

    env = rlrobot.make("so101-push", 6, seed=0)
    env.reset(seed=0)
    action = torch.zeros(6, 5)
    action[:, 2] = -1.0
    action[:, 4] = torch.tensor([-1.0, -0.6, -0.3, 0.0, 0.6, 1.0])
    for _ in range(30):
        env.step(action)
    assert np.all(env.jaw_tips[:, :, 2].min(1) > JAW_TIP_FLOOR - 0.001)
    assert max(_jaw_table_force(env, i) for i in range(6)) < 2.0
    start = env.tcp.copy()
    action[:, 1] = -1.0  # full sideways command while still holding down
    for _ in range(5):
        env.step(action)
    assert np.all(np.linalg.norm(env.tcp[:, :2] - start[:, :2], axis=1) > 0.04)
    env.close()


def test_lift_staged_reward_stages_and_success_maximum():
    """so101-lift's staged reward (ManiSkill3 PickCube's shape): reach only until the jaws hold the cube, +1 while
    held and more as the held cube nears its goal above the start, and exactly 1 (the maximum) on success."""
    env = rlrobot.make("so101-lift", 16, seed=0, reward_mode="staged")
    env.reset(seed=0)
    seen = {"reach": False, "held": False, "success": False}
    for _ in range(100):
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        live = (~(terminated | truncated)).numpy()  # ended envs already show their next episode's state
        success = info["success"].numpy()
        tcp_to_cube = np.linalg.norm(env.tcp - env.cube_pos, axis=1)
        held = env.contacts.all(axis=1) & (tcp_to_cube < 0.03)
        reach = (1.0 - np.tanh(5.0 * tcp_to_cube)) / 5.0
        r = reward.numpy()
        assert np.all((r >= 0.0) & (r <= 1.0 + 1e-6))
        np.testing.assert_allclose(r[success], 1.0, atol=1e-6)
        free = live & ~held & ~success
        np.testing.assert_allclose(r[free], reach[free], atol=1e-5)  # nothing but reach before the grasp
        on = live & held & ~success
        assert np.all(r[on] >= reach[on] + 0.2 - 1e-6) and np.all(r[on] < 0.6 + 1e-6)  # the grasp's +1 (of 5) counts
        seen["reach"] |= bool(free.any())
        seen["held"] |= bool(on.any())
        seen["success"] |= bool(success.any())
    assert all(seen.values()), seen
    env.close()


def test_staged_reward_is_refused_for_tasks_without_it():
    with pytest.raises(ValueError, match="reward_mode='staged' is not one of"):
        rlrobot.make("so101-reach", 1, reward_mode="staged")


@pytest.mark.parametrize("control_mode", ["ee_delta", "joint_pos"])
def test_servo_limits_apply_the_deploy_supervisors_window(control_mode):
    """With servo_limits each env's joint targets are what the deploy safety supervisor (its defaults: the STS3215
    servos) would pass for the wanted targets, step by step, so a policy trained so is not clamped on the arm; without
    it the wanted targets go through unchanged, beyond the servo's speed."""
    from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor

    limited = rlrobot.make("so101-reach", 2, seed=3, control_mode=control_mode, servo_limits=True, num_threads=1)
    free = rlrobot.make("so101-reach", 2, seed=3, control_mode=control_mode, num_threads=1)
    limited.reset(seed=3)
    free.reset(seed=3)
    supervisors = [SafetySupervisor(SafetyConfig(), JOINT_LOW, JOINT_HIGH, limited.control_dt) for _ in range(2)]
    for i, s in enumerate(supervisors):
        s.reset(limited.ctrl[i])
    gen = torch.Generator().manual_seed(0)
    max_step = SafetyConfig().max_joint_velocity * limited.control_dt
    clamped_free = 0
    for _ in range(30):
        action = (torch.rand(2, limited.action_dim, generator=gen) * 2 - 1).sign()  # full-scale: beyond the servo
        wanted = limited._actions_to_ctrl(action.double().numpy())
        expected = np.stack([s.filter(w) for s, w in zip(supervisors, wanted, strict=True)])
        _, _, terminated, truncated, _ = limited.step(action)
        assert not (terminated | truncated).any()
        np.testing.assert_allclose(limited.ctrl, expected, rtol=0, atol=1e-12)
        before = free.ctrl.copy()
        free.step(action)
        clamped_free += int((np.abs(free.ctrl - before) > max_step + 1e-9).any())
    assert sum(s.interventions["velocity"] + s.interventions["acceleration"] for s in supervisors) > 0
    assert clamped_free > 0  # the same actions without the limits move faster than the servo


def test_servo_limits_resume_exactly():
    env = rlrobot.make("so101-reach", 2, seed=1, servo_limits=True, num_threads=1)
    env.reset(seed=1)
    action = torch.ones(2, env.action_dim)
    for _ in range(3):
        env.step(action)
    state = env.get_state()
    after = [env.step(-action)[0]["state"] for _ in range(3)]
    env.set_state(state)
    again = [env.step(-action)[0]["state"] for _ in range(3)]
    for a, b in zip(after, again, strict=True):
        assert torch.equal(a, b)


def test_servo_limits_are_refused_outside_the_so101_tasks():
    from rlrobot.config import train_config

    with pytest.raises(ValueError, match=r"servo_limits applies to the tasks so101-lift, so101-long-horizon, .*; not to "
                                         r"task='mujoco-HalfCheetah-v5'"):
        train_config("ppo", task="mujoco-HalfCheetah-v5", control_mode="joint_torque", servo_limits=True).validate()
