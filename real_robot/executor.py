"""Chunk executor: runs a policy's action chunks on a robot at the control rate, safely.

Each control tick (kept with a monotonic clock): read the robot, build the policy observation (TaskBridge), take in
chunks that arrived, ask for the next chunk ahead of time (inference runs in a worker thread, so its latency is
hidden behind execution), pick the action for this tick -- ACT-style temporal ensembling of every chunk that covers
the tick (weights exp(-m i), i = 0 the oldest), or plain open-loop chunks -- map it to joint targets, pass them
through the safety supervisor, and command the robot. No fresh chunk for ``watchdog_s`` -> hold; for
``disable_after_s`` -> disable and abort the episode. A chunk that arrives late skips the actions whose time has
passed.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .bridge import TaskBridge
from .safety import SafetySupervisor

log = logging.getLogger("rlrobot.executor")

EXECUTION_MODES = ("ensemble", "open_loop")


@dataclass
class ExecutorConfig:
    mode: str = "ensemble"
    """ensemble (ACT temporal ensembling) | open_loop (execute chunks as they are, re-plan before they run out)"""
    ensemble_decay: float = 0.01
    """ACT's m: weight exp(-m i) for the i-th oldest prediction of a step"""
    realtime: bool = True
    """keep the robot's control rate with the wall clock (False: as fast as the robot and policy allow)"""

    def __post_init__(self):
        if self.mode not in EXECUTION_MODES:
            raise ValueError(f"executor.mode={self.mode!r} is not one of {EXECUTION_MODES}")
        if self.ensemble_decay < 0:
            raise ValueError(f"executor.ensemble_decay must be >= 0, got {self.ensemble_decay}")


class InferenceWorker:
    """One request in flight at a time, answered on a background thread (a local policy or a PolicyClient)."""

    def __init__(self, source):
        self.source = source
        self.results: queue.Queue = queue.Queue()
        self._requests: queue.Queue = queue.Queue()
        self.busy = False
        self.round_trips: list[float] = []
        self.failures = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="inference")
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            step, obs = item
            start = time.perf_counter()
            try:
                chunk = np.asarray(self.source.infer(obs), np.float32)
                if chunk.ndim == 1:
                    chunk = chunk[None]
                self.round_trips.append(time.perf_counter() - start)
                self.results.put((step, chunk, None))
            except Exception as e:  # server gone, timeout, bad reply: the executor holds and the watchdog counts
                self.failures += 1
                if self.failures == 1 or self.failures % 100 == 0:
                    log.warning("inference failed (%d so far): %s: %s", self.failures, type(e).__name__, e)
                self.results.put((step, None, e))

    def submit(self, step: int, obs: dict[str, np.ndarray]) -> bool:
        if self.busy:
            return False
        self.busy = True
        self._requests.put((step, obs))
        return True

    def poll(self, timeout: float | None = None):
        try:
            result = self.results.get(timeout=timeout) if timeout else self.results.get_nowait()
        except queue.Empty:
            return None
        self.busy = False
        return result

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join(timeout=5.0)  # a request in flight finishes within the client's timeout


@dataclass
class EpisodeResult:
    steps: int = 0
    aborted: bool = False
    abort_reason: str = ""
    success: bool | None = None
    holds: int = 0
    fresh_chunks: int = 0
    inference_failures: int = 0
    round_trip_ms: list[float] = field(default_factory=list)
    jitter_ms: list[float] = field(default_factory=list)
    interventions: dict[str, int] = field(default_factory=dict)
    first_hold_after_last_chunk_s: float | None = None


