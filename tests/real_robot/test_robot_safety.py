"""Issue 14, items 6-11 and 13: the robot side. Limits, raw-action validation, faults, the e-stop latch at every
command write, the latched watchdog disable, the watchdog fed only by used answers, clamps that keep every step
within the velocity and acceleration limits, bounded logs."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.drivers.twin import TwinRobot
from rlrobot.real_robot.executor import ChunkExecutor, ControlLoopFault, EpisodeResult, ExecutorConfig
from rlrobot.real_robot.safety import SafetyConfig, SafetyLatched, SafetySupervisor
from rlrobot.real_robot.stats import RunningStats

from .conftest import TOKEN


@pytest.fixture(scope="module")
def bridge():
    b = TaskBridge("so101-reach", "ee_delta")
    yield b
    b.close()


@pytest.fixture
def twin():
    t = TwinRobot("so101-reach", seed=3)
    t.connect()
    yield t
    t.disconnect()


def stack(twin, bridge, source, safety=None, realtime=False):
    sup = SafetySupervisor(safety or SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz)
    return sup, ChunkExecutor(twin, bridge, source, sup, ExecutorConfig(realtime=realtime))


def kinds(twin, after=-1.0):
    return [kind for t, kind, _ in twin.commands if t > after]


# ---------------------------------------------------------------------------------------------- item 6
@pytest.mark.parametrize("field", ["max_joint_velocity", "max_joint_acceleration", "watchdog_s", "disable_after_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0])
def test_every_limit_must_be_finite_and_positive(field, value):
    with pytest.raises(ValueError, match=f"safety.{field}=.* must be a finite number > 0"):
        SafetyConfig(**{field: value})


def test_workspace_box_must_be_finite():
    with pytest.raises(ValueError, match="safety.workspace_low=.*3 finite numbers"):
        SafetyConfig(workspace_low=(float("nan"), 0, 0), workspace_high=(1, 1, 1))
    with pytest.raises(ValueError, match="safety.workspace_high=.*3 finite numbers"):
        SafetyConfig(workspace_low=(0, 0, 0), workspace_high=(1, float("inf"), 1))


def test_deploy_refuses_nan_limits_in_one_line_before_any_compute():
    env = {**os.environ, "MUJOCO_GL": "egl", "COLUMNS": "300"}  # tyro boxes the error; wide enough not to wrap it
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "rlrobot", "deploy", "--robot", "twin", "--checkpoint", "/nonexistent",
                        "--safety.max-joint-velocity", "nan", "--safety.max-joint-acceleration", "nan"],
                       capture_output=True, text=True, env=env, timeout=120)
    out = (p.stdout + p.stderr).strip()
    assert p.returncode != 0 and "safety.max_joint_velocity=nan must be a finite number > 0" in out, out
    assert "Traceback" not in out and "/nonexistent" not in out  # refused before the checkpoint is even looked at
    assert time.monotonic() - start < 60


# ---------------------------------------------------------------------------------------------- item 7
class Answers:
    """A policy source answering from a list (then repeating the last)."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), 0

    def infer(self, obs):
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


@pytest.mark.parametrize("answer, kind", [
    (np.full((1, 5), np.inf, np.float32), "nonfinite"),
    (np.array([[1e300, 0, 0, 0, 0]]), "nonfinite"),  # finite in float64, inf after the cast
    (np.zeros((1, 4), np.float32), "bad_action"),  # too short: crashed deploy (IndexError) without hold / disable
    (np.zeros((1, 7), np.float32), "bad_action"),  # too long: silently truncated
    (np.float32(0.3), "bad_action"),
    (np.zeros((2, 3, 5), np.float32), "bad_action"),
    ([[0.1, "x", 0, 0, 0]], "bad_action"),
])
def test_raw_policy_actions_are_validated_before_any_mapping(twin, bridge, answer, kind):
    sup, executor = stack(twin, bridge, Answers(answer))
    result = executor.run_episode(10)
    executor.close()
    assert kinds(twin) == ["hold"] * 10  # nothing the policy said reached the arm
    assert result.refused_chunks == 10 and result.interventions[kind] == 10 and result.fresh_chunks == 0


def test_an_exception_in_the_control_loop_holds_disables_latches_then_raises(twin, bridge):
    sup, executor = stack(twin, bridge, Answers(np.zeros((1, 5), np.float32)))
    calls = []
    original = bridge.joint_targets

    def broken(action, reading, last):
        calls.append(1)
        if len(calls) == 4:
            raise IndexError("index 5 is out of bounds")
        return original(action, reading, last)

    bridge.joint_targets = broken
    try:
        with pytest.raises(ControlLoopFault, match="IndexError: index 5 is out of bounds; the arm was held and disabled"):
            executor.run_episode(10)
    finally:
        del bridge.joint_targets
        executor.close()
    assert kinds(twin)[-2:] == ["hold", "disable"] and twin.disabled and kinds(twin).count("act") == 3
    assert sup.estopped and "control-loop fault" in sup.estop_reason


