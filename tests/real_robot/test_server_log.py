"""``rlrobot serve``'s log: one line per connection (peer, authentication, requests served, why it closed), and no
torch "array is not writable" warning for observations decoded from frames."""

import asyncio
import logging
import socket
import threading
import time
import warnings

import numpy as np
import pytest

from rlrobot.real_robot import protocol
from rlrobot.real_robot.client import PolicyClient, ServerConnectError
from rlrobot.real_robot.policy_runtime import LoadedPolicy
from rlrobot.real_robot.server import PolicyServer, install_log_handler, websocket_server
from rlrobot.real_robot.stats import RunningStats

from .conftest import TOKEN

OBS = {"state": np.zeros((1, 27), np.float32)}


class InProcessServer:
    """The real PolicyServer and websocket server on a loopback port, in an event loop thread of this process."""

    def __init__(self, policy, hello_timeout_s=1.0):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = PolicyServer(policy, TOKEN.encode(), hello_timeout_s=hello_timeout_s)

        async def start():
            install_log_handler()
            self.ws = await websocket_server(self.server, "127.0.0.1", 0).__aenter__()
            return self.ws.sockets[0].getsockname()[1]

        self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.url = f"ws://127.0.0.1:{self.port}"

    def close(self):
        asyncio.run_coroutine_threadsafe(self.ws.__aexit__(None, None, None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.server.decoder.shutdown()


@pytest.fixture
def local_server(expert_checkpoint):
    srv = InProcessServer(LoadedPolicy(str(expert_checkpoint)))
    yield srv
    srv.close()


def server_lines(caplog, count, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = [r for r in caplog.records if r.name.startswith("rlrobot.server")]
        if len(records) >= count:
            time.sleep(0.3)  # anything more than one line per connection would show up now
            return [r.getMessage() for r in caplog.records if r.name.startswith("rlrobot.server")]
        time.sleep(0.05)
    raise AssertionError(f"expected {count} server log lines, got {[r.getMessage() for r in caplog.records]}")


def test_one_log_line_per_connection(local_server, caplog):
    caplog.set_level(logging.DEBUG)
    good = PolicyClient(local_server.url, token=TOKEN)
    good.connect()
    for _ in range(3):
        good.infer(OBS)
    good.close()
    with pytest.raises(ServerConnectError):
        PolicyClient(local_server.url, token="wrong").connect()
    raw = socket.create_connection(("127.0.0.1", local_server.port), timeout=2)  # a TCP peer that never says hello
    lines = server_lines(caplog, 2)
    raw.close()
    lines = server_lines(caplog, 3)
    assert len(lines) == 3, lines
    good_line, refused_line, silent_line = lines
    assert good_line.startswith("peer 127.0.0.1:") and "authenticated, 3 requests" in good_line
    assert "closed by the peer (1000)" in good_line
    assert "refused (unauthenticated)" in refused_line and "hello refused" in refused_line
    assert "no hello" in silent_line
    levels = [r.levelno for r in caplog.records if r.name.startswith("rlrobot.server")]
    assert levels == [logging.INFO, logging.WARNING, logging.WARNING]


def test_no_torch_warning_for_read_only_arrays(local_server, expert_checkpoint):
    """Arrays decoded from a frame are read-only views of it: converting them must not warn (or share memory)."""
    decoded = protocol.decode(protocol.encode(protocol.message("infer", 1, obs=OBS), None), None)["obs"]
    assert not decoded["state"].flags.writeable
    policy = LoadedPolicy(str(expert_checkpoint))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert policy.infer(decoded).shape == (1, 5)
        client = PolicyClient(local_server.url, token=TOKEN)  # the server's inference thread: same filter
        client.connect()
        assert client.infer(OBS).shape == (1, 5)
        client.close()
    assert policy.latencies.count == 1 and policy.latencies.summary()["max_ms"] > 0


def test_loaded_policy_latencies_are_bounded(expert_checkpoint):
    policy = LoadedPolicy(str(expert_checkpoint))
    assert isinstance(policy.latencies, RunningStats) and policy.latencies.recent.maxlen == 4096  # not a list
    for _ in range(20):
        policy.infer(OBS)
    assert policy.latencies.count == 20 and policy.latencies.summary()["count"] == 20


def test_a_connections_line_says_why_its_requests_were_refused(local_server, caplog):
    """A client whose requests the policy refuses (here: no 'state') learns why from the server's log line too, without
    a debug log: the count and the first refusal's code and message."""
    caplog.set_level(logging.INFO)
    client = PolicyClient(local_server.url, token=TOKEN)
    client.connect()
    for _ in range(2):
        with pytest.raises(Exception, match="missing or not an array"):
            client.infer({"image_front": np.zeros((1, 3, 64, 64), np.uint8)})
    client.infer(OBS)
    client.close()
    (line,) = server_lines(caplog, 1)
    assert "authenticated, 3 requests (2 refused, the first: bad_request: obs['state'] is missing or not an array)" in line
