"""``rlrobot deploy``: run a policy on a robot, locally or through ``rlrobot serve``, safely, and report.

    rlrobot deploy --robot twin --checkpoint runs/reach --episodes 20
    rlrobot deploy --robot twin --server ws://127.0.0.1:8765 --token $TOKEN --record data/twin_reach
    rlrobot deploy --robot lerobot --lerobot-port /dev/ttyACM0 --checkpoint runs/reach --target 0.18 0.05 0.08
    rlrobot deploy --robot twin --server wss://policy-host:8765 --tls-ca server-cert.pem --token $TOKEN
    rlrobot deploy --robot twin --checkpoint runs/reach --reward prm:runs/prm_reach --record data/twin_reach_prm
    rlrobot deploy --robot twin --checkpoint runs/lift-lerobot --episodes 20          # the blind twin (profile policy)
    rlrobot deploy --robot lerobot --checkpoint runs/lift-lerobot --setup station.json \
        --lerobot-cameras front=0,wrist=/dev/video2 --step-confirm                    # a first real run

A policy of the LeRobot profile (``--obs-mode lerobot``) runs on what the arm gives: its joints in LeRobot's units
and its cameras' frames (``--setup``: the station's setup file, default the one the policy was trained with). On the
twin it meets the *blind* twin, which gives exactly that and no task context, through the setup's randomisation and
greenscreen. Before anything moves, deploy refuses in one line a policy whose actor reads what the robot does not
provide (a camera it lacks, a privileged key, the simulator state on a real arm), and an arm that is far from the
poses the policy was trained to start from (``--start-tolerance``). ``--step-confirm`` waits for Enter before each
chunk while the arm holds (q + Enter stops and latches).

A policy that reads cameras (a VLA, or any policy trained with ``image_<camera>`` observations) gets the robot's
frames by its camera names; ``--camera-map POLICY=ROBOT,...`` names the robot's camera where they differ. The sighted
twin renders the cameras such a policy reads, at its training size, without ``--cameras``.

Output: one line per episode as it ends, then a table of the episodes (steps, success, return where the robot knows
it, holds, clamped steps, refused and late answers, how it ended) and a summary, both with the first failed
request's reason when requests failed; ``--json-out FILE`` writes every number as JSON, ``--verbose`` also logs each
safety intervention as it happens.

- *holds*: control ticks on which the arm kept still (braking to rest through the supervisor) instead of acting,
  because no action for that tick had arrived in time: inference or the network was slower than the control period,
  or no fresh answer came for ``--safety.watchdog-s``. A few at the start of an episode over a slow link are normal;
  many mean the policy cannot keep up with the control rate.
- *clamped*: acting ticks on which the safety supervisor changed the policy's command (joint, velocity, acceleration
  or workspace limit). The default limits are the SO-101's servos' (``SafetyConfig``); a policy clamped on most steps
  asks for motions the arm cannot make.

``--reward prm:PATH``: a process reward model (``rlrobot train --algo prm``) scores every control step: its progress
of the current frame from the episode's first (``reward.progress``, the potential a real-robot RL loop shapes with),
the step's progress delta from the previous frame (``reward.delta``) and its done probability (``reward.done``). They
are recorded as extra features of ``--record``'s dataset, reported per episode (final progress, first step past the
model's done threshold; the per-step lists in ``--json-out``) and, with ``--verbose``, logged per step. The model runs
on the CPU inside the control tick (a small MLP: well under a millisecond per step).

Safety policy: an e-stop, a watchdog disable (the server went silent for ``safety.disable_after_s``) or a fault of the
control loop holds and disables the arm and *latches*: no further episode starts in this run, and the summary says
why (``latched``). Re-arming is an operator's deliberate act: fix the cause and start ``rlrobot deploy`` again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from rlrobot.domains import NonNegative, PositiveUnit, check_domains
from rlrobot.rewards.progress_model import load_progress_model
from rlrobot.rewards.progress_reward import check_prm_path
from rlrobot.tasks.setup import load_setup
from rlrobot.tasks.so101 import JOINT_NAMES, start_pose_box

from .bridge import parse_camera_map
from .drivers import DRIVERS, make_robot
from .executor import ChunkExecutor, ControlLoopFault, EpisodeResult, ExecutorConfig
from .observation_check import actor_keys, is_profile_policy, observation_problem
from .robot import check_control_rate
from .safety import SafetyConfig, SafetySupervisor

log = logging.getLogger("rlrobot.reward")


@dataclass
class DeployArgs:
    robot: str = "twin"
    """twin (MuJoCo digital twin) | lerobot (a LeRobot SO-101 follower)"""
    checkpoint: str | None = None
    """run the policy in this process (give this or --server)"""
    server: str | None = None
    """ws://host:port of `rlrobot serve`"""
    token: str | None = None
    """the server's shared secret (also read from RLROBOT_TOKEN)"""
    episodes: int = 10
    max_steps: int | None = None
    """control steps per episode (default: the task's episode length)"""
    seed: int = 0
    """the twin's scene seed (episode k uses seed + k)"""
    record: str | None = None
    """write the episodes as a LeRobotDataset in this (new) directory"""
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    twin_latency_steps: int = 0
    twin_obs_noise: float = 0.0
    cameras: bool = False
    """(twin, policies of the simulator state) also read and record the model's front and wrist cameras (a policy
    that reads cameras gets them without this flag, as it was trained on them)"""
    camera_map: str | None = None
    """POLICY=ROBOT,...: the robot's camera ROBOT gives the frames of the policy's camera POLICY where their names
    differ, e.g. up=front,side=wrist (default: the same name); a policy camera the robot lacks is refused at start"""
    control_rate_hz: float | None = None
    """(lerobot) the arm's control rate in Hz (1..200): the robot side owns it (default: the setup's rate for a
    LeRobot-profile policy, else 25); a policy trained at another rate is refused unless --executor.policy-rate
    resample (absolute joint targets). The twin runs at its task's rate"""
    setup: str | None = None
    """the station's setup file (cameras, crops, units, control rate; tasks/setup.py); default: the setup the policy
    was trained with (kept in its checkpoint), else the shipped default"""
    lerobot_cameras: str | None = None
    """(lerobot) NAME=INDEX_OR_PATH,... of the follower's cameras, e.g. front=0,wrist=/dev/video2 (default: each setup
    camera's device)"""
    twin_frame_scale: PositiveUnit = 0.25
    """(blind twin) its frames' size as a share of the setup cameras' resolution (1: full size, ~20x slower)"""
    step_confirm: bool = False
    """wait for Enter before executing each chunk (the arm holds meanwhile; q + Enter stops): a first real run"""
    start_tolerance: NonNegative = 0.25
    """rad: refuse to begin an episode when a joint is further than this outside the poses the policy was trained to
    start from (the home pose +- 0.05 rad)"""
    instruction: str | None = None
    """(lerobot, language-suite policies) the instruction the operator gives (default: the task's first)"""
    lerobot_port: str = "/dev/ttyACM0"
    lerobot_id: str = "rlrobot_so101"
    target: tuple[float, float, float] | None = None
    """(lerobot) the task's target position in the robot base frame, m (the twin knows its own)"""
    timeout_s: float = 1.0
    """network timeout of one request to the server"""
    tls_ca: str | None = None
    """(wss:// servers) PEM file of the CA or self-signed certificate that the server's certificate must verify
    against (default: the system's CAs); the host name in --server must match the certificate"""
    estop_key: bool = False
    """watch stdin: an empty line or 'e' triggers the e-stop (SIGUSR1 always does)"""
    json_out: str | None = None
    """write the full report (summary, per-episode numbers, latencies) as JSON to this file"""
    verbose: bool = False
    """log every safety intervention (each clamped command) as it happens; by default they are counted per episode"""
    reward: str | None = None
    """prm:PATH: score every step with this process reward model (progress, delta, done): reported, logged with
    --verbose and recorded with --record"""

    def validate(self) -> None:
        if self.robot not in DRIVERS:
            raise ValueError(f"robot={self.robot!r} is not one of {DRIVERS}")
        check_domains(self)
        if (self.checkpoint is None) == (self.server is None):
            raise ValueError("give exactly one of --checkpoint (run the policy here) or --server ws://host:port")
        if self.server is not None and not self.server.startswith(("ws://", "wss://")):
            raise ValueError(f"server={self.server!r} must be a ws:// or wss:// URL")
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 60):
            raise ValueError(f"timeout_s={self.timeout_s!r} must be a number in (0, 60]")
        self._validate_station()
        if self.twin_latency_steps < 0:
            raise ValueError(f"twin_latency_steps={self.twin_latency_steps} must be >= 0")
        if not (math.isfinite(self.twin_obs_noise) and self.twin_obs_noise >= 0):
            raise ValueError(f"twin_obs_noise={self.twin_obs_noise!r} must be a finite number >= 0")
        if self.target is not None and not all(math.isfinite(x) for x in self.target):
            raise ValueError(f"target={self.target} must be 3 finite numbers (m)")
        if self.reward is not None:
            if not self.reward.startswith("prm:"):
                raise ValueError(f"reward={self.reward!r} must be prm:PATH (a model of rlrobot train --algo prm)")
            check_prm_path(self.reward[4:], "reward")
        if self.executor.rtc.enabled and self.server is not None:  # the protocol does not carry the leftover (yet)
            raise ValueError("executor.rtc.enabled needs the policy in this process (--checkpoint), not --server")
        if self.tls_ca is not None:
            if self.server is None or not self.server.startswith("wss://"):
                raise ValueError("tls_ca is for a wss:// --server (TLS)")
            if not Path(self.tls_ca).is_file():
                raise ValueError(f"tls_ca={self.tls_ca!r} is not a readable file")


    def _validate_station(self) -> None:
        """The options of the station: rate, cameras, setup file, twin frames, operator input."""
        if self.control_rate_hz is not None:
            check_control_rate(self.control_rate_hz, "control_rate_hz")
        if not (math.isfinite(self.twin_frame_scale) and 0 < self.twin_frame_scale <= 1):
            raise ValueError(f"twin_frame_scale={self.twin_frame_scale!r} must be a number in (0, 1]")
        if self.step_confirm and self.estop_key:
            raise ValueError("step_confirm and estop_key both read stdin: use one (step_confirm's q + Enter stops)")
        parse_camera_map(self.camera_map)
        if self.lerobot_cameras is not None:
            from .drivers.lerobot import parse_cameras

            parse_cameras(self.lerobot_cameras)
        if self.setup is not None:
            load_setup(self.setup)


