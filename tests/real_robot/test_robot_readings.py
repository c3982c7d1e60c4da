"""The robot side checks every reading, owns its control rate, and sends every command, emergency holds included,
through the supervisor: a fake LeRobot SO-101 (fake_arm.py) behind the real LeRobot driver, executor and supervisor."""

import threading
import time

import numpy as np
import pytest

from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor, UnsafeCommand

from .fake_arm import START, commands_within_limits, fake_arm


@pytest.fixture(scope="module")
def bridge():
    b = TaskBridge("so101-reach", "ee_delta")
    yield b
    b.close()


class Answers:
    """A policy source that answers every observation with the same chunk."""

    def __init__(self, chunk, metadata=None):
        self.chunk, self.metadata = np.asarray(chunk, np.float32), metadata or {}

    def infer(self, obs):
        return self.chunk


HOLD_STILL = np.zeros((1, 5), np.float32)
SETTLED = 20  # ticks after which the zero action's IK has brought the arm from START to rest
MOVE = np.array([[0.6, 0.3, 0.0, 0.0, 0.0]], np.float32)  # the TCP keeps moving: the commands move


def run(bridge, fault, fault_from=5, steps=30, policy=None, safety=None, realtime=False, rate=25.0, **kw):
    arm, fake = fake_arm(rate, fault=fault, fault_from=fault_from, **kw)
    sup = SafetySupervisor(safety or SafetyConfig(), arm.joint_low, arm.joint_high, 1 / rate)
    executor = ChunkExecutor(arm, bridge, policy or Answers(HOLD_STILL), sup, ExecutorConfig(realtime=realtime))
    result = executor.run_episode(steps)
    executor.close()
    return result, sup, fake


def assert_held_disabled_latched(result, sup, fake, why):
    assert result.aborted and result.latched and sup.latch_kind == "reading_fault", result.abort_reason
    assert why in result.abort_reason, result.abort_reason
    assert fake.disabled_at is not None
    hold, before = fake.sent[-1][1], fake.sent[-2][1]
    assert np.isfinite(hold).all() and np.abs(hold - before).max() <= sup.max_step + 1e-6  # a brake, not a jump
    assert commands_within_limits(fake, sup.cfg.reading_margin) == (0, 0)


# ------------------------------------------------------------------------------------------ every reading checked
def test_a_finite_garbage_reading_is_a_fault_that_holds_and_latches(bridge):
    result, sup, fake = run(bridge, "garbage")
    assert_held_disabled_latched(result, sup, fake, "beyond its limits")
    assert result.steps == 4 and result.holds == 0  # the first bad reading ends it: nothing else reached the arm


def test_a_glitching_reading_is_a_fault_that_holds_and_latches(bridge):
    result, sup, fake = run(bridge, "glitch", fault_ticks=1)
    assert_held_disabled_latched(result, sup, fake, "more than the servo can move")


def test_a_reading_that_drives_itself_away_from_the_commands_is_a_fault(bridge):
    """The review's attack: shoulder_lift read moving 10.8 deg a tick (the servo's top speed at 25 Hz) while nothing
    commands it there; the policy and the IK would follow it to the joint limit."""
    result, sup, fake = run(bridge, "drift", fault_from=SETTLED, steps=SETTLED + 20)
    assert_held_disabled_latched(result, sup, fake, "joint 1 jumped")
    assert result.steps == SETTLED - 1  # caught at its first tick (read SETTLED: the reset took read 0)


@pytest.mark.parametrize("fault", ["nan", "inf"])
def test_a_non_finite_reading_latches_at_once_instead_of_holding_until_the_watchdog(bridge, fault):
    start = time.monotonic()
    result, sup, fake = run(bridge, fault, realtime=True)
    assert_held_disabled_latched(result, sup, fake, "non-finite joint positions")
    assert result.holds == 0 and time.monotonic() - start < 0.5  # before: ~1 s of holds, then the watchdog


def test_a_reading_without_a_joint_is_a_fault(bridge):
    result, sup, fake = run(bridge, "missing")
    assert_held_disabled_latched(result, sup, fake, "lacks ['wrist_roll.pos']")


def test_a_frozen_reading_while_the_commands_move_is_a_fault(bridge):
    result, sup, fake = run(bridge, "frozen", policy=Answers(MOVE), steps=60)
    assert_held_disabled_latched(result, sup, fake, "frozen reading")
    assert result.steps < 5 + 0.3 * 25 + 3


