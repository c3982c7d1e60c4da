"""What a policy's actor reads against what a robot provides: ``rlrobot deploy`` refuses at start, in one line,
instead of inventing a missing observation.

A policy trained in the LeRobot profile (``--obs-mode lerobot``; its observation space holds ``privileged_state``)
may read ``state`` (the six joint readings), ``image_<camera>`` for the robot's cameras, and the instruction's
``instruction_tokens`` / ``instruction_embedding``. A ``privileged_*`` key is refused on every robot, the twin
included: the profile's twin is blind, as the real arm is.

A policy trained on ``--obs-mode state`` reads the task's simulator state. The twin gives it (a sighted twin: its
figures say nothing about a real arm). A real arm gives only the joints, so its ``state`` is privileged there unless
the task's state is made of the arm's readings and what the robot's ``context`` holds (``SO101Env.state_context``:
so101-reach with ``--target``); camera keys of those modes come from the model's cameras, which a real arm has not.
"""

from __future__ import annotations

from typing import Any

from rlrobot.tasks.profile import IMAGE_PREFIX, LANGUAGE_KEYS, PRIVILEGED_KEY, STATE_KEY, is_privileged


def is_profile_policy(metadata: dict[str, Any]) -> bool:
    """A policy trained in the LeRobot profile (its env's observation space has the privileged state beside)."""
    return PRIVILEGED_KEY in (metadata.get("observation_space") or {})


def actor_keys(metadata: dict[str, Any]) -> list[str]:
    """The observation keys the policy's actor reads (the policy spec's read keys, carried in its metadata)."""
    keys = metadata.get("obs_keys")
    if not keys:
        raise ValueError("the policy's metadata does not say which observations its actor reads (obs_keys): refused")
    return [str(k) for k in keys]


def camera_problem(key: str, robot: str, cameras: set[str], camera_map: dict[str, str] | None) -> str | None:
    """Why the robot gives no frames for the policy's camera key ``key`` (one line), or None."""
    name = key[len(IMAGE_PREFIX):]
    robot_name = (camera_map or {}).get(name, name)
    if robot_name in cameras:
        return None
    have = ", ".join(sorted(cameras)) or "none"
    mapped = f" (mapped onto the robot's {robot_name!r})" if robot_name != name else ""
    fix = (f"--camera-map {name}=ROBOT_CAMERA names the robot's camera that gives it" if robot == "twin" else
           f"configure it: --lerobot-cameras {robot_name}=INDEX_OR_PATH or the setup file's cameras, or --camera-map "
           f"{name}=ROBOT_CAMERA")
    return (f"the policy reads camera {name!r} ({key}){mapped}, which the {robot} robot does not provide (its cameras: "
            f"{have}): refused ({fix})")


def observation_problem(metadata: dict[str, Any], robot: str, cameras: set[str], context: set[str],
                        camera_map: dict[str, str] | None = None) -> str | None:
    """Why ``robot`` ("twin" | "lerobot") cannot give the actor what it reads (one line), or None. ``cameras``: the
    camera names the robot provides (the sighted twin: the task's model cameras); ``context``: the task-context keys
    it reports (a real arm: what the user gave); ``camera_map`` {policy camera: robot camera} where the names
    differ."""
    keys = actor_keys(metadata)
    task = metadata.get("task", "?")
    if is_profile_policy(metadata):
        for key in keys:
            if is_privileged(key):
                return (f"the policy's actor reads the privileged observation {key!r} (the simulator's task state), which "
                        f"no {'blind twin' if robot == 'twin' else 'real arm'} provides: refused (privileged keys are for "
                        f"critics and teachers; train the actor on state and image_<camera>)")
            if key.startswith(IMAGE_PREFIX) and (problem := camera_problem(key, robot, cameras, camera_map)):
                return problem
            if key not in (STATE_KEY, *LANGUAGE_KEYS) and not key.startswith(IMAGE_PREFIX):
                return f"the policy reads {key!r}, which is not an observation of the LeRobot profile: refused"
        return None
    if robot == "twin":  # the sighted twin: the task's own simulation gives every key of its obs mode, its cameras
        for key in keys:  # rendered as in training
            if key.startswith(IMAGE_PREFIX) and (problem := camera_problem(key, robot, cameras, camera_map)):
                return problem
        return None
    from rlrobot.tasks.registry import task_spec

    entry = task_spec(task).entry_point
    needed = getattr(entry, "state_context", None)
    for key in keys:
        if key == STATE_KEY:
            if needed is None:
                return (f"the policy's actor reads 'state', which for {task} holds simulator facts (object poses, "
                        f"contacts) that no real arm reports: a privileged observation, refused (train it with "
                        f"--obs-mode lerobot)")
            missing = [k for k in needed if k not in context]
            if missing:
                return (f"the policy's actor reads 'state', which for {task} needs {', '.join(missing)} beside the joints "
                        f"and the robot reports {', '.join(sorted(context)) or 'none of them'}: refused, never made up "
                        f"(so101-reach: --target X Y Z; other tasks: train with --obs-mode lerobot)")
        elif key not in LANGUAGE_KEYS:
            return (f"the policy reads {key!r}, which a real arm does not provide to a policy trained on "
                    f"--obs-mode state/rgb: refused (train with --obs-mode lerobot and the setup's cameras)")
    return None