@contextlib.contextmanager
def _deploy_logging(verbose: bool):
    """--verbose: every safety intervention (per-step clamps are debug records) and the executor's debug lines on
    stderr, as they happen. Restored afterwards."""
    if not verbose:
        yield
        return
    names = ("rlrobot.safety", "rlrobot.executor", "rlrobot.reward")
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    handler = None
    if not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logging.getLogger("rlrobot").addHandler(handler)
    for logger, _ in saved:
        logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)
        if handler is not None:
            logging.getLogger("rlrobot").removeHandler(handler)


def _open_source(args: DeployArgs):
    """(policy source, its metadata): the checkpoint in this process, or a connected PolicyClient."""
    import os

    if args.checkpoint is not None:
        from .policy_runtime import LoadedPolicy

        source = LoadedPolicy(args.checkpoint)  # times every inference in bounded RunningStats
        return source, source.metadata
    from .client import PolicyClient

    source = PolicyClient(args.server, token=args.token or os.environ.get("RLROBOT_TOKEN"), timeout_s=args.timeout_s,
                          tls_ca=args.tls_ca)
    return source, source.connect()  # a ServerConnectError (ConnectionError) says what to check


def deploy_setup(args: DeployArgs, source, metadata: dict[str, Any]):
    """The station's setup of a LeRobot-profile policy: --setup, else the one in its checkpoint's run config, else
    the shipped default; None for a policy of the simulator state."""
    if not is_profile_policy(metadata):
        return None
    if args.setup is not None:
        return load_setup(args.setup)
    cfg = getattr(source, "cfg", None)
    return load_setup(getattr(cfg, "setup", "") or None)


