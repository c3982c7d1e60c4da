"""Fault-injection matrix of the robot side: every reading fault (garbage, NaN, inf, stale, frozen, glitching,
missing) x what the policy server announces as its rate (0.05, 1, 30, 1000 Hz; the robot runs at its own 25 Hz and
resamples, explicitly), with an operator's e-stop pressed during each run. The fake LeRobot SO-101 keeps every
command its servos got: none outside the limits, none non-finite, and every e-stop reaches disable within 50 ms of
wall time. ``pytest -s`` prints the table."""

import threading
import time

import numpy as np
import pytest

from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor

from .fake_arm import FAULTS, commands_within_limits, fake_arm

SERVER_RATES = (0.05, 1.0, 30.0, 1000.0)
ROBOT_RATE = 25.0
ESTOP_BUDGET_S = 0.05
FAULT_FROM = 4  # readings: the reset's, then three ticks of good ones


class AnnouncedRate:
    """A policy source whose metadata announces ``rate`` (absolute joint targets: resampled onto the robot's ticks)."""

    def __init__(self, rate: float, action_dim: int):
        self.metadata = {"control_rate_hz": rate, "chunk_size": 4}
        self.chunk = np.tile(np.linspace(-0.3, 0.3, action_dim, dtype=np.float32), (4, 1))

    def infer(self, obs):
        return self.chunk


def run_cell(bridge, server_rate: float, fault: str, press_after_s: float) -> dict:
    arm, fake = fake_arm(ROBOT_RATE, fault=fault, fault_from=FAULT_FROM)
    sup = SafetySupervisor(SafetyConfig(), arm.joint_low, arm.joint_high, 1 / ROBOT_RATE)
    executor = ChunkExecutor(arm, bridge, AnnouncedRate(server_rate, bridge.action_dim), sup,
                             ExecutorConfig(realtime=True, policy_rate="resample"))
    pressed: list[float] = []

    def press() -> None:
        time.sleep(press_after_s)
        pressed.append(time.monotonic())
        sup.estop("operator")

    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    result = executor.run_episode(int(0.6 * ROBOT_RATE))
    presser.join(2)
    executor.close()
    outside, nonfinite = commands_within_limits(fake, sup.cfg.reading_margin)
    first = sup.latch_kind
    latency = None
    if pressed and fake.disabled_at is not None and fake.disabled_at >= pressed[0]:
        latency = fake.disabled_at - pressed[0]
    return {"first": first, "latency": latency, "outside": outside, "nonfinite": nonfinite, "aborted": result.aborted,
            "disabled": fake.disabled_at is not None, "commands": len(fake.sent)}


def test_fault_matrix_no_command_outside_the_limits_nothing_non_finite_and_the_estop_within_50_ms():
    bridge = TaskBridge("so101-reach", "joint_pos")
    rng = np.random.default_rng(0)
    rows = {}
    try:
        for rate in SERVER_RATES:
            for fault in FAULTS:
                # pressed somewhere between a tick before the fault and two ticks into it (or mid-run without one)
                rows[rate, fault] = run_cell(bridge, rate, fault, float(rng.uniform(0.08, 0.2)))
    finally:
        bridge.close()
    print(f"\nfault matrix (robot at {ROBOT_RATE:g} Hz; server rate resampled): first latch / e-stop->disable ms "
          f"(- : a fault had disabled the arm first) / commands outside limits / non-finite sent")
    print("server Hz | " + " | ".join(f"{f:>16s}" for f in FAULTS))
    for rate in SERVER_RATES:
        cells = []
        for fault in FAULTS:
            c = rows[rate, fault]
            ms = "-" if c["latency"] is None else f"{c['latency'] * 1e3:.1f}"
            cells.append(f"{c['first'][:7]:>7s} {ms:>5s} {c['outside']}/{c['nonfinite']}")
        print(f"{rate:9g} | " + " | ".join(f"{x:>16s}" for x in cells))
    latencies = [c["latency"] for c in rows.values() if c["latency"] is not None]
    print(f"e-stop -> disable: {len(latencies)} measured, median {np.median(latencies) * 1e3:.1f} ms, "
          f"max {max(latencies) * 1e3:.1f} ms")
    for (rate, fault), c in rows.items():
        assert c["outside"] == 0 and c["nonfinite"] == 0, (rate, fault, c)
        assert c["aborted"] and c["disabled"], (rate, fault, c)
        assert c["first"] in (("estop",) if fault == "none" else ("estop", "reading_fault")), (rate, fault, c)
    assert all(latency < ESTOP_BUDGET_S for latency in latencies), latencies
    assert len(latencies) >= len(SERVER_RATES)  # at least the fault-free runs measured it


@pytest.mark.parametrize("rate", SERVER_RATES)
def test_a_server_rate_is_never_adopted(rate):
    bridge = TaskBridge("so101-reach", "joint_pos")
    try:
        arm, _ = fake_arm(ROBOT_RATE)
        sup = SafetySupervisor(SafetyConfig(), arm.joint_low, arm.joint_high, 1 / ROBOT_RATE)
        with pytest.raises(ValueError, match="refused"):
            ChunkExecutor(arm, bridge, AnnouncedRate(rate, bridge.action_dim), sup, ExecutorConfig())
        executor = ChunkExecutor(arm, bridge, AnnouncedRate(rate, bridge.action_dim), sup,
                                 ExecutorConfig(policy_rate="resample"))
        assert executor.dt == 1 / ROBOT_RATE and sup.max_step == pytest.approx(sup.cfg.max_joint_velocity / ROBOT_RATE)
        executor.close()
    finally:
        bridge.close()
