"""MuJoCo Warp backend vs the native backend: same task code, same initial states, matching trajectories.

Runs on Warp's CPU device here and in CI (mujoco-warp is in the README's test install); on a GPU machine the same
tests run with ``RLROBOT_TEST_DEVICE=cuda``.
"""

import os
import sys

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.tasks.so101 import TASKS

try:
    import mujoco_warp  # noqa: F401

    MISSING = None
except ImportError:
    MISSING = "mujoco-warp is not installed (pip install 'rlrobot[warp]')"

pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
DEVICE = os.environ.get("RLROBOT_TEST_DEVICE", "cpu")


def _pair(task: str, num_envs: int, **opts):
    native = rlrobot.make(task, num_envs, seed=0, device=DEVICE, **opts)
    warp = rlrobot.make(task, num_envs, seed=0, device=DEVICE, backend="mjwarp", **opts)
    return native, warp


def test_same_task_code_and_initial_states():
    native, warp = _pair("so101-push", 8)
    assert isinstance(warp, TASKS["so101-push"]) and warp.backend == "mjwarp"
    obs_n, _ = native.reset(seed=3)
    obs_w, _ = warp.reset(seed=3)
    np.testing.assert_array_equal(native.model_index, warp.model_index)  # same randomised physics per env
    assert torch.allclose(obs_n["state"], obs_w["state"], atol=1e-5)  # float32 rounding only
    # each world got its own model-bank row of cube friction and mass
    cube_geom, cube_body = warp.model.geom("cube").id, warp.model.body("cube").id
    friction = warp._model_views["geom_friction"][:, cube_geom, 0].cpu().numpy()
    mass = warp._model_views["body_mass"][:, cube_body].cpu().numpy()
    expected_friction = [warp.models[i].geom_friction[cube_geom, 0] for i in warp.model_index]
    expected_mass = [warp.models[i].body_mass[cube_body] for i in warp.model_index]
    np.testing.assert_allclose(friction, expected_friction, rtol=1e-6)
    np.testing.assert_allclose(mass, expected_mass, rtol=1e-6)
    assert len(set(np.round(friction, 5))) > 1