def scene_setup(args: DeployArgs, source):
    """The setup a policy of the simulator state was trained with (its physics and control rate; --setup overrides),
    or None: the sighted twin then runs that scene."""
    if args.setup is not None:
        return load_setup(args.setup)
    text = getattr(getattr(source, "cfg", None), "setup", "")
    return load_setup(text) if text else None


def lerobot_camera_specs(args: DeployArgs, setup, names: list[str]) -> dict[str, dict[str, Any]]:
    """{camera: {device, width, height, fps}} to configure on the follower for the cameras ``names`` the policy reads."""
    from .drivers.lerobot import parse_cameras

    given = parse_cameras(args.lerobot_cameras)
    specs = {}
    for name in names:
        cam = setup.cameras[name]
        device = given.get(name, cam.device)
        if device is None:
            raise ValueError(f"camera {name!r} (the policy reads it) has no device: --lerobot-cameras {name}=INDEX_OR_PATH or "
                             f"the setup's cameras.{name}.device")
        specs[name] = {"device": device, "height": cam.resolution[0], "width": cam.resolution[1], "fps": cam.fps}
    return specs


def _make_deploy_robot(args: DeployArgs, task: str, metadata: dict[str, Any], setup=None, cameras: list[str] | None = None,
                       scene=None, frame_size: int | None = None):
    """``setup``: the station of a LeRobot-profile policy (a blind twin, the arm's cameras); ``scene``: the setup a
    policy of the simulator state was trained with (the sighted twin's physics and rate); ``frame_size``: (sighted
    twin) the size of the camera frames the policy reads, which the twin then renders as training did."""
    if args.robot == "twin":
        if setup is not None:  # the blind twin: what the real arm gives, through the setup's pipeline
            return make_robot("twin", task=task, seed=args.seed, latency_steps=args.twin_latency_steps,
                              obs_noise_std=args.twin_obs_noise, setup=setup, frame_scale=args.twin_frame_scale)
        return make_robot("twin", task=task, seed=args.seed, latency_steps=args.twin_latency_steps,
                          obs_noise_std=args.twin_obs_noise, cameras=args.cameras, setup=scene, blind=False,
                          policy_frames=frame_size)
    context = {"target": args.target} if args.target is not None else {}
    # the robot's own configured rate (the station's setup), never the policy's metadata (the executor refuses or
    # resamples a mismatch)
    station = setup if setup is not None else scene
    rate = args.control_rate_hz or (station.control_rate_hz if station is not None else 25.0)
    options: dict[str, Any] = {}
    if setup is not None:
        options = {"use_degrees": setup.use_degrees, "cameras": lerobot_camera_specs(args, setup, cameras or [])}
    return make_robot("lerobot", port=args.lerobot_port, robot_id=args.lerobot_id, context=context,
                      control_rate_hz=rate, **options)


