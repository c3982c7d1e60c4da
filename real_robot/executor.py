"""Chunk executor: runs a policy's action chunks on a robot at the control rate, safely.

Each control tick (kept with a monotonic clock): read the robot, build the policy observation (TaskBridge), take in
chunks that arrived, ask for the next chunk ahead of time (inference runs in a worker thread, so its latency is
hidden behind execution), pick the action for this tick -- ACT-style temporal ensembling of every chunk that covers
the tick (weights exp(-m i), i = 0 the oldest), or plain open-loop chunks -- map it to joint targets, pass them
through the safety supervisor, and command the robot.

Safety rules of the loop:
- a policy's raw answer is validated before any mapping: finite after the cast to float32, exactly
  ``[chunk, action_dim]`` (or ``[action_dim]``); anything else is refused (counted) and never used;
- the watchdog is fed only by answers that are used: a chunk whose actions all lie in the past (a late answer) is
  dropped and does not count as fresh. No fresh chunk for ``watchdog_s`` -> hold; for ``disable_after_s`` -> hold,
  disable, abort the episode and latch the supervisor (no further episode until an operator clears it);
- every reading passes the supervisor's check before the bridge or the policy sees it; a reading that fails it (or a
  driver that cannot read) is a fault: hold, disable, latch, and the episode is aborted;
- holds brake through the supervisor (acceleration-limited), emergency holds too, and every write goes through one
  path that checks the command (finite, inside the limits) and the latch immediately before the driver call;
- the robot owns the control rate (``robot.control_rate_hz``, 1..200 Hz): a policy trained at another rate is
  refused, or resampled in time when ``policy_rate="resample"`` and its actions are absolute joint targets;
- a watcher thread acts on wall time: an e-stop (any latch) holds and disables within milliseconds, and a watchdog
  disable fires on time, whatever the control rate and wherever the loop is waiting;
- any exception in the loop ends in hold + disable + latch, then ``ControlLoopFault`` with the cause;
- ``step_confirm``: before the first action of each new chunk the loop waits for the operator (``operator`` queue:
  "go" or "stop"), holding the arm through the supervisor every tick, readings still checked and the e-stop live; the
  watchdog does not count that deliberate pause, and "stop" latches the supervisor like an e-stop.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlrobot.policies.rtc import RTCConfig, RTCRequest

from .bridge import TaskBridge
from .robot import check_control_rate
from .safety import SafetyLatched, SafetySupervisor
from .stats import RunningStats

log = logging.getLogger("rlrobot.executor")

EXECUTION_MODES = ("ensemble", "open_loop")
POLICY_RATE_MODES = ("refuse", "resample")
RESAMPLABLE_CONTROL_MODES = ("joint_pos",)
"""absolute targets can be interpolated in time; a delta per policy step has no meaning at another rate"""
WATCHER_PERIOD_S = 0.005
"""how often the watcher thread looks at the watchdog (the latch itself wakes it at once)"""


@dataclass
class ExecutorConfig:
    mode: str = "ensemble"
    """ensemble (ACT temporal ensembling) | open_loop (execute chunks as they are, re-plan before they run out)"""
    ensemble_decay: float = 0.01
    """ACT's m: weight exp(-m i) for the i-th oldest prediction of a step"""
    realtime: bool = True
    """keep the robot's control rate with the wall clock (False: as fast as the robot and policy allow)"""
    rtc: RTCConfig = field(default_factory=RTCConfig)
    """real-time chunking (open_loop only): each new chunk is requested every rtc.execution_horizon steps and generated
    guided towards the current chunk's unexecuted leftover; it takes over at the step it was requested for"""
    policy_rate: str = "refuse"
    """a policy trained at another control rate than the robot's: refuse (default) | resample (its chunks are
    interpolated in time onto the robot's ticks; absolute joint targets only)"""
    step_confirm: bool = False
    """wait for the operator before executing each new chunk (the arm holds meanwhile): a first run on a real arm,
    as lerobot-sim2real's --no-continuous-eval (rlrobot deploy --step-confirm: Enter executes, q stops)"""

    def __post_init__(self):
        if self.mode not in EXECUTION_MODES:
            raise ValueError(f"executor.mode={self.mode!r} is not one of {EXECUTION_MODES}")
        if self.policy_rate not in POLICY_RATE_MODES:
            raise ValueError(f"executor.policy_rate={self.policy_rate!r} is not one of {POLICY_RATE_MODES}")
        if not (math.isfinite(self.ensemble_decay) and self.ensemble_decay >= 0):
            raise ValueError(f"executor.ensemble_decay={self.ensemble_decay!r} must be a finite number >= 0")
        self.rtc.validate()
        if self.rtc.enabled and self.mode != "open_loop":
            raise ValueError(f"executor.rtc.enabled needs executor.mode='open_loop' (got {self.mode!r}): RTC splices "
                             f"each new chunk into the executed one instead of averaging them")


