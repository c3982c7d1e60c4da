"""Policy server and client in real processes on 127.0.0.1: end to end on the twin, and the fault cases."""

import threading
import time

import numpy as np
import pytest

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


@pytest.mark.slow
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
    # the watchdog disable latched: the next episode does not start (nothing is commanded) until an operator clears it
    assert result.latched and executor.supervisor.estopped
    n_commands = len(twin.commands)
    refused = executor.run_episode(50)
    assert refused.aborted and refused.latched and refused.steps == 0 and "latched: watchdog" in refused.abort_reason
    assert len(twin.commands) == n_commands
    # the server comes back on the same port: the operator clears the latch, the client reconnects and runs normally
    srv2 = ServerProcess(expert_checkpoint, port=srv.port)
    try:
        executor.supervisor.clear_estop()
        twin.reset_episode()
        executor.cfg.realtime = False
        deadline = time.time() + 10
        result = executor.run_episode(50)
        while result.aborted and time.time() < deadline:  # at most a reconnect interval of holds
            executor.supervisor.clear_estop()
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
        kinds = {kind for _, kind, _ in twin.commands}
        held = np.array([q for _, kind, q in twin.commands if kind == "hold"])
        # every answer refused before any mapping: nothing from the policy is commanded, the arm holds where it was
        assert kinds == {"hold"} and len(held) == 20 and np.isfinite(held).all() and np.allclose(held, held[0])
        assert result.interventions.get("nonfinite", 0) == 20 and result.refused_chunks == 20
    finally:
        srv.stop()
    # a joint-position policy that jumps between the extremes every step: velocity and acceleration clamps
    twin = TwinRobot("so101-reach", seed=0)
    twin.connect()
    bridge = TaskBridge("so101-reach", "joint_pos")
    sup = SafetySupervisor(SafetyConfig(max_joint_velocity=2.0, max_joint_acceleration=39.0), twin.joint_low,
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
    assert np.all(np.abs(np.diff(steps, axis=0)) <= 39.0 * 0.04**2 + 1e-9)
    assert np.all(commanded[1:] >= twin.joint_low - 1e-9) and np.all(commanded[1:] <= twin.joint_high + 1e-9)
    assert sup.interventions["velocity"] > 0 and sup.interventions["acceleration"] > 0


def test_bad_frames_are_rejected_while_a_good_client_is_served(server):
    """Raw clients (tests/real_robot/wire.py, written from PROTOCOL.md) send every kind of bad frame; each gets its
    error, before authentication an unsigned one followed by closing the connection, after it a signed one on a
    connection that stays usable; a well-behaved client keeps getting identical answers."""
    from websockets.exceptions import ConnectionClosed

    from . import wire

    good = PolicyClient(server.url, token=TOKEN)
    good.connect()
    before = good.infer(STATE)

    def refused_before_hello(msg=None, key="hello", raw=None):
        s = wire.RawSession(server.url, TOKEN, hello=False)
        k = wire.hello_key(s.secret, s.server_nonce) if key == "hello" else key
        s.send(msg or {}, key=k, raw=raw)
        reply, ok = s.recv(unsigned=True)
        assert ok and reply["type"] == "error" and s.received[-1][:32] == bytes(32)  # unsigned: peer not authenticated
        with pytest.raises(ConnectionClosed):
            s.ws.recv(timeout=5)
        return reply["code"]

    hello = {"type": "hello", "version": 2, "seq": 1, "nonce": bytes(32)}
    assert refused_before_hello(hello, key=b"wrong-token") == "unauthenticated"
    assert refused_before_hello(raw=bytes(32) + wire.msgpack.packb(hello)) == "unauthenticated"
    assert refused_before_hello(raw=b"\x00" * 40) in ("unauthenticated", "malformed")
    for version in (99, 2.0, True, "2"):
        assert refused_before_hello({**hello, "version": version}) == "version"
    assert refused_before_hello({**hello, "seq": True}) == "malformed"
    assert refused_before_hello({"type": "infer", "obs": {}}) == "bad_request"  # the first frame must be a hello
    assert refused_before_hello({**hello, "nonce": b"short"}) == "malformed"
    assert np.array_equal(good.infer(STATE), before)
    # far over the limit: the websocket layer closes that connection (1009) before buffering it; before the hello
    # the limit is 64 KiB
    s = wire.RawSession(server.url, TOKEN, hello=False)
    with pytest.raises(ConnectionClosed, match="1009"):
        s.ws.send(bytes(32) + bytes(100_000))
        s.ws.recv(timeout=5)
    s = wire.RawSession(server.url, TOKEN)
    with pytest.raises(ConnectionClosed, match="1009"):
        s.ws.send(bytes(32) + bytes(20_000_000))
        s.ws.recv(timeout=5)
    assert np.array_equal(good.infer(STATE), before)
    # authenticated session: each bad frame gets an error and the connection stays usable
    s = wire.RawSession(server.url, TOKEN)
    body = b"\xc1 not msgpack"
    s.send({}, raw=wire.mac(s.c2s, body) + body)
    reply, ok = s.recv()
    assert ok and reply["code"] == "malformed"  # signed: the frame's tag was good
    # a signed frame the server cannot decode still counts in the sequence (the client counted it)
    s.send({"type": "infer", "obs": {"state": wire.ndarray(np.zeros(2_099_652, np.float32))}})  # just over 8 MiB
    reply, ok = s.recv(unsigned=True)
    assert ok and reply["code"] == "oversized"
    s.seq -= 1  # its tag was never checked: it does not count
    seq = s.send({"type": "infer", "obs": {"state": wire.ndarray(STATE["state"])}})
    assert s.recv()[0]["type"] == "action"
    s.seq = seq - 1  # the same seq again: a replay on this connection
    reply, ok = s.request({"type": "infer", "obs": {"state": wire.ndarray(STATE["state"])}})
    assert ok and reply["code"] == "bad_request" and "is not" in reply["message"] and reply["request"] == seq
    reply, ok = s.request({"type": "infer", "obs": {"state": wire.ndarray(np.zeros(5, np.float32))}})
    assert ok and "shape" in reply["message"] and reply["request"] == s.seq
    reply, ok = s.request({"type": "infer", "obs": {"state": wire.ndarray(np.full((1, 27), 1e300))}})
    assert ok and reply["code"] == "bad_request" and "finite as float32" in reply["message"]  # 1e300 -> inf in f4
    reply, ok = s.request({"type": "infer", "obs": {"state": wire.ndarray(STATE["state"])}})
    assert ok and reply["type"] == "action" and np.array_equal(reply["actions"], before)
    s.close()
    assert server.proc.poll() is None
    stats = good.stats()
    assert stats["errors"]["bad_request"] >= 3 and stats["errors"]["unauthenticated"] >= 2
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