# ---------------------------------------------------------------------------------------------- item 8
def test_estop_is_checked_right_before_every_command_write(twin, bridge):
    """The e-stop arrives while the tick waits for its answer (inside infer), or between the supervisor's filter
    and the write: no command from the policy is written after it."""
    action = np.zeros((1, 5), np.float32)
    pressed = []

    class PressesDuringInference:
        calls = 0

        def infer(self, obs):
            self.calls += 1
            if self.calls == 5:
                pressed.append(time.monotonic())
                sup.estop("operator, mid-inference")
            return action

    sup, executor = stack(twin, bridge, PressesDuringInference())
    result = executor.run_episode(20)
    executor.close()
    assert result.aborted and "e-stop" in result.abort_reason
    assert kinds(twin, after=pressed[0]) == ["hold", "disable"]  # the emergency stop, nothing else
    with pytest.raises(SafetyLatched):
        sup.filter(np.zeros(6))
    with pytest.raises(SafetyLatched):
        sup.stop()

    twin.reset_episode()
    sup2, executor = stack(twin, bridge, Answers(action))
    original, filtered = sup2.filter, []

    def filter_then_estop(targets):
        command = original(targets)
        filtered.append(1)
        if len(filtered) == 4:
            sup2.estop("operator, between filter and write")
        return command

    sup2.filter = filter_then_estop
    start = time.monotonic()
    twin.commands.clear()
    result = executor.run_episode(20)
    executor.close()
    assert result.aborted and "between filter and write" in result.abort_reason
    assert kinds(twin, after=start) == ["act"] * 3 + ["hold", "disable"]


# ---------------------------------------------------------------------------------------------- items 9, 10
class Failing:
    def infer(self, obs):
        raise ConnectionError("policy server lost")


def test_watchdog_disable_latches_until_the_operator_clears_it(twin, bridge):
    safety = SafetyConfig(watchdog_s=0.1, disable_after_s=0.3)
    sup, executor = stack(twin, bridge, Failing(), safety, realtime=True)
    result = executor.run_episode(50)
    assert result.aborted and result.latched and "watchdog" in result.abort_reason and twin.disabled
    twin.reset_episode()  # the twin could re-enable itself; a LeRobot arm cannot: the latch must not rely on it
    n = len(twin.commands)
    again = executor.run_episode(50)
    assert again.aborted and again.latched and again.steps == 0 and "latched: watchdog" in again.abort_reason
    assert len(twin.commands) == n  # nothing was commanded
    sup.clear_estop()  # the operator's deliberate act
    executor.worker.source = Answers(np.zeros((1, 5), np.float32))
    ok = executor.run_episode(5)
    executor.close()
    assert not ok.aborted and ok.steps == 5 and not ok.latched


@pytest.mark.parametrize("delay", [0.1, 0.5])
def test_late_answers_do_not_feed_the_watchdog(twin, bridge, delay):
    """Answers that arrive after their action's time are dropped and do not count as fresh: the robot holds, then
    disables, and the episode reports it (before: held on every tick, never disabled, aborted: false)."""

    class Slow:
        def infer(self, obs):
            time.sleep(delay)
            return np.zeros((1, 5), np.float32)

    safety = SafetyConfig(watchdog_s=0.2, disable_after_s=0.6)
    sup, executor = stack(twin, bridge, Slow(), safety, realtime=True)
    start = time.monotonic()
    result = executor.run_episode(60)
    executor.close()
    assert result.aborted and "watchdog" in result.abort_reason and result.latched
    assert "act" not in kinds(twin) and result.fresh_chunks == 0
    assert delay > 0.3 or result.late_chunks >= 2
    assert time.monotonic() - start < 0.6 + 0.5


def test_deploy_reports_the_latch_and_stops(tmp_path, server):
    """End to end: a man in the middle swallows every answer after the 4th; deploy holds, disables, latches, runs
    no further episode and says so in its summary."""
    from . import wire

    # the first connection gets its challenge, hello and 3 answers; later ones their challenge only
    mitm = wire.Mitm(server.url, lambda conn, i, f: [f] if (conn == 0 and i < 5) or i == 0 else [])
    try:
        out = tmp_path / "s.json"
        p = subprocess.run([sys.executable, "-m", "rlrobot", "deploy", "--robot", "twin", "--server", mitm.url,
                            "--token", TOKEN, "--episodes", "3", "--timeout-s", "0.2", "--safety.watchdog-s", "0.1",
                            "--safety.disable-after-s", "0.3", "--json-out", str(out)],
                           capture_output=True, text=True, env={**os.environ, "MUJOCO_GL": "egl"}, timeout=120)
    finally:
        mitm.close()
    assert p.returncode == 0, p.stderr
    summary = json.loads(out.read_text())
    assert summary["episodes"] == 1 and summary["episodes_requested"] == 3 and summary["aborted"] == 1
    assert summary["latched"].startswith("watchdog") and "LATCHED: watchdog" in p.stdout