class ControlLoopFault(RuntimeError):
    """The control loop failed; the arm was held and disabled and the supervisor latched before this was raised."""


MAX_CHUNK = 1024


def _mean_max(values: list[float]) -> dict[str, float]:
    return {"count": len(values), "mean": float(np.mean(values)), "max": float(np.max(values))} if values else {"count": 0}


class InferenceWorker:
    """One request in flight at a time, answered on a background thread (a local policy or a PolicyClient)."""

    def __init__(self, source):
        self.source = source
        self.results: queue.Queue = queue.Queue()
        self._requests: queue.Queue = queue.Queue()
        self.busy = False
        self.round_trips = RunningStats(scale=1e3)  # ms, bounded
        self.failures = 0
        self.last_failure = ""
        """why the latest request failed ("ExceptionType: message"), for the episode's report"""
        self._thread = threading.Thread(target=self._run, daemon=True, name="inference")
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            step, obs, rtc = item
            start = time.perf_counter()
            try:
                chunk = self.source.infer(obs) if rtc is None else self.source.infer(obs, rtc=rtc)
                self.round_trips.append(time.perf_counter() - start)
                self.results.put((step, chunk, None, time.monotonic()))
            except Exception as e:  # server gone, timeout, bad reply: the executor holds and the watchdog counts
                self.failures += 1
                self.last_failure = f"{type(e).__name__}: {e}"
                if self.failures == 1 or self.failures % 100 == 0:
                    log.warning("inference failed (%d so far): %s: %s", self.failures, type(e).__name__, e)
                self.results.put((step, None, e, time.monotonic()))

    def submit(self, step: int, obs: dict[str, np.ndarray], rtc: RTCRequest | None = None) -> bool:
        if self.busy:
            return False
        self.busy = True
        self._requests.put((step, obs, rtc))
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
    latched: bool = False
    """the supervisor is latched after this episode (e-stop, watchdog disable, fault): no episode runs until an
    operator clears it"""
    success: bool | None = None
    holds: int = 0
    """control ticks on which the arm held (braked towards rest, then stayed) instead of acting: no action for that
    tick had arrived in time (inference or network slower than the control period), or none fresh for watchdog_s"""
    clamped_steps: int = 0
    """acting ticks on which the safety supervisor changed the policy's command (joint, velocity, acceleration or
    workspace limit)"""
    episode_return: float | None = None
    """the task's reward summed over the episode, where the robot knows it (the twin); None on hardware"""
    fresh_chunks: int = 0
    late_chunks: int = 0
    """answers that arrived after all their actions' time had passed: dropped, and not counted as fresh"""
    refused_chunks: int = 0
    """answers refused before any mapping (non-finite, wrong shape)"""
    inference_failures: int = 0
    failure_reason: str = ""
    """why this episode's first failed request failed (a refusal's code and message), shown without --verbose"""
    round_trip: dict[str, float] = field(default_factory=dict)
    jitter: dict[str, float] = field(default_factory=dict)
    interventions: dict[str, int] = field(default_factory=dict)
    first_hold_after_last_chunk_s: float | None = None
    chunk_gap: dict[str, float] = field(default_factory=dict)
    """per new chunk that had a previous one: mean |a_new[0] - a_prev_leftover[0]| over action dims, the two plans'
    disagreement at the step the new chunk was requested for (what RTC's frozen prefix removes)"""
    switch_jump: dict[str, float] = field(default_factory=dict)
    """per new chunk that took over from a previous one: mean |a_new[k] - a_prev[k]| at the first step it was
    executed, the jump the robot sees at the splice"""
    operator_waits: int = 0
    """control ticks held while waiting for the operator's go (step_confirm); not counted as steps or holds"""
    confirmed_chunks: int = 0