def _policy_frame_size(bridge) -> int | None:
    """The size S of the [3, S, S] frames a policy of the simulator's observations reads (None: it reads no camera,
    or it is a profile policy, whose frames the bridge prepares from the robot's)."""
    shapes = [s for s in getattr(bridge, "image_shapes", {}).values() if len(s) == 3]
    return int(shapes[0][-1]) if shapes else None


def _connect_robot(args: DeployArgs, task: str, metadata: dict[str, Any], bridge, source, setup=None):
    """The connected robot; if that fails, bridge and policy source are closed and an OSError (a serial port that is
    missing or busy) becomes a ConnectionError that says what to check."""
    try:
        scene = scene_setup(args, source) if setup is None else None
        robot = _make_deploy_robot(args, task, metadata, setup, getattr(bridge, "robot_cameras", None), scene,
                                   _policy_frame_size(bridge))
        robot.connect()
        return robot
    except BaseException as e:
        bridge.close()
        if hasattr(source, "close"):
            source.close()
        if isinstance(e, OSError) and not isinstance(e, ConnectionError):
            where = f" at {args.lerobot_port}" if args.robot == "lerobot" else ""
            raise ConnectionError(f"cannot connect to the {args.robot} robot{where} ({type(e).__name__}: {e}): check the "
                                  f"cable, --lerobot-port and that no other program holds the port") from e
        raise


REWARD_FEATURES = {name: {"dtype": "float32", "shape": [1], "names": None}
                   for name in ("reward.progress", "reward.delta", "reward.done")}


class PRMProgressLog:
    """Scores each control step with a process reward model. It sits where the executor calls its recorder
    (``add_frame`` per tick, ``save_episode`` / ``discard_episode`` per episode), so the control loop is unchanged,
    and forwards every frame with the model's numbers to the real recorder, if any."""

    def __init__(self, path: str, bridge, recorder=None):
        state_dim = int(getattr(bridge, "state_dim", 0) or bridge.shadow.single_observation_space["state"].shape[0])
        # the robot side observes the state only: a PRM that reads images or another state is refused here
        self.model = load_progress_model(path, "cpu", observation_space={"state": [state_dim]})
        self.bridge, self.recorder = bridge, recorder
        self._embeddings: dict[str, Any] = {}
        self.first: Any = None
        self.last: Any = None
        self.steps: list[tuple[float, float, float]] = []
        self.last_episode: dict[str, Any] = {}

    def _embedding(self, text: str):
        import torch

        if text not in self._embeddings:
            shadow = self.bridge.shadow
            if hasattr(shadow, "instruction_observation"):  # the suite ships its instructions' embeddings
                emb = shadow.instruction_observation([text])["instruction_embedding"]
            else:  # a single-task PRM outside the suite is trained with a zero embedding (rlrobot train --algo prm)
                emb = np.zeros((1, 384), np.float32)
            self._embeddings[text] = torch.as_tensor(emb, dtype=torch.float32).reshape(1, -1)
        return self._embeddings[text]

    def add_frame(self, reading, obs, action, command, task: str, interventions: int, held: bool | None = None) -> None:
        import torch

        o = torch.as_tensor(np.asarray(obs["state"], np.float32)).reshape(1, -1)
        if self.first is None:
            self.first = self.last = o
        # one batched call: (first -> now) is the episode's progress, (previous -> now) the step's delta
        delta, done = self.model.progress({"state": torch.cat([self.first, self.last])}, {"state": torch.cat([o, o])},
                                          self._embedding(task).expand(2, -1))
        progress, step_delta, done_prob = float(delta[0]), float(delta[1]), float(done[0])
        self.last = o
        self.steps.append((progress, step_delta, done_prob))
        log.debug("step %d: progress %.3f, delta %+.3f, done %.3f", len(self.steps) - 1, progress, step_delta, done_prob)
        if self.recorder is not None:
            extra = {"reward.progress": np.array([progress], np.float32), "reward.delta": np.array([step_delta], np.float32),
                     "reward.done": np.array([done_prob], np.float32)}
            self.recorder.add_frame(reading, obs, action, command, task, interventions, held=held, extra=extra)

    def _end(self) -> None:
        p = [s[0] for s in self.steps]
        done = [s[2] for s in self.steps]
        first_done = next((i for i, d in enumerate(done) if d > self.model.done_threshold), None)
        self.last_episode = {"prm_final_progress": p[-1] if p else None, "prm_max_progress": max(p) if p else None,
                             "prm_done_step": first_done, "prm_progress": p, "prm_delta": [s[1] for s in self.steps],
                             "prm_done": done}
        self.first = self.last = None
        self.steps = []

    def save_episode(self) -> None:
        self._end()
        if self.recorder is not None:
            self.recorder.save_episode()

    def discard_episode(self) -> None:
        self._end()
        if self.recorder is not None:
            self.recorder.discard_episode()


