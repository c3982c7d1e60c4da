"""Policy server and client in real processes on 127.0.0.1: end to end on the twin, and the fault cases."""

import threading
import time

import numpy as np
import pytest
from websockets.sync.client import connect

from rlrobot.real_robot import protocol
from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.client import PolicyClient
from rlrobot.real_robot.drivers.twin import TwinRobot
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor

from .conftest import TOKEN, ServerProcess, reach_expert_checkpoint

STATE = {"state": np.zeros((1, 27), np.float32)}


def deploy_stack(url, safety=None, realtime=False, seed=100):
    client = PolicyClient(url, token=TOKEN, timeout_s=1.0)
    meta = client.connect()
    twin = TwinRobot(meta["task"], seed=seed)
    twin.connect()
    bridge = TaskBridge(meta["task"], meta["control_mode"])
    sup = SafetySupervisor(safety or SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz,
                           bridge.tcp_position)
    return client, twin, ChunkExecutor(twin, bridge, client, sup, ExecutorConfig(realtime=realtime))


def test_served_policy_drives_the_twin_like_the_simulator(server):
    client, twin, executor = deploy_stack(server.url)
    assert client.metadata["task"] == "so101-reach" and client.metadata["chunk_size"] == 1
    results = []
    for k in range(8):
        if k:
            twin.reset_episode()
        results.append(executor.run_episode(50))
    executor.close()
    assert all(not r.aborted and r.holds == 0 for r in results)
    assert np.mean([r.success for r in results]) >= 0.85  # the expert's simulated success is ~0.98
    assert len(client.round_trips) == 8 * 50
    stats = client.stats()
    assert stats["latency"]["count"] == 8 * 50
    client.close()


def test_server_killed_mid_episode_robot_holds_then_aborts_and_client_reconnects(expert_checkpoint):
    srv = ServerProcess(expert_checkpoint)
    safety = SafetyConfig(watchdog_s=0.2, disable_after_s=0.6)
    client, twin, executor = deploy_stack(srv.url, safety, realtime=True)
    killed_at = []

    def kill_later():
        time.sleep(0.5)  # ~12 control periods into the episode
        killed_at.append(time.monotonic())
        srv.kill()

    threading.Thread(target=kill_later, daemon=True).start()
    result = executor.run_episode(100)
    assert result.aborted and "watchdog" in result.abort_reason
    dt = 1 / twin.control_rate_hz
    acts = [t for t, kind, _ in twin.commands if kind == "act"]
    holds = [t for t, kind, _ in twin.commands if kind == "hold"]
    assert acts and max(acts) < killed_at[0] + dt + 0.05  # nothing from the policy after the kill (one period)
    first_hold = min(t for t in holds if t > killed_at[0])
    assert first_hold - killed_at[0] <= dt + safety.watchdog_s
    assert twin.disabled and twin.commands[-1][1] == "disable"
    # the server comes back on the same port: the client reconnects and the next episode runs normally
    srv2 = ServerProcess(expert_checkpoint, port=srv.port)
    try:
        twin.reset_episode()
        executor.cfg.realtime = False
        deadline = time.time() + 10
        result = executor.run_episode(50)
        while result.aborted and time.time() < deadline:  # at most a reconnect interval of holds
            twin.reset_episode()
            result = executor.run_episode(50)
        assert not result.aborted and result.fresh_chunks > 0 and client.reconnects >= 1
    finally:
        executor.close()
        client.close()
        srv2.stop()


def test_nan_and_wild_policies_never_reach_the_robot_unclamped(tmp_path):
    ckpt = reach_expert_checkpoint(tmp_path / "nan", nan=True)
    srv = ServerProcess(ckpt)
    try:
        client, twin, executor = deploy_stack(srv.url)
        result = executor.run_episode(20)
        executor.close()
        commanded = np.array([q for _, kind, q in twin.commands if kind == "act"])
        assert np.isfinite(commanded).all()
        assert result.interventions.get("nonfinite", 0) == 20  # every step refused and the last safe target held
        assert np.allclose(commanded, commanded[0])
    finally:
        srv.stop()
    # a joint-position policy that jumps between the extremes every step: velocity and acceleration clamps
    twin = TwinRobot("so101-reach", seed=0)
    twin.connect()
    bridge = TaskBridge("so101-reach", "joint_pos")
    sup = SafetySupervisor(SafetyConfig(max_joint_velocity=2.0, max_joint_acceleration=40.0), twin.joint_low,
                           twin.joint_high, 0.04, bridge.tcp_position)

    class Wild:
        k = 0

        def infer(self, obs):
            self.k += 1
            return np.full((1, 6), 5.0 if self.k % 2 else -5.0, np.float32)

    executor = ChunkExecutor(twin, bridge, Wild(), sup, ExecutorConfig(realtime=False))
    executor.run_episode(30)
    executor.close()
    commanded = np.array([twin.observe()["qpos"]] + [q for _, kind, q in twin.commands if kind == "act"])
    steps = np.diff(commanded[1:], axis=0)
    assert np.all(np.abs(steps) <= 2.0 * 0.04 + 1e-9)
    assert np.all(np.abs(np.diff(steps, axis=0)) <= 40.0 * 0.04**2 + 1e-9)
    assert np.all(commanded[1:] >= twin.joint_low - 1e-9) and np.all(commanded[1:] <= twin.joint_high + 1e-9)
    assert sup.interventions["velocity"] > 0 and sup.interventions["acceleration"] > 0