class ChunkExecutor:
    def __init__(self, robot, bridge: TaskBridge, source, supervisor: SafetySupervisor, cfg: ExecutorConfig | None = None,
                 recorder=None):
        self.robot, self.bridge, self.supervisor = robot, bridge, supervisor
        self.cfg = cfg or ExecutorConfig()
        self.recorder = recorder
        self.rate_hz = check_control_rate(robot.control_rate_hz, "robot control_rate_hz")
        self.dt = 1.0 / self.rate_hz
        if supervisor.cfg.watchdog_s < 2 * self.dt:  # one answer a tick at best: a shorter watchdog always holds
            raise ValueError(f"safety.watchdog_s={supervisor.cfg.watchdog_s:g} must be at least two control periods "
                             f"({2 * self.dt:g} s at {self.rate_hz:g} Hz)")
        metadata = getattr(source, "metadata", None) or {}
        self.resample_ratio = self._policy_rate_ratio(metadata.get("control_rate_hz"), bridge)
        self.max_chunk = int(metadata.get("chunk_size") or MAX_CHUNK)
        self._robot_lock = threading.Lock()  # one writer at a time: the control loop or the watcher thread
        self._stopped = False  # this episode's emergency stop was done (hold + disable once)
        self._last_fresh = time.monotonic()
        self.worker = InferenceWorker(source)
        self.operator: queue.Queue[str] = queue.Queue()
        """step_confirm: the operator's answers, "go" or "stop" (rlrobot deploy feeds it from stdin)"""
        self.on_wait = None
        """step_confirm: called with the step whose chunk waits for the operator (deploy prints the prompt)"""
        self.round_trips = self.worker.round_trips
        self.jitter = RunningStats(scale=1e3)  # ms, over every episode, bounded
        self._gaps: list[float] = []  # this episode's plan discontinuities (chunk_gap, switch_jump)
        self._jumps: list[float] = []
        self._last_plan: tuple[int, np.ndarray] | None = None  # the newest chunk taken, even after it ran out
        self.rtc_horizon = 0
        if self.cfg.rtc.enabled:
            if not getattr(source, "supports_rtc", False):
                raise ValueError("executor.rtc.enabled needs a flow (chunk) policy run in this process (--checkpoint): "
                                 "this policy source cannot take the previous chunk's leftover")
            self.rtc_horizon = self.cfg.rtc.horizon_for(self.max_chunk, int(metadata.get("execute_steps") or 0))
            if hasattr(source, "warm_up_rtc"):  # autograd's first backward must not run inside the control loop
                source.warm_up_rtc()

    def _policy_rate_ratio(self, policy_rate: Any, bridge: TaskBridge) -> float | None:
        """None when the policy runs at the robot's rate; robot ticks per policy step when its chunks are resampled
        (explicitly asked for); a ValueError that says what to do otherwise."""
        if policy_rate is None:
            return None
        if isinstance(policy_rate, bool) or not isinstance(policy_rate, (int, float)) or not math.isfinite(policy_rate) \
                or policy_rate <= 0:
            raise ValueError(f"the policy's metadata control_rate_hz={str(policy_rate)[:40]!r} is not a finite number > 0: "
                             f"refused")
        if abs(policy_rate - self.rate_hz) <= 1e-6 * self.rate_hz:
            return None
        if self.cfg.policy_rate != "resample":
            raise ValueError(f"the policy was trained at {policy_rate:g} Hz and the robot runs at {self.rate_hz:g} Hz: "
                             f"refused (run the robot at the policy's rate, or --executor.policy-rate resample for "
                             f"absolute joint targets)")
        control_mode = getattr(bridge, "control_mode", None)
        if control_mode not in RESAMPLABLE_CONTROL_MODES:
            raise ValueError(f"executor.policy_rate=resample needs absolute joint targets {RESAMPLABLE_CONTROL_MODES}; "
                             f"the policy's control mode is {control_mode!r} (a delta per step of another rate)")
        log.warning("the policy runs at %g Hz, the robot at %g Hz: every chunk is resampled onto the robot's ticks",
                    policy_rate, self.rate_hz)
        return self.rate_hz / policy_rate

    def _resample(self, chunk: np.ndarray) -> np.ndarray:
        """A chunk of policy steps as robot ticks: linear interpolation in time, the last action held to the end of
        its step; at most MAX_CHUNK ticks (a later chunk replaces it long before)."""
        if self.resample_ratio is None:
            return chunk
        ticks = min(max(1, round(len(chunk) * self.resample_ratio)), MAX_CHUNK)
        policy_steps = np.arange(ticks) / self.resample_ratio
        columns = [np.interp(policy_steps, np.arange(len(chunk)), chunk[:, d]) for d in range(chunk.shape[1])]
        return np.stack(columns, axis=1).astype(np.float32)

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
        if self.rtc_horizon and t - start >= self.rtc_horizon:  # RTC: a new chunk every s steps, guided by the leftover
            return True
        return start + len(chunk) - t <= latency_steps  # re-plan so that the next chunk lands before this one ends

    def _rtc_request(self, chunks: list[tuple[int, np.ndarray]], t: int, median_rt: float) -> RTCRequest | None:
        """The newest chunk's actions from step t on, and d (configured, or the measured latency in control steps)."""
        if not self.rtc_horizon or not chunks:
            return None
        start, chunk = chunks[-1]
        if not start <= t < start + len(chunk):
            return None
        rtc = self.cfg.rtc
        delay = rtc.inference_delay if rtc.inference_delay >= 0 else math.ceil(median_rt / self.dt)
        return RTCRequest(chunk[t - start:].copy(), int(delay), rtc)

    def validate_chunk(self, raw) -> tuple[np.ndarray | None, str]:
        """(chunk [k, action_dim] float32, "") for a usable raw policy answer, else (None, why)."""
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                chunk = np.asarray(raw, dtype=np.float32)  # the cast first: float64 1e300 becomes inf here
        except (TypeError, ValueError) as e:
            return None, f"not a numeric array ({type(e).__name__})"
        if chunk.ndim == 1:
            chunk = chunk[None]
        dim = self.bridge.action_dim
        if chunk.ndim != 2 or chunk.shape[1] != dim or not 1 <= chunk.shape[0] <= self.max_chunk:
            return None, f"shape {chunk.shape} is not [1..{self.max_chunk}, {dim}]"
        if not np.isfinite(chunk).all():
            return None, "NaN or Inf (after the cast to float32)"
        return chunk, ""

    def _take(self, answer, chunks, result: EpisodeResult, t: int, last_fresh: float) -> float:
        """Keep a usable answer; the watchdog is fed (the returned time) only by an answer that will be used."""
        step, raw, error, arrived = answer
        if error is not None:
            result.failure_reason = result.failure_reason or f"{type(error).__name__}: {error}"
            return last_fresh
        chunk, why = self.validate_chunk(raw)
        if chunk is None:
            result.refused_chunks += 1
            self.supervisor._count("nonfinite" if why.startswith("NaN") else "bad_action", f"refused a policy answer: {why}")
            return last_fresh
        chunk = self._resample(chunk)
        if step + len(chunk) <= t:  # every action of it is in the past
            result.late_chunks += 1
            return last_fresh
        if self._last_plan is not None:  # how far the new plan is from the one it replaces (reported; RTC: small)
            prev_start, prev = self._last_plan
            if prev_start <= step < prev_start + len(prev):
                self._gaps.append(float(np.abs(chunk[0] - prev[step - prev_start]).mean()))
            if prev_start <= t < prev_start + len(prev) and step <= t:
                self._jumps.append(float(np.abs(chunk[t - step] - prev[t - prev_start]).mean()))
        self._last_plan = (step, chunk)
        chunks.append((step, chunk))
        result.fresh_chunks += 1
        return arrived  # fresh as of its arrival, even if this tick polled it later

    def _write(self, kind: str, command: np.ndarray) -> None:
        """Every command write of the control loop: the latch is checked immediately before it, under the lock
        that the watcher's emergency stop takes too, and the command passes the supervisor's last check."""
        with self._robot_lock:
            if self.supervisor.estopped:
                raise SafetyLatched(self.supervisor.estop_reason)
            self._send(kind, command)

    def _send(self, kind: str, command: np.ndarray) -> None:
        """The one path to the driver: nothing non-finite or outside the limits is ever sent (UnsafeCommand)."""
        checked = self.supervisor.checked_command(command)
        if kind == "act":
            self.robot.act(checked)
        else:
            self.robot.hold(checked)

    def _emergency_stop(self) -> None:
        """Hold through the supervisor (its braking command from the last checked one), then torque off; without a
        position that passed the checks nothing is sent, the arm is only disabled. Once per episode, from whichever
        thread gets here first; each step is tried even if the other fails."""
        with self._robot_lock:
            if self._stopped:
                return
            self._stopped = True
            command = self.supervisor.emergency_command()
            if command is not None:
                try:
                    self._send("hold", command)
                except Exception as e:  # keep going: disabling matters most
                    log.error("emergency hold failed: %s: %s", type(e).__name__, e)
            else:
                log.error("emergency stop without a checked position to hold at: disabling only")
            try:
                self.robot.disable()
            except Exception as e:
                log.error("emergency disable failed: %s: %s", type(e).__name__, e)

    def _watch(self, done: threading.Event) -> None:
        """The watcher thread of an episode: on wall time, not at the next tick. A latch (e-stop, fault) wakes it at
        once; it also fires the watchdog disable when no fresh answer came for disable_after_s."""
        sup = self.supervisor
        while not done.is_set():
            if sup.latched_event.wait(WATCHER_PERIOD_S):
                self._emergency_stop()
                return
            since_fresh = time.monotonic() - self._last_fresh
            if sup.watchdog(since_fresh) == "disable" and not done.is_set():
                sup.latch(f"watchdog: no fresh action for {since_fresh:.2f} s", kind="watchdog_disable")

    def _abort_reason(self) -> str:
        sup = self.supervisor
        return f"e-stop ({sup.estop_reason})" if sup.latch_kind in ("estop", "") else sup.estop_reason

    def run_episode(self, max_steps: int, instruction: str | None = None) -> EpisodeResult:
        sup, worker = self.supervisor, self.worker
        result = EpisodeResult()
        if sup.estopped:  # latched: nothing moves until an operator clears it (SafetySupervisor.clear_estop)
            result.aborted, result.latched = True, True
            result.abort_reason = f"latched: {sup.estop_reason} (an operator must clear it and re-enable the robot)"
            return result
        interventions_before, failures_before = dict(sup.interventions), worker.failures
        episode_round_trips, episode_jitter = RunningStats(), RunningStats(scale=1e3)  # worker round trips are in ms
        self._gaps, self._jumps, self._last_plan = [], [], None
        self._stopped, self._last_fresh = False, time.monotonic()
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(done,), daemon=True, name="safety-watcher")
        watcher.start()
        try:
            self._loop(max_steps, instruction, result, episode_round_trips, episode_jitter)
        except SafetyLatched:  # the latch arrived between the top of the tick and a command write
            self._emergency_stop()
            result.aborted, result.abort_reason = True, self._abort_reason()
        except BaseException as e:
            sup.latch(f"control-loop fault: {type(e).__name__}: {e}", kind="fault")
            self._emergency_stop()
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: stopped safely, now let it through
                raise
            raise ControlLoopFault(f"control loop failed at step {result.steps}: {type(e).__name__}: {e}; the arm was "
                                   f"held and disabled and the supervisor latched") from e
        finally:
            done.set()
            watcher.join(timeout=1.0)
        result.latched = sup.estopped
        result.inference_failures = worker.failures - failures_before
        if result.inference_failures and not result.failure_reason:
            result.failure_reason = worker.last_failure
        result.round_trip = episode_round_trips.summary()
        result.jitter = episode_jitter.summary()
        result.chunk_gap, result.switch_jump = _mean_max(self._gaps), _mean_max(self._jumps)
        result.interventions = {k: v - interventions_before.get(k, 0) for k, v in sup.interventions.items()
                                if v - interventions_before.get(k, 0) > 0}
        if hasattr(self.robot, "success"):
            result.success = self.robot.success()
        if getattr(self.robot, "episode_return", None) is not None:
            result.episode_return = float(self.robot.episode_return)
        return result

    def _read(self, first: bool = False) -> dict[str, Any] | None:
        """A reading that passed the supervisor's check (its qpos as checked float64), or None: a reading fault has
        latched the supervisor (the driver failed, a value is missing, implausible, stale or frozen)."""
        sup = self.supervisor
        try:
            reading = self.robot.observe()
            qpos, qvel = reading["qpos"], np.asarray(reading.get("qvel", np.zeros(1)), np.float64)
        except Exception as e:  # a driver that cannot read the arm, or a reading without its joint positions
            sup.latch(f"reading fault: cannot read the arm ({type(e).__name__}: {str(e)[:200]})", kind="reading_fault")
            return None
        timestamp = reading.get("timestamp")
        if first:
            try:
                sup.reset(qpos, timestamp)
            except ValueError as e:
                sup.latch(f"reading fault at the start of the episode: {e}", kind="reading_fault")
                return None
        elif sup.check_reading(qpos, timestamp) is not None:
            return None
        if not np.isfinite(qvel).all():
            sup.latch(f"reading fault: non-finite joint velocities {qvel}", kind="reading_fault")
            return None
        return {**reading, "qpos": sup.last_good_reading}

    def _command(self, kind: str, result: EpisodeResult, targets: np.ndarray | None = None) -> np.ndarray:
        """The supervisor's command for this tick (a hold, or the policy's targets filtered), written at once: under
        the lock the watcher's emergency stop takes, with the latch checked before the supervisor and the write."""
        sup = self.supervisor
        with self._robot_lock:
            if sup.estopped:
                raise SafetyLatched(sup.estop_reason)
            if kind == "hold":
                command = sup.stop()  # brake at the acceleration limit, then stay
            else:
                before = sum(sup.interventions.values())
                command = sup.filter(targets)
                result.clamped_steps += sum(sup.interventions.values()) != before
            if sup.estopped:  # latched while the command was computed
                raise SafetyLatched(sup.estop_reason)
            self._send(kind, command)
        return command

    def _end_latched(self, result: EpisodeResult) -> None:
        self._emergency_stop()
        result.aborted, result.abort_reason = True, self._abort_reason()

    def _loop(self, max_steps: int, instruction: str | None, result: EpisodeResult, round_trips: RunningStats,
              jitter: RunningStats) -> None:
        sup, worker, cfg = self.supervisor, self.worker, self.cfg
        if self._read(first=True) is None:
            return self._end_latched(result)
        chunks: list[tuple[int, np.ndarray]] = []
        confirmed: set[int] = set()  # step_confirm: start steps of the chunks the operator let run
        while worker.poll() is not None:  # drop answers to a previous episode's requests
            pass
        self._drain_operator()
        seen_round_trips = worker.round_trips.count
        self._last_fresh = last_fresh = time.monotonic()
        next_tick = time.monotonic()
        for t in range(max_steps):
            tick_start = time.monotonic()
            if cfg.realtime:
                jitter.append(tick_start - next_tick)
                self.jitter.append(tick_start - next_tick)
            if sup.estopped or (reading := self._read()) is None:
                return self._end_latched(result)
            obs = self.bridge.observation(reading)
            while (answer := worker.poll()) is not None:
                last_fresh = self._take(answer, chunks, result, t, last_fresh)
            recent = worker.round_trips.last(20)
            median_rt = float(np.median(recent)) / 1e3 if recent else 0.0
            if not worker.busy and self._needs_request(chunks, t, 1 + math.ceil(median_rt / self.dt)):
                worker.submit(t, obs, self._rtc_request(chunks, t, median_rt))
            action = self._pick(chunks, t)
            if action is None and worker.busy:  # the action for this tick is being computed: wait for it, briefly
                deadline = (next_tick + 0.8 * self.dt) if cfg.realtime else (time.monotonic() + sup.cfg.watchdog_s)
                while action is None and worker.busy and (wait := deadline - time.monotonic()) > 0:
                    answer = worker.poll(timeout=wait)
                    if answer is not None:
                        last_fresh = self._take(answer, chunks, result, t, last_fresh)
                        action = self._pick(chunks, t)
            self._last_fresh = last_fresh
            if worker.round_trips.count > seen_round_trips:
                round_trips.extend(worker.round_trips.last(worker.round_trips.count - seen_round_trips))
                seen_round_trips = worker.round_trips.count
            since_fresh = time.monotonic() - last_fresh
            state = sup.watchdog(since_fresh)
            if state == "disable":
                sup.latch(f"watchdog: no fresh action for {since_fresh:.2f} s", kind="watchdog_disable")
                return self._end_latched(result)
            if action is None or state == "hold":
                if state == "hold" and result.first_hold_after_last_chunk_s is None:
                    result.first_hold_after_last_chunk_s = since_fresh
                command = self._command("hold", result)
                result.holds += 1
                held = True
            else:
                if cfg.step_confirm and (waited := self._confirm_chunks(chunks, t, confirmed, result)) is not None:
                    if (reading := waited) is False:
                        return self._end_latched(result)
                    last_fresh = self._last_fresh = next_tick = time.monotonic()  # the wait was the operator's
                targets = self.bridge.joint_targets(action, reading, sup.last_command)
                command = self._command("act", result, targets)
                held = False
            if self.recorder is not None:
                self.recorder.add_frame(reading, obs, None if held else action, command,
                                        instruction or self.bridge.instruction, sum(sup.interventions.values()), held=held)
            chunks[:] = [(s, c) for s, c in chunks if s + len(c) > t + 1]
            result.steps = t + 1
            next_tick += self.dt
            if cfg.realtime:
                delay = next_tick - time.monotonic()
                if delay > 0:
                    sup.latched_event.wait(delay)  # a latch wakes the loop at once
                else:
                    next_tick = time.monotonic()  # overran: do not try to catch up with a burst of commands

    def _drain_operator(self) -> None:
        """Drop answers given before this episode: they are not for its chunks."""
        while True:
            try:
                self.operator.get_nowait()
            except queue.Empty:
                return

    def _confirm_chunks(self, chunks: list[tuple[int, np.ndarray]], t: int, confirmed: set[int],
                        result: EpisodeResult) -> dict[str, Any] | bool | None:
        """step_confirm: None when no new chunk covers step t; else wait for the operator, then a fresh checked
        reading, or False when the wait ended in a latch or a reading fault."""
        pending = {start for start, _ in chunks if start <= t} - confirmed
        if not pending:
            return None
        if not self._await_operator(t, result):
            return False
        confirmed.update(pending)
        result.confirmed_chunks += 1
        reading = self._read()
        return False if reading is None else reading

    def _await_operator(self, t: int, result: EpisodeResult) -> bool:
        """step_confirm: hold (through the supervisor, readings checked each tick) until the operator says "go"
        (True) or "stop" (False, latched); the watchdog is fed meanwhile: the pause is the operator's, not a silent
        policy. False also when a latch or a reading fault ends the wait."""
        sup = self.supervisor
        if self.on_wait is not None:
            self.on_wait(t)
        while True:
            try:
                answer = self.operator.get(timeout=self.dt)
            except queue.Empty:
                answer = None
            if sup.estopped:
                return False
            if answer == "go":
                return True
            if answer == "stop":
                sup.latch(f"operator stopped the run at step {t} (step confirmation)", kind="estop")
                return False
            if self._read() is None:
                return False
            self._command("hold", result)
            result.operator_waits += 1
            self._last_fresh = time.monotonic()

    def close(self) -> None:
        self.worker.close()