@pytest.mark.slow
def test_reach_trajectories_match_native():
    """Contact-free arm motion through the IK controller: float32 Warp tracks float64 MuJoCo to ~1e-7 m."""
    native, warp = _pair("so101-reach", 4)
    native.reset(seed=1)
    warp.reset(seed=1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        action = torch.rand(4, 5, generator=gen) * 2 - 1
        _, r_n, *_ = native.step(action)
        _, r_w, *_ = warp.step(action)
        assert np.abs(native.tcp - warp.tcp).max() < 1e-5
        assert torch.allclose(r_n, r_w, atol=1e-4)
    np.testing.assert_allclose(native.jacp, warp.jacp, atol=1e-5)


@pytest.mark.slow
def test_push_from_native_state_with_contacts():
    """Start the Warp worlds from a native mid-episode state (get_state/set_state interchange), then drive both with
    the same actions through the pusher-cube contact: trajectories stay within millimetres."""
    native, warp = _pair("so101-push", 8, max_episode_steps=200)
    native.reset(seed=3)
    warp.reset(seed=9)  # a different episode, overwritten by the native state below
    for _ in range(5):
        native.step(native.expert_action())
    warp.set_state(native.get_state())
    assert torch.allclose(native.observe()["state"], warp.observe()["state"], atol=1e-5)
    max_tcp, max_cube, moved = 0.0, 0.0, 0.0
    for _ in range(50):
        action = native.expert_action()
        _, _, term_n, _, info_n = native.step(action)
        _, _, term_w, _, info_w = warp.step(action)
        max_tcp = max(max_tcp, np.abs(native.tcp - warp.tcp).max())
        max_cube = max(max_cube, np.abs(native.cube_pos - warp.cube_pos).max())
        moved = max(moved, np.linalg.norm(native.cube_pos - native.cube_start, axis=1).min())
        assert torch.equal(term_n, term_w)
    assert moved > 0.02, "the expert pushed every cube: the comparison went through contact"
    assert max_tcp < 2e-3, max_tcp
    assert max_cube < 1e-2, max_cube
    assert torch.equal(info_n["success"], info_w["success"])


@pytest.mark.slow
def test_lift_closed_loop_outcomes_match():
    """Each backend runs the scripted grasp-and-lift expert on its own state: the same episodes succeed."""
    native, warp = _pair("so101-lift", 8, max_episode_steps=200)
    native.reset(seed=3)
    warp.reset(seed=3)
    for _ in range(50):
        _, _, _, _, info_n = native.step(native.expert_action())
        _, _, _, _, info_w = warp.step(warp.expert_action())
    assert info_n["success"].float().mean() >= 0.75
    assert torch.equal(info_n["success"], info_w["success"])
    assert (warp.contacts.all(axis=1) == native.contacts.all(axis=1)).all()  # jaw-cube contact sensors on Warp


def test_warp_state_loads_into_native():
    native, warp = _pair("so101-lift", 4)
    warp.reset(seed=4)
    for _ in range(3):
        warp.step(warp.expert_action())
    native.set_state(warp.get_state())
    assert torch.allclose(native.observe()["state"], warp.observe()["state"], atol=1e-5)


def test_autoreset_and_images():
    env = rlrobot.make("so101-reach", 2, seed=0, backend="mjwarp", max_episode_steps=3, obs_mode="state+rgb",
                       image_size=32)
    obs, _ = env.reset(seed=0)
    first = obs["state"].clone()
    for _ in range(3):
        obs, _, _, truncated, info = env.step(torch.zeros(2, 5))
    assert truncated.all() and "episode" in info
    assert not torch.allclose(info["final_obs"]["state"], obs["state"])
    assert obs["image_front"].shape == (2, 3, 32, 32) and obs["image_front"].dtype == torch.uint8
    assert obs["image_front"].float().std() > 0
    assert not torch.allclose(first, obs["state"])  # a new episode from the seeded stream, not a replay
    frame = env.render(0)
    assert frame.ndim == 3 and frame.std() > 0


def test_contact_capacity_overflow_is_an_error():
    env = rlrobot.make("so101-push", 2, seed=0, backend="mjwarp", nconmax=1)
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="nconmax"):
        env.step(torch.zeros(2, 5))  # the cube resting on the table alone makes 4 contacts


def test_backend_errors(monkeypatch):
    with pytest.raises(ValueError, match="runs on backend 'gymnasium'"):
        rlrobot.make("gym:Pendulum-v1", backend="mjwarp")
    monkeypatch.setitem(sys.modules, "mujoco_warp", None)
    with pytest.raises(ImportError, match=r"rlrobot\[warp\]"):
        rlrobot.make("so101-reach", backend="mjwarp")


@pytest.mark.slow
def test_train_cli_on_mjwarp(tmp_path):
    """The runner path (rollouts, update, checkpoint, eval env) on the Warp backend."""
    from rlrobot.cli import main

    out = tmp_path / "run"
    main(["train", "--task", "so101-reach", "--backend", "mjwarp", "--num-envs", "8", "--ppo.rollout-steps", "4",
          "--total-steps", "64", "--eval-episodes", "2", "--eval-envs", "2", "--logger", "none", "--out", str(out)])
    assert (out / "summary.json").exists()


@pytest.mark.slow
def test_state_restore_is_exact():
    """What ``--resume`` relies on: after set_state(get_state()) the same actions give bit-identical observations,
    through pusher-cube contacts (the solver warm start is part of the saved state)."""
    env = rlrobot.make("so101-push", 4, seed=0, device=DEVICE, backend="mjwarp")
    env.reset(seed=2)
    for _ in range(30):
        env.step(env.expert_action())
    saved = env.get_state()
    actions, first = [], []
    for _ in range(8):
        actions.append(env.expert_action())
        first.append(env.step(actions[-1])[0]["state"])
    env.set_state(saved)
    again = [env.step(a)[0]["state"] for a in actions]
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