def _episode_record(k: int, result: EpisodeResult) -> dict[str, Any]:
    return {"episode": k, "steps": result.steps, "success": result.success, "return": result.episode_return,
            "holds": result.holds, "clamped_steps": result.clamped_steps, "aborted": result.aborted,
            "abort_reason": result.abort_reason, "latched": result.latched, "late_chunks": result.late_chunks,
            "refused_chunks": result.refused_chunks, "inference_failures": result.inference_failures,
            "failure_reason": result.failure_reason or None,
            "interventions": result.interventions}


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _episode_line(record: dict[str, Any], total: int) -> str:
    parts = [f"{record['steps']} steps", {True: "success", False: "no success", None: "success unknown"}[record["success"]]]
    if record["return"] is not None:
        parts.append(f"return {record['return']:.1f}")
    parts += [f"{record['holds']} holds", f"{record['clamped_steps']} clamped"]
    if record.get("inference_failures"):
        parts.append(f"{record['inference_failures']} failed requests (the first: {record['failure_reason']})")
    if record.get("prm_final_progress") is not None:
        done = record["prm_done_step"]
        parts.append(f"PRM progress {record['prm_final_progress']:.2f}" + (f" (done at step {done})" if done is not None
                                                                              else " (not done)"))
    if record["aborted"]:
        parts.append(f"ABORTED: {record['abort_reason']}")
    return f"episode {record['episode'] + 1}/{total}: " + ", ".join(parts)


def _load_prm_log(args: DeployArgs, bridge, source) -> PRMProgressLog | None:
    if args.reward is None:
        return None
    try:
        return PRMProgressLog(args.reward[4:], bridge)
    except BaseException:
        bridge.close()
        if hasattr(source, "close"):
            source.close()
        raise


def _make_recorder(args: DeployArgs, robot, bridge, prm_log: PRMProgressLog | None):
    """What the executor records through: the dataset recorder (--record), behind the PRM's scorer (--reward)."""
    recorder = None
    if args.record and getattr(bridge, "setup", None) is not None:  # a profile policy: LeRobot's layout and units
        from .profile_recorder import ProfileRecorder

        recorder = ProfileRecorder(args.record, robot.control_rate_hz, bridge.units, bridge.setup.image_size, bridge.cameras,
                                   bridge.action_dim, extra_features=REWARD_FEATURES if prm_log is not None else None)
    elif args.record:
        from .recorder import EpisodeRecorder

        reading = robot.observe()
        images = {k: tuple(v.shape) for k, v in reading.get("images", {}).items()}
        recorder = EpisodeRecorder(args.record, robot.control_rate_hz, int(bridge.observation(reading)["state"].shape[-1]),
                                   bridge.action_dim, robot.joint_names, images,
                                   extra_features=REWARD_FEATURES if prm_log is not None else None)
    if prm_log is not None:  # the PRM sees every frame the recorder would, and forwards them to it
        prm_log.recorder = recorder
        return prm_log
    return recorder


def _open_bridge(args: DeployArgs, source, metadata: dict[str, Any]):
    """(the station's setup or None, the robot-side model of the policy's task); a policy that needs an observation
    the robot does not provide is refused here, before anything is built or moves (the source is closed)."""
    from .bridge import TaskBridge

    task, control_mode = metadata["task"], metadata["control_mode"]
    try:
        if control_mode is None:
            raise ValueError(f"the policy was trained on {task!r}, which has no robot-side model (native tasks only)")
        setup = deploy_setup(args, source, metadata)
        camera_map = parse_camera_map(args.camera_map)
        if setup is not None:
            _refuse_missing_observations(args, metadata, setup)
            from .profile_bridge import ProfileBridge

            bridge = ProfileBridge(task, control_mode, setup, actor_keys(metadata), camera_map)
        else:
            keys = actor_keys(metadata)
            space = metadata.get("observation_space") or {}
            bridge = TaskBridge(task, control_mode, keys, camera_map,
                                {k: space[k] for k in keys if k.startswith("image_") and k in space})
            try:
                _refuse_missing_observations(args, metadata, None, tuple(bridge.shadow.cameras))
            except BaseException:
                bridge.close()
                raise
    except BaseException:
        if hasattr(source, "close"):
            source.close()
        raise
    if args.instruction is not None:
        bridge.instruction = args.instruction
    return setup, bridge