# ---------------------------------------------------------------------------------------------- item 11
def emitted_steps_ok(start, commands, sup):
    q = np.vstack([start, start, *commands])  # at rest at the measured position
    steps = np.diff(q, axis=0)
    eps = 1e-9
    return (np.abs(steps) <= sup.max_step + eps).all() and (np.abs(np.diff(steps, axis=0)) <= sup.max_change + eps).all()


def test_measured_position_outside_the_limits_does_not_jump_to_the_limit():
    low, high = -np.ones(6), np.ones(6)
    sup = SafetySupervisor(SafetyConfig(max_joint_velocity=3.0, max_joint_acceleration=20.0), low, high, 0.04)
    start = np.array([1.15, -1.15, 0, 0, 0, 0])  # a reading 0.15 rad outside the limits (within the reading margin)
    sup.reset(start)
    commands = [sup.filter(np.zeros(6)) for _ in range(40)]
    assert emitted_steps_ok(start, commands, sup)
    assert abs(commands[0][0] - 1.15) <= sup.max_change + 1e-12  # the first step starts from the reading
    assert np.all(np.abs(commands[-1]) <= 1.0)  # and the arm is back inside the limits, at the limits' rates


def test_every_emitted_step_respects_velocity_and_acceleration_through_stops_clips_and_refusals():
    rng = np.random.default_rng(0)
    low, high = -np.ones(6), np.ones(6)
    fk = lambda q: np.array([q[0], q[1], 0.1])  # noqa: E731 (toy kinematics)
    for trial in range(20):
        sup = SafetySupervisor(SafetyConfig(max_joint_velocity=3.0, max_joint_acceleration=20.0,
                                            workspace_low=(-0.6, -2, 0), workspace_high=(0.6, 2, 1)), low, high, 0.04, fk)
        start = rng.uniform(-1.2, 1.2, 6)
        start[0] = rng.uniform(-0.5, 0.5)  # inside the box at the start
        sup.reset(start)
        commands = []
        for _ in range(150):
            r = rng.random()
            if r < 0.1:
                commands.append(sup.stop())  # a hold
            elif r < 0.2:
                commands.append(sup.filter(np.full(6, np.nan)))  # a refusal
            else:
                commands.append(sup.filter(rng.choice([-5.0, 5.0], 6) * rng.random()))  # jumps, clips, box exits
        assert emitted_steps_ok(start, commands, sup), trial
        assert sup.interventions["workspace"] > 0 and sup.interventions["nonfinite"] > 0, trial


def test_arm_starting_inside_never_leaves_the_joint_limits():
    rng = np.random.default_rng(1)
    low, high = -np.ones(6), np.ones(6)
    sup = SafetySupervisor(SafetyConfig(max_joint_velocity=3.0, max_joint_acceleration=20.0), low, high, 0.04)
    sup.reset(np.zeros(6))
    q = np.array([sup.filter(rng.choice([-5.0, 5.0], 6)) if k % 7 else sup.stop() for k in range(500)])
    assert np.all(q >= low - 1e-12) and np.all(q <= high + 1e-12)


# ---------------------------------------------------------------------------------------------- item 13
def test_per_request_logs_are_bounded():
    stats = RunningStats(window=100, scale=1e3)
    for k in range(10_000):
        stats.append(k * 1e-6)
    s = stats.summary()
    assert len(stats.recent) == 100 and s["count"] == 10_000 and s["max_ms"] == pytest.approx(9.999)
    # no per-step lists in an episode's result: summaries only
    for f in dataclasses.fields(EpisodeResult):
        assert "list" not in str(f.type), f.name
    twin = TwinRobot("so101-reach", seed=0, command_log=50)
    twin.connect()
    for _ in range(200):
        twin.hold(twin.env.qpos[0, :6].copy())
    assert len(twin.commands) == 50
    twin.disconnect()


def test_client_and_worker_round_trips_are_bounded(server):
    from rlrobot.real_robot.client import PolicyClient

    client = PolicyClient(server.url, token=TOKEN)
    client.connect()
    client.round_trips = RunningStats(window=10, scale=1e3)
    for _ in range(30):
        client.infer({"state": np.zeros((1, 27), np.float32)})
    assert client.round_trips.count == 30 and len(client.round_trips.recent) == 10
    latency = client.stats()["latency"]
    assert latency["count"] >= 30 and latency["window"] <= 4096
    client.close()


def test_server_latency_window_is_fixed():
    from rlrobot.real_robot.server import PolicyServer

    class P:
        metadata = {}
        latencies = []

    server = PolicyServer(P(), b"k")
    assert isinstance(P.latencies, list)  # the class attribute is untouched; the instance one is bounded
    for _ in range(5000):
        server.policy.latencies.append(0.001)
    assert len(server.policy.latencies.recent) == 4096
    server.decoder.shutdown()