def test_a_frozen_reading_of_an_arm_commanded_to_stay_is_fine(bridge):
    result, sup, fake = run(bridge, "frozen", fault_from=SETTLED, steps=SETTLED + 20)  # at rest: the same counts
    assert not result.aborted and result.steps == SETTLED + 20 and fake.disabled_at is None


def test_a_stale_reading_is_a_fault():
    low, high = -np.ones(6), np.ones(6)
    sup = SafetySupervisor(SafetyConfig(), low, high, 0.04)
    sup.reset(np.zeros(6), timestamp=10.0)
    assert sup.check_reading(np.zeros(6), timestamp=10.04) is None
    reason = sup.check_reading(np.zeros(6), timestamp=10.04)
    assert reason is not None and "stale reading" in reason and sup.latch_kind == "reading_fault"


def test_an_unusable_first_reading_disables_without_sending_anything(bridge):
    result, sup, fake = run(bridge, "nan", fault_from=0)
    assert result.aborted and sup.latch_kind == "reading_fault" and "start of the episode" in result.abort_reason
    assert fake.sent == [] and fake.disabled_at is not None  # no good reading: nothing to hold at, disabled


# ------------------------------------------------------------------------------------------ one checked command path
def test_no_driver_sends_a_raw_reading_as_a_hold():
    arm, fake = fake_arm()
    arm.observe()
    with pytest.raises(ValueError, match="hold needs the supervisor's command"):
        arm.hold()
    with pytest.raises(ValueError, match="finite radians"):
        arm.hold(np.full(6, np.nan))
    assert fake.sent == []


def test_the_one_command_path_refuses_non_finite_and_out_of_limit_commands(bridge):
    arm, fake = fake_arm()
    sup = SafetySupervisor(SafetyConfig(), arm.joint_low, arm.joint_high, 0.04)
    executor = ChunkExecutor(arm, bridge, Answers(HOLD_STILL), sup, ExecutorConfig(realtime=False))
    try:
        for bad in (np.full(6, np.nan), START + np.array([0, 0, 0, 0, 0, np.inf]), START + 5.0, np.zeros(5)):
            with pytest.raises(UnsafeCommand):
                executor._send("hold", bad)
    finally:
        executor.close()
    assert fake.sent == []


def test_filter_refuses_and_brakes_on_anything_that_is_not_a_target():
    sup = SafetySupervisor(SafetyConfig(), -np.ones(6), np.ones(6), 0.04)
    sup.reset(np.zeros(6))
    sup.filter(np.full(6, 0.05))
    for junk in ("abc", None, [1, "x", 2, 3, 4, 5], {"a": 1}, np.zeros(3)):
        command = sup.filter(junk)
        assert np.isfinite(command).all() and command.shape == (6,)
    assert sup.interventions["nonfinite"] == 5


# ------------------------------------------------------------------------------------------ hardware-bounded limits
@pytest.mark.parametrize("field, value", [("max_joint_velocity", 1e300), ("max_joint_acceleration", 1e9),
                                          ("watchdog_s", 1e9), ("disable_after_s", 1e9), ("reading_margin", 3.0)])
def test_absurd_finite_limits_are_refused(field, value):
    kw = {field: value}
    if field == "watchdog_s":
        kw["disable_after_s"] = 1e9
    with pytest.raises(ValueError, match=f"safety.{field}=.* must be a finite number > 0 and <= "):
        SafetyConfig(**kw)


def test_an_absurd_workspace_box_is_refused():
    with pytest.raises(ValueError, match=r"safety.workspace_high=.*within \+-2 m"):
        SafetyConfig(workspace_low=(-1, -1, 0), workspace_high=(1e300, 1, 1))


# ------------------------------------------------------------------------------------------ the robot owns its rate
@pytest.mark.parametrize("rate", [0.05, 0.5, 250.0, 1000.0, float("nan")])
def test_a_control_rate_outside_1_to_200_hz_is_refused(rate):
    from rlrobot.real_robot.drivers.lerobot import LeRobotArm

    from .fake_arm import FakeSO101

    with pytest.raises(ValueError, match=r"control_rate_hz=.* must be a number in \[1, 200\] Hz"):
        LeRobotArm(robot=FakeSO101(), control_rate_hz=rate)