def _print_header(console: Console, args: DeployArgs, task: str, control_mode: str, max_steps: int, robot, setup,
                  executor: ChunkExecutor) -> None:
    console.print(f"deploy {task} ({control_mode}) from {args.server or args.checkpoint} on the {args.robot}: "
                  f"{args.episodes} episodes of up to {max_steps} steps at {robot.control_rate_hz:g} Hz; limits "
                  f"{args.safety.max_joint_velocity:g} rad/s, {args.safety.max_joint_acceleration:g} rad/s^2 "
                  f"(e-stop: kill -USR1 {os.getpid()}{' or Enter' if args.estop_key else ''})", soft_wrap=True)
    if args.robot == "twin":
        console.print("the twin is blind: it gives the policy the arm's joints and camera frames only, no task context"
                      if setup is not None else "the twin is sighted: it gives the policy the simulator's task state, which "
                      "no real arm reports (train with --obs-mode lerobot for a figure that speaks for a real arm)",
                      soft_wrap=True)
    if args.step_confirm:
        console.print("step-confirm: Enter executes the next chunk, q + Enter stops (the arm holds meanwhile)",
                      soft_wrap=True)
        executor.on_wait = lambda t: console.print(f"  step {t}: chunk ready, Enter to execute, q + Enter to stop",
                                                   soft_wrap=True)


def _check_start(robot, args: DeployArgs, k: int) -> str | None:
    """Episode k may start from the arm's pose (None); else why not. Before the first episode that is a refusal
    (ValueError): nothing has moved yet."""
    problem = start_pose_problem(robot.observe()["qpos"], args.start_tolerance)
    if problem is None:
        return None
    if k == 0:
        raise ValueError(f"refused to start: {problem}")
    return f"episode {k + 1} not started: {problem}"


def _refuse_missing_observations(args: DeployArgs, metadata: dict[str, Any], setup, twin_cameras: tuple[str, ...] = ()
                                 ) -> None:
    """One-line ValueError when the robot cannot give the policy's actor what it reads (nothing is invented).
    ``twin_cameras``: the sighted twin's cameras (the task's model cameras)."""
    if args.robot == "twin":
        cameras = set(setup.camera_names) if setup is not None else set(twin_cameras)
    elif setup is not None:
        from .drivers.lerobot import parse_cameras

        given = parse_cameras(args.lerobot_cameras)
        cameras = {name for name, cam in setup.cameras.items() if name in given or cam.device is not None}
    else:
        cameras = set()
    context = {"target"} if args.target is not None else set()
    problem = observation_problem(metadata, args.robot, cameras, context, parse_camera_map(args.camera_map))
    if problem is not None:
        raise ValueError(problem)


def _check_robot_cameras(robot, bridge, source) -> None:
    """The connected robot's first reading holds a frame from every camera the policy reads (else refused)."""
    needed = list(getattr(bridge, "robot_cameras", []))
    if not needed:
        return
    try:
        frames = robot.observe().get("images", {})
        missing = [name for name in needed if name not in frames]
        if missing:
            raise ValueError(f"the robot's readings have no frames from cameras {missing} that the policy reads (it "
                             f"gives {sorted(frames)}): refused")
    except BaseException:
        robot.disconnect()
        bridge.close()
        if hasattr(source, "close"):
            source.close()
        raise


def start_pose_problem(qpos: np.ndarray, tolerance: float) -> str | None:
    """Why an arm at ``qpos`` (rad) is too far from the start poses the SO-101 tasks train from, or None."""
    low, high = start_pose_box()
    q = np.asarray(qpos, np.float64)
    outside = np.maximum(low - q, q - high)
    j = int(np.argmax(outside))
    if outside[j] <= tolerance:
        return None
    return (f"{JOINT_NAMES[j]} is at {q[j]:.2f} rad, {outside[j]:.2f} rad outside the trained start poses "
            f"[{low[j]:.2f}, {high[j]:.2f}] (--start-tolerance {tolerance:g}): move the arm to the start pose first")


def _start_step_confirm(executor: ChunkExecutor) -> None:
    """A daemon thread that turns stdin lines into the operator's answers: Enter goes, q (or e) stops."""
    import threading

    def read() -> None:
        for line in sys.stdin:
            executor.operator.put("stop" if line.strip().lower()[:1] in ("q", "e") else "go")
        executor.operator.put("stop")  # stdin closed: nobody can confirm any more

    threading.Thread(target=read, daemon=True, name="step-confirm").start()


def _make_executor(args: DeployArgs, robot, bridge, source, supervisor: SafetySupervisor) -> ChunkExecutor:
    """The executor; a policy of another control rate or a watchdog shorter than two periods is refused here, before
    anything moves, and the robot, bridge and policy source are closed. ``--step-confirm``: its operator's answers
    come from stdin."""
    import dataclasses

    try:
        cfg = dataclasses.replace(args.executor, step_confirm=args.executor.step_confirm or args.step_confirm)
        executor = ChunkExecutor(robot, bridge, source, supervisor, cfg)
        if cfg.step_confirm:
            _start_step_confirm(executor)
        return executor
    except BaseException:
        robot.disconnect()
        bridge.close()
        if hasattr(source, "close"):
            source.close()
        raise