class ChunkExecutor:
    def __init__(self, robot, bridge: TaskBridge, source, supervisor: SafetySupervisor, cfg: ExecutorConfig | None = None,
                 recorder=None):
        self.robot, self.bridge, self.supervisor = robot, bridge, supervisor
        self.cfg = cfg or ExecutorConfig()
        self.recorder = recorder
        self.worker = InferenceWorker(source)
        self.dt = 1.0 / robot.control_rate_hz

    def _pick(self, chunks: list[tuple[int, np.ndarray]], t: int) -> np.ndarray | None:
        covering = [(start, chunk[t - start]) for start, chunk in chunks if start <= t < start + len(chunk)]
        if not covering:
            return None
        if self.cfg.mode == "open_loop":
            return covering[-1][1]  # the newest plan replaces the older ones
        weights = np.exp(-self.cfg.ensemble_decay * np.arange(len(covering)))  # oldest first, as in ACT
        actions = np.stack([a for _, a in covering])
        return (weights[:, None] * actions).sum(0) / weights.sum()

    def _needs_request(self, chunks: list[tuple[int, np.ndarray]], t: int, latency_steps: int) -> bool:
        if self.cfg.mode == "ensemble" or not chunks:
            return True
        start, chunk = chunks[-1]
        return start + len(chunk) - t <= latency_steps  # re-plan so that the next chunk lands before this one ends

    def run_episode(self, max_steps: int, instruction: str | None = None) -> EpisodeResult:
        robot, sup, worker, cfg = self.robot, self.supervisor, self.worker, self.cfg
        result = EpisodeResult()
        interventions_before = dict(sup.interventions)
        round_trips_before, failures_before = len(worker.round_trips), worker.failures
        reading = robot.observe()
        sup.reset(reading["qpos"])
        last_command = np.asarray(reading["qpos"], np.float64).copy()
        chunks: list[tuple[int, np.ndarray]] = []
        while worker.poll() is not None:  # drop answers to a previous episode's requests
            pass
        last_fresh = time.monotonic()
        next_tick = time.monotonic()
        for t in range(max_steps):
            tick_start = time.monotonic()
            if cfg.realtime:
                result.jitter_ms.append((tick_start - next_tick) * 1e3)
            if sup.estopped:
                robot.hold()
                robot.disable()
                result.aborted, result.abort_reason = True, f"e-stop ({sup.estop_reason})"
                break
            reading = robot.observe()
            obs = self.bridge.observation(reading)
            while (answer := worker.poll()) is not None:
                last_fresh = self._take(answer, chunks, result, last_fresh)
            median_rt = float(np.median(worker.round_trips[-20:])) if worker.round_trips else 0.0
            if not worker.busy and self._needs_request(chunks, t, 1 + math.ceil(median_rt / self.dt)):
                worker.submit(t, obs)
            action = self._pick(chunks, t)
            if action is None and worker.busy:  # the action for this tick is being computed: wait for it, briefly
                deadline = (next_tick + 0.8 * self.dt) if cfg.realtime else (time.monotonic() + sup.cfg.watchdog_s)
                while action is None and worker.busy and (wait := deadline - time.monotonic()) > 0:
                    answer = worker.poll(timeout=wait)
                    if answer is not None:
                        last_fresh = self._take(answer, chunks, result, last_fresh)
                        action = self._pick(chunks, t)
            since_fresh = time.monotonic() - last_fresh
            state = sup.watchdog(since_fresh)
            if state == "disable":
                robot.hold()
                robot.disable()
                sup._count("watchdog_disable", f"no fresh action for {since_fresh:.2f} s")
                result.aborted, result.abort_reason = True, f"watchdog: no fresh action for {since_fresh:.2f} s"
                break
            if action is None or state == "hold":
                if state == "hold" and result.first_hold_after_last_chunk_s is None:
                    result.first_hold_after_last_chunk_s = since_fresh
                robot.hold()
                sup.hold_at(reading["qpos"])
                last_command = np.asarray(reading["qpos"], np.float64).copy()
                result.holds += 1
                command = None
            else:
                targets = self.bridge.joint_targets(action, reading, last_command)
                command = sup.filter(targets)
                robot.act(command)
                last_command = command
            if self.recorder is not None:
                self.recorder.add_frame(reading, obs, action, command, instruction or self.bridge.instruction,
                                        sum(sup.interventions.values()))
            chunks[:] = [(s, c) for s, c in chunks if s + len(c) > t + 1]
            result.steps = t + 1
            next_tick += self.dt
            if cfg.realtime:
                delay = next_tick - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_tick = time.monotonic()  # overran: do not try to catch up with a burst of commands
        result.round_trip_ms = [x * 1e3 for x in worker.round_trips[round_trips_before:]]
        result.inference_failures = worker.failures - failures_before
        result.interventions = {k: v - interventions_before.get(k, 0) for k, v in sup.interventions.items()
                                if v - interventions_before.get(k, 0) > 0}
        if hasattr(robot, "success"):
            result.success = robot.success()
        return result

    @staticmethod
    def _take(answer, chunks, result: EpisodeResult, last_fresh: float) -> float:
        step, chunk, error = answer
        if error is not None:
            return last_fresh
        chunks.append((step, chunk))
        result.fresh_chunks += 1
        return time.monotonic()

    def close(self) -> None:
        self.worker.close()