def raw_exchange(url, frame):
    with connect(url, max_size=None, compression=None) as ws:
        ws.send(frame)
        return protocol.decode(ws.recv(timeout=5), TOKEN.encode(), max_frame_bytes=1 << 30)


def test_bad_frames_are_rejected_while_a_good_client_is_served(server):
    good = PolicyClient(server.url, token=TOKEN)
    good.connect()
    before = good.infer(STATE)
    hello = protocol.message("hello", 1)
    cases = {
        "malformed": protocol._tag(TOKEN.encode(), b"\xc1 not msgpack") + b"\xc1 not msgpack",  # signed garbage
        "unauthenticated": protocol.encode(hello, b"wrong-token"),
        "version": protocol.encode({**hello, "version": 99}, TOKEN.encode()),
        # just over the 8 MiB frame limit: read, refused with an error frame
        "oversized": protocol.encode(protocol.message("infer", 2, obs={"state": np.zeros(2_099_652, np.float32)}),
                                     TOKEN.encode()),
    }
    for code, frame in cases.items():
        reply = raw_exchange(server.url, frame)
        assert reply["type"] == "error" and reply["code"] == code, (code, reply)
        assert np.array_equal(good.infer(STATE), before)  # the well-behaved client keeps being served
    # far over the limit: the websocket layer closes that connection (1009) before buffering it; the server lives on
    from websockets.exceptions import ConnectionClosedError

    with pytest.raises(ConnectionClosedError, match="1009"):
        raw_exchange(server.url, bytes(32) + bytes(20_000_000))
    assert np.array_equal(good.infer(STATE), before)
    # a request before hello, a replayed seq and a wrong observation shape, on one connection
    with connect(server.url, compression=None) as ws:
        key = TOKEN.encode()
        ws.send(protocol.encode(protocol.message("infer", 1, obs=STATE), key))
        assert protocol.decode(ws.recv(timeout=5), key)["code"] == "bad_request"
        ws.send(protocol.encode(protocol.message("hello", 2), key))
        assert protocol.decode(ws.recv(timeout=5), key)["type"] == "hello"
        ws.send(protocol.encode(protocol.message("infer", 2, obs=STATE), key))
        assert "does not increase" in protocol.decode(ws.recv(timeout=5), key)["message"]
        ws.send(protocol.encode(protocol.message("infer", 3, obs={"state": np.zeros(5, np.float32)}), key))
        assert "shape" in protocol.decode(ws.recv(timeout=5), key)["message"]
    assert server.proc.poll() is None
    assert good.stats()["errors"]["bad_request"] >= 3
    good.close()


def test_serve_refuses_insecure_off_loopback_and_missing_token(expert_checkpoint):
    import subprocess
    import sys

    for extra, message in ((["--insecure", "--host", "0.0.0.0"], "loopback"), ([], "token is required")):
        p = subprocess.run([sys.executable, "-m", "rlrobot", "serve", "--checkpoint", str(expert_checkpoint), *extra],
                           capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"} | _py_env())
        assert p.returncode != 0 and message in p.stdout + p.stderr


def _py_env():
    import os

    return {k: v for k, v in os.environ.items() if k != "RLROBOT_TOKEN"}


@pytest.mark.parametrize("mode", ["ensemble", "open_loop"])
def test_chunks_are_ensembled_or_executed_open_loop(mode):
    """A fake 4-step chunk source whose k-th chunk is constant 0.01 k: open loop executes a chunk's actions over
    several ticks; ensembling averages every chunk that covers a tick with ACT's weights exp(-m i), oldest first."""

    class Chunks:
        k = 0

        def infer(self, obs):
            self.k += 1
            return np.full((4, 5), 0.01 * self.k, np.float32)

    twin = TwinRobot("so101-reach", seed=0)
    twin.connect()
    bridge = TaskBridge("so101-reach", "ee_delta")
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 0.04, bridge.tcp_position)
    executor = ChunkExecutor(twin, bridge, Chunks(), sup, ExecutorConfig(mode=mode, ensemble_decay=0.5, realtime=False))
    chunks = [(0, np.full((4, 5), 1.0)), (1, np.full((4, 5), 2.0)), (2, np.full((4, 5), 3.0)), (5, np.full((4, 5), 9.0))]
    w = np.exp(-0.5 * np.arange(3))
    expected = {"ensemble": (w * [1.0, 2.0, 3.0]).sum() / w.sum(), "open_loop": 3.0}[mode]
    assert executor._pick(chunks, 2)[0] == pytest.approx(expected)  # chunks starting at 0, 1, 2 cover tick 2
    assert executor._pick(chunks, 4) is not None and executor._pick(chunks, 9) is None
    picked = []
    original = executor._pick

    def spy(chunks, t):
        a = original(chunks, t)
        picked.append(None if a is None else float(a[0]))
        return a

    executor._pick = spy
    result = executor.run_episode(16)
    executor.close()
    assert result.holds == 0 and not result.aborted and 3 <= result.fresh_chunks <= 16
    if mode == "open_loop":  # a new chunk only when the current one is about to run out
        values = [p for p in picked if p is not None]
        assert len({round(v, 6) for v in values}) < len(values) and result.fresh_chunks <= 9
