"""``rlrobot collect``: scripted-expert demonstrations of a native task, written as a LeRobotDataset (the layout in
``rlrobot.data.demonstrations``); ``--recipe`` writes one of the offline-RL dataset recipes (``rlrobot.data.recipes``:
expert, noisy at several levels, mixed, play). Every frame stores reward, success, ``next.done`` (LeRobot's) and
``next.terminated`` / ``next.truncated`` apart (an MDP end vs a time-out), and ``next.observation.state`` (s', the true
final observation where an episode ended, so a time-out bootstraps from it).

``--obs-mode lerobot`` collects in the LeRobot SO-101 profile (``tasks/profile.py``; ``--setup`` the station's setup):
``observation.state`` and ``action`` hold the six ``<motor>.pos`` in LeRobot's units and names (absolute joint
targets: ``--control-mode joint_pos``), ``observation.images.<camera>`` the setup's cameras' frames, at 30 fps: the
layout a real arm's ``lerobot-record`` dataset has, plus the simulator's reward and success columns. The privileged
state is not stored (no real arm's dataset has it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

import rlrobot
from rlrobot.data.demonstrations import INSTRUCTION_KEYS, RLROBOT_META, image_feature, obs_feature
from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter
from rlrobot.data.recipes import BehaviourPolicy, Recipe, recipe
from rlrobot.data.transitions import NEXT_STATE
from rlrobot.runners.evaluation import EpisodeSlots
from rlrobot.tasks.profile import PROFILE_OBS_MODE, STATE_NAMES, is_privileged
from rlrobot.tasks.registry import native_task_ids, task_spec, validate_task_modes
from rlrobot.tasks.so101_suite import check_task_instruction

console = Console(soft_wrap=True)  # long lines stay one line in logs (CI, nohup), not wrapped at 80 columns


@dataclass
class CollectArgs:
    task: str
    """native task id with a scripted expert: so101-reach | so101-push | so101-lift"""
    episodes: int = 0
    """episodes to write (successful ones only with --success-only); 0 = the recipe's default (required without --recipe)"""
    out: str = ""
    """dataset directory (must not exist or be empty)"""
    recipe: str = ""
    """offline-RL dataset recipe: expert | noisy-low | noisy | noisy-high | mixed | play (rlrobot datasets --recipes);
    '' = the expert with --noise"""
    noise: float = 0.0
    """std of Gaussian noise added to the expert's actions (in the normalised action space) before execution"""
    label: str = "executed"
    """what a frame's `action` is: executed (the action the env ran: offline RL needs it) | expert (the scripted
    expert's noise-free action at the visited state while the env runs the noisy one, as DART collects: states that
    drift off the expert's path, labelled with how the expert recovers, for SFT / BC; the executed action is kept as
    `action.executed`)"""
    success_only: bool = False
    """keep only episodes that end in success"""
    obs_mode: str = "state"
    control_mode: str = "ee_delta"
    num_envs: int = 8
    seed: int = 0
    image_size: int = 64
    max_attempts: int = 0
    """give up after this many episodes (0 = 20 x episodes)"""
    instruction: str | None = None
    """language-suite tasks: record only this instruction (`rlrobot list-tasks --instructions TASK`)"""
    setup: str = ""
    """the station's setup file (tasks/setup.py): its cameras, randomisation, control rate, spawn regions"""