def run_deploy(args: DeployArgs) -> dict[str, Any]:
    import signal

    args.validate()
    source, metadata = _open_source(args)
    task, control_mode = metadata["task"], metadata["control_mode"]
    setup, bridge = _open_bridge(args, source, metadata)
    prm_log = _load_prm_log(args, bridge, source)  # before the robot connects: a PRM of another obs space is refused
    robot = _connect_robot(args, task, metadata, bridge, source, setup)
    _check_robot_cameras(robot, bridge, source)
    supervisor = SafetySupervisor(args.safety, robot.joint_low, robot.joint_high, 1.0 / robot.control_rate_hz,
                                  forward_kinematics=bridge.tcp_position)
    executor = _make_executor(args, robot, bridge, source, supervisor)
    previous_usr1 = signal.getsignal(signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else None
    if hasattr(signal, "SIGUSR1"):
        supervisor.install_signal_estop(signal.SIGUSR1)
    if args.estop_key:
        supervisor.start_key_estop()
    executor.recorder = _make_recorder(args, robot, bridge, prm_log)
    recorder = executor.recorder
    max_steps = args.max_steps or bridge.shadow.max_episode_steps
    console = Console(width=max(Console().width, 120), highlight=False)
    _print_header(console, args, task, control_mode, max_steps, robot, setup, executor)
    refused_start = None
    episodes: list[EpisodeResult] = []
    records: list[dict[str, Any]] = []
    fault = None
    interrupted = False
    try:
        with _deploy_logging(args.verbose):
            for k in range(args.episodes):
                if k > 0 and hasattr(robot, "reset_episode"):
                    robot.reset_episode()
                if (refused_start := _check_start(robot, args, k)) is not None:
                    console.print(refused_start, soft_wrap=True)
                    break
                try:
                    result = executor.run_episode(max_steps)
                except ControlLoopFault as e:
                    fault = e
                    if recorder is not None:
                        recorder.discard_episode()
                    break
                if recorder is not None:
                    recorder.save_episode()
                episodes.append(result)
                records.append(_episode_record(k, result))
                if prm_log is not None:
                    records[-1].update(prm_log.last_episode)
                console.print(_episode_line(records[-1], args.episodes), soft_wrap=True)
                if supervisor.estopped:  # latched: no further episode starts without an operator
                    break
    except KeyboardInterrupt:  # Ctrl-C: in an episode the executor has held, disabled and latched already
        interrupted = True
        if not supervisor.estopped:  # between episodes: nothing has stopped the arm yet
            executor._emergency_stop()
            supervisor.latch("interrupted (Ctrl-C)", kind="estop")
        if recorder is not None:
            recorder.discard_episode()
    finally:
        executor.close()
        robot.disconnect()
        bridge.close()
        if hasattr(source, "close"):
            source.close()
        if previous_usr1 is not None:
            signal.signal(signal.SIGUSR1, previous_usr1)
    # in-process the "round trip" is the inference call itself
    round_trip = executor.round_trips.summary() if args.server is not None else source.latencies.summary()
    summary = {
        "task": task, "robot": args.robot, "policy": args.server or args.checkpoint, "episodes": len(episodes),
        "episodes_requested": args.episodes,
        "success_rate": float(np.mean([bool(e.success) for e in episodes]))
        if episodes and episodes[0].success is not None else None,
        "mean_return": float(np.mean([e.episode_return for e in episodes]))
        if episodes and episodes[0].episode_return is not None else None,
        "aborted": sum(e.aborted for e in episodes),
        "latched": supervisor.estop_reason if supervisor.estopped else None,
        "fault": str(fault) if fault is not None else None,
        "interrupted": interrupted,
        "steps": sum(e.steps for e in episodes),
        "holds": sum(e.holds for e in episodes),
        "clamped_steps": sum(e.clamped_steps for e in episodes),
        "late_chunks": sum(e.late_chunks for e in episodes),
        "refused_chunks": sum(e.refused_chunks for e in episodes),
        "interventions": dict(sorted(supervisor.interventions.items())),
        "changed": {"steps": supervisor.changed["steps"], "max_rad": supervisor.changed["max_rad"],
                    "mean_rad": supervisor.changed["sum_rad"] / max(supervisor.changed["steps"], 1)},
        "limits": {"max_joint_velocity": args.safety.max_joint_velocity,
                   "max_joint_acceleration": args.safety.max_joint_acceleration},
        "round_trip": round_trip,
        "control_jitter": executor.jitter.summary(),
        "inference_failures": sum(e.inference_failures for e in episodes),
        "first_failure": next((e.failure_reason for e in episodes if e.failure_reason), None),
        "dropped_frames": dict(getattr(source, "dropped", {})),
        "recorded": args.record,
        "reward": args.reward,
        "twin": ("blind" if setup is not None else "sighted") if args.robot == "twin" else None,
        "refused_start": refused_start,
        "operator_waits": sum(e.operator_waits for e in episodes),
        "per_episode": records,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    print_report(console, summary, args.json_out)
    if fault is not None:  # the arm is held and disabled; say so in one line and fail the command
        raise SystemExit(f"error: {fault}")
    if interrupted:
        raise SystemExit(130)
    return summary


HOLDS_HELP = ("a hold is a control tick on which the arm kept still (braking to rest through the supervisor) instead "
              "of acting, because no action for that tick had arrived in time: inference or the network was slower "
              "than the control period, or no fresh answer came for --safety.watchdog-s (after "
              "--safety.disable-after-s the arm is disabled and the run latches)")


def _ms(stats: dict[str, Any], key: str) -> str:
    return f"{stats[key]:.1f} ms" if key in stats else "-"


def safety_line(summary: dict[str, Any]) -> str:
    """What the supervisor changed: on how many acting steps, by how much (the largest joint's distance from the
    policy's target), which limits, and every other intervention."""
    limits, changed = summary["limits"], summary["changed"]
    acting = summary["steps"] - summary["holds"]
    limit_text = (f"limits {limits['max_joint_velocity']:g} rad/s, {limits['max_joint_acceleration']:g} rad/s^2; "
                  "--verbose logs each one")
    kinds = ", ".join(f"{k} {v}" for k, v in summary["interventions"].items()) or "none"
    if not changed["steps"]:
        return f"safety: every command reached the arm as the policy asked; interventions: {kinds} ({limit_text})"
    return (f"safety: the supervisor moved {changed['steps']} of {acting} commands ({changed['steps'] / max(acting, 1):.0%}) "
            f"away from the policy's target, by {changed['mean_rad']:.3f} rad on average and {changed['max_rad']:.3f} rad "
            f"({math.degrees(changed['max_rad']):.1f} deg) at most (largest joint); interventions: {kinds} ({limit_text}). "
            "A policy trained in the arm's profile (--obs-mode lerobot) is held to the same servo limits in simulation")


def print_report(console: Console, summary: dict[str, Any], json_out: str | None) -> None:
    """The per-episode table and a readable summary (the full numbers are in --json-out)."""
    table = Table(title=f"{summary['task']} on the {summary['robot']}", title_justify="left")
    for column in ("episode", "steps", "success", "return", "holds", "clamped", "refused", "late", "ended"):
        table.add_column(column, justify="left" if column in ("success", "ended") else "right")
    for r in summary["per_episode"]:
        ended = f"aborted: {r['abort_reason']}" if r["aborted"] else "ok"
        table.add_row(str(r["episode"] + 1), str(r["steps"]), _yes_no(r["success"]),
                      "-" if r["return"] is None else f"{r['return']:.1f}", str(r["holds"]), str(r["clamped_steps"]),
                      str(r["refused_chunks"]), str(r["late_chunks"]), ended)
    console.print(table)
    n, steps = summary["episodes"], summary["steps"]
    lines = [f"episodes: {n} of {summary['episodes_requested']} ran, {summary['aborted']} aborted"]
    if summary["success_rate"] is not None:
        lines.append(f"success: {round(summary['success_rate'] * n)}/{n} ({summary['success_rate']:.0%})"
                     + (f", mean return {summary['mean_return']:.1f}" if summary["mean_return"] is not None else ""))
    lines.append(f"holds: {summary['holds']} of {steps} steps; {HOLDS_HELP}" if summary["holds"] else "holds: none")
    lines.append(safety_line(summary))
    rt, jitter = summary["round_trip"], summary["control_jitter"]
    lines.append(f"timing: round trip median {_ms(rt, 'median_ms')}, p99 {_ms(rt, 'p99_ms')}; control jitter p99 "
                 f"{_ms(jitter, 'p99_ms')}; {summary['late_chunks']} late and {summary['refused_chunks']} refused answers, "
                 f"{summary['inference_failures']} failed requests")
    if summary.get("first_failure"):
        lines.append(f"failed requests: {summary['inference_failures']}, the first because {summary['first_failure']}")
    if summary["dropped_frames"]:
        lines.append(f"dropped frames (not answers to our requests): {summary['dropped_frames']}")
    if summary["latched"]:
        lines.append(f"[bold red]LATCHED[/]: {summary['latched']}; the arm was held and disabled and no further episode "
                     f"ran. Fix the cause, re-enable the robot and start rlrobot deploy again")
    if summary["interrupted"]:
        lines.append("[bold red]INTERRUPTED[/] (Ctrl-C): the arm was held and disabled")
    if summary["recorded"]:
        lines.append(f"recorded: {summary['recorded']}")
    lines.append(f"full report: {json_out}" if json_out else "full report as JSON: --json-out FILE")
    for line in lines:
        console.print(line, soft_wrap=True)
