"""Safety supervisor: every clamp, the workspace box, NaN rejection, watchdog, e-stop (code and signal)."""

import os
import signal

import numpy as np
import pytest

from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor

LOW, HIGH = -np.ones(3), np.ones(3)


def supervisor(**kw):
    sup = SafetySupervisor(SafetyConfig(**kw), LOW, HIGH, dt=0.1)
    sup.reset(np.zeros(3))
    return sup


def test_joint_limits_and_velocity_clamp():
    sup = supervisor(max_joint_velocity=1.0, max_joint_acceleration=39.0)
    out = sup.filter(np.array([5.0, -0.05, 0.0]))
    assert np.allclose(out, [0.1, -0.05, 0.0])  # limit 1.0 then at most 1 rad/s x 0.1 s per step
    assert sup.interventions["joint_limit"] == 1 and sup.interventions["velocity"] == 1
    for _ in range(20):
        out = sup.filter(np.array([5.0, 0.0, 0.0]))
    assert out[0] == pytest.approx(1.0)  # reaches the limit, never beyond


def test_the_supervisor_records_by_how_much_it_moved_each_changed_command():
    sup = supervisor(max_joint_velocity=1.0, max_joint_acceleration=39.0)
    sup.filter(np.array([0.05, 0.0, 0.0]))  # within every limit: unchanged, not recorded
    assert sup.changed == {"steps": 0, "sum_rad": 0.0, "max_rad": 0.0}
    sup.filter(np.array([0.5, 0.0, 0.0]))  # 0.45 rad away, 0.1 rad allowed per step: the command lands at 0.15
    sup.filter(np.array([5.0, 0.0, 0.0]))  # 5 rad asked: 4.75 rad from the command at 0.25
    assert sup.changed["steps"] == 2
    assert sup.changed["max_rad"] == pytest.approx(4.75) and sup.changed["sum_rad"] == pytest.approx(0.35 + 4.75)


def test_acceleration_clamp():
    sup = supervisor(max_joint_velocity=4.7, max_joint_acceleration=2.0)  # 0.02 rad of step change per step
    steps = [sup.filter(np.array([1.0, 0.0, 0.0]))[0] for _ in range(3)]
    assert np.allclose(np.diff([0.0, *steps]), [0.02, 0.04, 0.06])
    assert sup.interventions["acceleration"] == 3


def test_nan_is_rejected_and_last_safe_target_kept():
    sup = supervisor()
    first = sup.filter(np.array([0.1, 0.0, 0.0]))
    out = sup.filter(np.array([np.nan, 0.0, 0.0]))
    assert np.array_equal(out, first) and sup.interventions["nonfinite"] == 1
    out = sup.filter(np.array([np.inf, 0.0, 0.0]))
    assert np.array_equal(out, first) and sup.interventions["nonfinite"] == 2


def test_workspace_box_refuses_targets_whose_tcp_leaves_it():
    fk = lambda q: np.array([q[0], 0.0, 0.1])  # noqa: E731 (toy kinematics: x follows joint 0)
    sup = SafetySupervisor(SafetyConfig(workspace_low=(-0.3, -1, 0), workspace_high=(0.3, 1, 1),
                                        max_joint_velocity=4.7, max_joint_acceleration=39.0), LOW, HIGH, 0.1, fk)
    sup.reset(np.zeros(3))
    assert sup.filter(np.array([0.1, 0, 0]))[0] == pytest.approx(0.1)
    x = [sup.filter(np.array([0.5, 0, 0]))[0] for _ in range(10)]  # brakes before the box instead of crossing it
    assert max(x) <= 0.3 and x[-1] == pytest.approx(0.3, abs=0.01)
    assert sup.interventions["workspace"] >= 1
    with pytest.raises(ValueError, match="forward kinematics"):
        SafetySupervisor(SafetyConfig(workspace_low=(0, 0, 0), workspace_high=(1, 1, 1)), LOW, HIGH, 0.1)


def test_watchdog_and_estop():
    sup = supervisor(watchdog_s=0.2, disable_after_s=0.5)
    assert [sup.watchdog(t) for t in (0.1, 0.3, 0.6)] == ["ok", "hold", "disable"]
    sup.estop("test")
    assert sup.estopped and sup.interventions["estop"] == 1
    sup.reset(np.zeros(3))
    assert sup.estopped  # latched across episodes
    sup.clear_estop()
    assert not sup.estopped
    sup.install_signal_estop(signal.SIGUSR1)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert sup.estopped and "SIGUSR1" in sup.estop_reason
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_key_estop():
    import io

    sup = supervisor()
    sup.start_key_estop(stream=io.StringIO("status\ne\n")).join(timeout=2)
    assert sup.estopped


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="max_joint_velocity"):
        SafetyConfig(max_joint_velocity=0)
    with pytest.raises(ValueError, match="together"):
        SafetyConfig(workspace_low=(0, 0, 0))
    with pytest.raises(ValueError, match="watchdog_s"):
        SafetyConfig(watchdog_s=2.0, disable_after_s=1.0)