def collect_demonstrations(args: CollectArgs) -> dict[str, Any]:
    experts = [t for t in native_task_ids() if task_spec(t).has_expert]
    if args.task not in experts:
        raise ValueError(f"task={args.task!r}: scripted experts exist for the native tasks {experts}")
    validate_task_modes(args.task, obs_mode=args.obs_mode, control_mode=args.control_mode)

    if args.recipe:
        rec = recipe(args.recipe)  # an unknown name is refused with the recipes
        if args.noise:
            raise ValueError(f"noise does not apply with recipe={args.recipe!r} (the recipe sets it: {rec.noise})")
        args.episodes = args.episodes or rec.episodes
    else:
        rec = Recipe("", "expert with --noise", noise=args.noise)
    if not args.out:
        raise ValueError("out: the dataset directory is required (--out DIR)")
    if args.episodes < 1 or args.num_envs < 1:
        raise ValueError(f"episodes and num_envs must be >= 1, got {args.episodes} and {args.num_envs}")
    if args.noise < 0:
        raise ValueError(f"noise must be >= 0, got {args.noise}")
    if args.label not in ("executed", "expert"):
        raise ValueError(f"label={args.label!r} is not one of: executed, expert")
    if args.obs_mode == PROFILE_OBS_MODE and args.control_mode != "joint_pos":
        raise ValueError(f"obs_mode={PROFILE_OBS_MODE!r} records LeRobot's action, absolute joint targets: pass "
                         f"--control-mode joint_pos (got {args.control_mode!r})")
    options: dict[str, Any] = {"setup": args.setup} if args.setup else {}
    if args.instruction is not None:
        check_task_instruction(args.task, args.instruction)
        options["instruction"] = args.instruction
    env = rlrobot.make(args.task, args.num_envs, seed=args.seed, obs_mode=args.obs_mode,
                       control_mode=args.control_mode, image_size=args.image_size, **options)
    try:
        return _collect(env, args, rec)
    finally:
        env.close()