@pytest.mark.parametrize("policy_rate", [0.05, 1.0, 30.0, 1000.0])
def test_a_policy_at_another_rate_is_refused_not_adopted(bridge, policy_rate):
    arm, _ = fake_arm(25.0)
    sup = SafetySupervisor(SafetyConfig(), arm.joint_low, arm.joint_high, 0.04)
    source = Answers(HOLD_STILL, {"control_rate_hz": policy_rate, "chunk_size": 1})
    with pytest.raises(ValueError, match=f"trained at {policy_rate:g} Hz and the robot runs at 25 Hz: refused"):
        ChunkExecutor(arm, bridge, source, sup, ExecutorConfig(realtime=False))
    with pytest.raises(ValueError, match="needs absolute joint targets"):  # ee_delta: a delta per step of its rate
        ChunkExecutor(arm, bridge, source, sup, ExecutorConfig(realtime=False, policy_rate="resample"))


def test_an_absolute_target_policy_is_resampled_when_asked(bridge):
    joint_bridge = TaskBridge("so101-reach", "joint_pos")
    try:
        arm, fake = fake_arm(25.0)
        sup = SafetySupervisor(SafetyConfig(), arm.joint_low, arm.joint_high, 0.04)
        source = Answers(np.zeros((2, joint_bridge.action_dim)), {"control_rate_hz": 5.0, "chunk_size": 2})
        executor = ChunkExecutor(arm, joint_bridge, source, sup, ExecutorConfig(realtime=False, policy_rate="resample"))
        assert executor.resample_ratio == 5.0
        chunk = executor._resample(np.array([[0.0], [1.0]], np.float32))
        assert chunk.shape == (10, 1) and chunk[0, 0] == 0 and chunk[5, 0] == 1 and chunk[1, 0] == pytest.approx(0.2)
        result = executor.run_episode(10)
        executor.close()
        assert not result.aborted and result.steps == 10
        assert commands_within_limits(fake, sup.cfg.reading_margin) == (0, 0)
    finally:
        joint_bridge.close()


def test_a_watchdog_shorter_than_two_periods_is_refused(bridge):
    arm, _ = fake_arm(1.0)
    sup = SafetySupervisor(SafetyConfig(), arm.joint_low, arm.joint_high, 1.0)
    with pytest.raises(ValueError, match=r"safety.watchdog_s=0.25 must be at least two control periods \(2 s at 1 Hz\)"):
        ChunkExecutor(arm, bridge, Answers(HOLD_STILL), sup, ExecutorConfig())


def test_the_estop_disables_on_wall_time_not_at_the_next_tick(bridge):
    """At 1 Hz the loop sleeps ~1 s between ticks: the e-stop must not wait for the next one."""
    arm, fake = fake_arm(1.0)
    sup = SafetySupervisor(SafetyConfig(watchdog_s=2.5, disable_after_s=5.0), arm.joint_low, arm.joint_high, 1.0)
    executor = ChunkExecutor(arm, bridge, Answers(HOLD_STILL), sup, ExecutorConfig(realtime=True))
    pressed = []

    def press():
        time.sleep(1.3)  # mid-sleep, between ticks 1 and 2
        pressed.append(time.monotonic())
        sup.estop("operator")

    threading.Thread(target=press, daemon=True).start()
    result = executor.run_episode(10)
    executor.close()
    assert result.aborted and "e-stop" in result.abort_reason
    latency = fake.disabled_at - pressed[0]
    assert 0 <= latency < 0.05, latency
    assert fake.sent[-1][0] >= pressed[0] and len(fake.sent) == 3  # two ticks, then the emergency hold


def test_the_watchdog_disables_on_wall_time(bridge):
    class Silent:
        metadata = {}

        def infer(self, obs):
            time.sleep(3.0)  # never answers in time
            raise ConnectionError("lost")

    arm, fake = fake_arm(1.0)
    sup = SafetySupervisor(SafetyConfig(watchdog_s=2.0, disable_after_s=2.2), arm.joint_low, arm.joint_high, 1.0)
    executor = ChunkExecutor(arm, bridge, Silent(), sup, ExecutorConfig(realtime=True))
    start = time.monotonic()
    result = executor.run_episode(10)
    executor.close()
    assert result.aborted and "watchdog" in result.abort_reason and sup.latch_kind == "watchdog_disable"
    assert 2.2 <= fake.disabled_at - start < 2.2 + 0.1  # not at the tick at 3 s