def _collect(env, args: CollectArgs, rec) -> dict[str, Any]:
    obs_space = env.single_observation_space
    action_dim = int(env.single_action_space.shape[0])
    profile = args.obs_mode == PROFILE_OBS_MODE
    names = list(STATE_NAMES) if profile else None  # the profile's state and action: LeRobot's <motor>.pos
    stored = env.units.normalized_to_profile if profile else (lambda a: a)  # joint_pos action -> LeRobot's units
    features: dict[str, dict[str, Any]] = {}
    for key, space in obs_space.spaces.items():
        if key in INSTRUCTION_KEYS or is_privileged(key):  # the task string holds the instruction; no real arm's
            continue  # dataset has the simulator's privileged state
        if key == "state":
            features["observation.state"] = {"dtype": "float32", "shape": list(space.shape), "names": names}
        else:
            c, h, w = space.shape
            features[image_feature(key)] = {"dtype": "image", "shape": [h, w, c], "names": ["height", "width", "channels"]}
    features["action"] = {"dtype": "float32", "shape": [action_dim], "names": names}
    expert_labels = args.label == "expert"
    if expert_labels:
        features["action.executed"] = {"dtype": "float32", "shape": [action_dim], "names": names}
    if "state" in obs_space.spaces:  # s' of every frame, the true final observation at an episode's end
        features[NEXT_STATE] = {"dtype": "float32", "shape": list(obs_space["state"].shape), "names": None}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    features["next.success"] = {"dtype": "bool", "shape": [1], "names": None}
    features["next.terminated"] = {"dtype": "bool", "shape": [1], "names": None}
    features["next.truncated"] = {"dtype": "bool", "shape": [1], "names": None}
    fps = 1.0 / float(env.control_dt)
    writer = LeRobotDatasetWriter(args.out, fps=round(fps, 6), features=features, robot_type="so101_follower")
    instruction = env.instruction[0]
    behaviour = BehaviourPolicy(rec, env.num_envs, args.seed)
    buffers: list[list[dict[str, Any]]] = [[] for _ in range(env.num_envs)]
    attempted, kept = 0, 0
    outcomes: list[bool] = []
    kept_success: list[bool] = []
    kept_returns: list[float] = []
    modes: dict[str, int] = {}
    max_attempts = args.max_attempts or 20 * args.episodes
    # without --success-only, a fixed set of episodes (each env's first ones, round robin), not the first to finish:
    # those would over-represent the short episodes wherever failures end early (a lost cube)
    slots = None if args.success_only else EpisodeSlots(args.episodes, env.num_envs)
    obs, _ = env.reset(seed=args.seed)
    while kept < args.episodes:
        if attempted >= max_attempts:
            raise ValueError(f"only {kept} of {args.episodes} episodes kept after {attempted} attempts "
                               f"(success_only={args.success_only}, noise={args.noise}): lower --noise")
        action = behaviour.act(env)
        next_obs, reward, terminated, truncated, info = env.step(action)
        done = (terminated | truncated).numpy()
        host = {k: v.numpy() for k, v in obs.items() if k not in INSTRUCTION_KEYS and not is_privileged(k)}
        if NEXT_STATE in features:  # same-step autoreset: an ended episode's s' is info["final_obs"], not next_obs
            next_state = np.where(done[:, None], info["final_obs"]["state"].numpy(), next_obs["state"].numpy())
        label = behaviour.expert_label if expert_labels else action
        for i in range(env.num_envs):
            frame: dict[str, Any] = {"action": stored(label[i].numpy()).astype(np.float32),
                                     "next.reward": np.array([reward[i].item()], np.float32),
                                     "next.done": np.array([bool(done[i])]),
                                     "next.success": np.array([bool(info["success"][i])]),
                                     "next.terminated": np.array([bool(terminated[i])]),
                                     "next.truncated": np.array([bool(truncated[i])])}
            if expert_labels:
                frame["action.executed"] = stored(action[i].numpy()).astype(np.float32)
            if NEXT_STATE in features:
                frame[NEXT_STATE] = next_state[i].astype(np.float32)
            for key, value in host.items():
                frame[obs_feature(key)] = value[i] if key == "state" else value[i].transpose(1, 2, 0)
            buffers[i].append(frame)
        if "episode" in info:
            ended = info["episode"]["env_ids"].tolist()
            # multi-task suites report each finished episode's own instruction (its env has already drawn a new one)
            texts = info["episode"].get("instruction", [instruction] * len(ended))
            counted = (slots.assign(info["episode"]["env_ids"]) >= 0).tolist() if slots else [True] * len(ended)
            for env_id, success, ret, mode, text, counts in zip(ended, info["episode"]["success"].tolist(),
                                                                info["episode"]["return"].tolist(),
                                                                behaviour.mode_names(ended), texts, counted, strict=True):
                attempted += 1
                outcomes.append(bool(success))
                frames, buffers[env_id] = buffers[env_id], []
                if kept >= args.episodes or not counts or (args.success_only and not success):
                    continue
                for f in frames:
                    writer.add_frame(f, text)
                writer.save_episode()
                kept += 1
                kept_success.append(bool(success))
                kept_returns.append(float(ret))
                modes[mode] = modes.get(mode, 0) + 1
            behaviour.new_episodes(np.asarray(ended))
        obs = next_obs
    meta = {"task": args.task, "control_mode": args.control_mode, "obs_mode": args.obs_mode,
            "action_dim": action_dim, "observation_space": {k: list(v.shape) for k, v in obs_space.spaces.items()},
            "max_episode_steps": env.max_episode_steps, "control_dt": float(env.control_dt), "expert_noise": rec.noise,
            "action_label": args.label, "success_only": args.success_only, "episodes_attempted": attempted,
            "expert_success_rate": float(np.mean(outcomes)), "seed": args.seed,
            "recipe": args.recipe or None, "recipe_summary": rec.summary if args.recipe else None,
            "episode_behaviours": modes, "success_rate": float(np.mean(kept_success)),
            "return_mean": float(np.mean(kept_returns))}
    if env.setup is not None:  # the scene it was collected in, and the profile's units
        meta.update(use_degrees=env.setup.use_degrees, setup=env.setup.to_dict())
    (Path(args.out) / RLROBOT_META).write_text(json.dumps(meta, indent=2))
    summary = {"out": args.out, "episodes": kept, "frames": writer.total_frames, **meta}
    what = f"recipe {args.recipe}" if args.recipe else "expert"
    if args.success_only:
        how = f"the first {kept} successes of {attempted} episodes run (success {meta['expert_success_rate']:.2f})"
    else:
        low, high = kept // env.num_envs, -(-kept // env.num_envs)
        quota = f"{high}" if low == high else f"{low}-{high}"
        how = (f"each env's first {quota}, not the first to finish ({attempted} ran on {env.num_envs} envs at once, "
               f"{attempted - kept} dropped; success over all {meta['expert_success_rate']:.2f})")
    console.print(f"wrote {kept} episodes ({writer.total_frames} frames) to {args.out} ({what}): success "
                  f"{meta['success_rate']:.2f}, return {meta['return_mean']:.2f}; kept {how}")
    return summary
