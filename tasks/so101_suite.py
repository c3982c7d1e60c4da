"""A language-conditioned multi-task SO-101 suite (LIBERO-like): several objects, a bin and a bowl, coloured zones.

Four task families, each with templated instructions whose words decide what success is:

* ``so101-pick-place``: "put the {colour} {cube|cylinder} in the {bin|bowl}", among two distractor objects;
* ``so101-push-to``: "push the {colour} cube to the {colour} zone", with a distractor cube and two other zones;
* ``so101-stack``: "stack the {colour} cube on the {colour} cube", with a distractor cube;
* ``so101-long-horizon``: "put the {colour} cube in the {bin|bowl}, then push the {colour} cube to the {colour}
  zone": two subtasks in sequence; ``info["subtask_index"]`` (subtasks completed, in order) and
  ``info["subtask_done"]`` (each subtask's condition in the current state) are the ground truth a process reward
  model or a task manager is judged against. The index advances only in a step where the current subtask's done
  flag holds, by at most one per step.

``so101-suite`` draws a family and an instruction per env per episode (again at every autoreset), so one batch trains
all of them. Success is judged on the instructed goal only: the red cube in the bowl fails "put the red cube in the
bin". Place and stack count only once the gripper has let go. Each env's episode statistics carry its family and
instruction (``info["episode"]["family"]``, ``["instruction"]``) for the per-family tables of ``rlrobot eval``.

Observations: ``state`` (arm, all object poses, container and zone positions, jaw contacts; no goal: the goal is in
the words), ``instruction_tokens`` (int64 ids, ``rlrobot.envs.language``) and ``instruction_embedding`` (384-d
all-MiniLM-L6-v2, read from a shipped table: the encoder never runs here). The scripted IK experts read the
privileged task spec (not the words) and succeed >= 0.95 per family.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch

from rlrobot.envs.language import EMBEDDING_DIM, InstructionEmbeddings, Vocabulary
from rlrobot.tasks.registry import TaskSpec, register_task

from .mujoco_vec_env import REWARD_MODES
from .so101 import (
    ASSETS,
    CONTROL_MODES,
    CUBE_HALF,
    PUSH_GRIPPER_ACTION,
    PUSHER_HALF_WIDTH,
    SO101_OBS_MODES,
    SO101Env,
    _wrap,
    check_option,
    push_contact_pose,
)

COLOURS = ("red", "green", "blue", "yellow")
OBJECTS = (("cube", "red"), ("cube", "green"), ("cube", "blue"), ("cube", "yellow"), ("cylinder", "red"),
           ("cylinder", "blue"))
OBJECT_NAMES = tuple(f"{s}_{c}" for s, c in OBJECTS)
CUBES = (0, 1, 2, 3)
CONTAINERS = ("bin", "bowl")
FAMILIES = ("pick-place", "push-to", "stack", "long-horizon")
PLACE, PUSH, STACK = 0, 1, 2  # subtask kinds
TEMPLATES = {
    "pick-place": "put the {colour} {cube|cylinder} in the {bin|bowl}",
    "push-to": "push the {colour} cube to the {colour} zone",
    "stack": "stack the {colour} cube on the {colour} cube",
    "long-horizon": "put the {colour} cube in the {bin|bowl}, then push the {colour} cube to the {colour} zone",
}
MAX_SUBTASKS = 2
PARK = np.array([[-0.22, y, CUBE_HALF] for y in (-0.25, -0.15, -0.05, 0.05, 0.15, 0.25)])  # unused objects
UNDER_TABLE = np.array([0.0, 0.0, -0.5])  # unused containers and zones
CONTAINER_INNER = 0.03  # |object centre - container centre| per axis for "in" (inner half-width 0.037)
ZONE_RADIUS = 0.03
STACK_TOLERANCE = 0.015
MAX_TOKENS = 24
EMBEDDINGS_TABLE = ASSETS / "so101_suite_instructions.npz"
TRANSPORT_Z = 0.10  # TCP height while carrying (objects stand 3 cm, container walls 2.8 cm)


# ---------------------------------------------------------------------------------------------- instructions
def _object_phrase(obj: int) -> str:
    shape, colour = OBJECTS[obj]
    return f"the {colour} {shape}"


def subtask_phrase(kind: int, obj: int, goal: int) -> str:
    if kind == PLACE:
        return f"put {_object_phrase(obj)} in the {CONTAINERS[goal]}"
    if kind == PUSH:
        return f"push {_object_phrase(obj)} to the {COLOURS[goal]} zone"
    return f"stack {_object_phrase(obj)} on {_object_phrase(goal)}"


def describe(kinds: np.ndarray, objs: np.ndarray, goals: np.ndarray, num: int) -> str:
    """The instruction of one task spec (subtasks joined by ", then")."""
    return ", then ".join(subtask_phrase(int(kinds[s]), int(objs[s]), int(goals[s])) for s in range(num))


def family_specs(family: str) -> list[tuple[tuple[int, int, int], ...]]:
    """Every task spec of a family: tuples of (kind, object, goal) subtasks."""
    if family == "pick-place":
        return [((PLACE, o, c),) for o in range(len(OBJECTS)) for c in range(len(CONTAINERS))]
    if family == "push-to":
        return [((PUSH, o, z),) for o in CUBES for z in range(len(COLOURS)) if z != o]
    if family == "stack":
        return [((STACK, a, b),) for a in CUBES for b in CUBES if a != b]
    if family == "long-horizon":
        return [((PLACE, a, c), (PUSH, b, z)) for a in CUBES for c in range(len(CONTAINERS)) for b in CUBES if b != a
                for z in range(len(COLOURS)) if z != b]
    raise ValueError(f"family={family!r} is not one of {FAMILIES}")


def _spec_text(spec: tuple[tuple[int, int, int], ...]) -> str:
    k, o, g = (np.array(x) for x in zip(*spec, strict=True))
    return describe(k, o, g, len(spec))


def all_instructions() -> list[str]:
    return [_spec_text(spec) for family in FAMILIES for spec in family_specs(family)]


def check_task_instruction(task: str, instruction: str | None) -> None:
    """One-line ValueError unless ``instruction`` is None or one of the suite task ``task``'s instructions."""
    if instruction is None:
        return
    if task not in SUITE_TASKS:
        raise ValueError(f"instruction is for the language-suite tasks {sorted(SUITE_TASKS)}, not task={task!r}")
    SUITE_TASKS[task].check_instruction(instruction)


VOCABULARY = Vocabulary.from_texts(all_instructions(), MAX_TOKENS)
ENTITY_NAMES = (*(f"{c} {s}" for s, c in OBJECTS), *CONTAINERS, *(f"{c} zone" for c in COLOURS))
"""every entity of ``SO101Suite.state_entities`` by its words, in that order"""


# ---------------------------------------------------------------------------------------------- layout geometry
def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    t = np.clip(np.dot(p - a, ab) / max(np.dot(ab, ab), 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(p - (a + t * ab)))


class _Layout:
    """Rejection sampling of xy positions on the table sector the arm reaches."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.placed: list[tuple[np.ndarray, float]] = []  # (xy, clearance radius)
        self.corridors: list[tuple[np.ndarray, np.ndarray]] = []

    def sample(self, radius: tuple[float, float], angle: tuple[float, float], clearance: float,
               corridor_clearance: float, tries: int = 400) -> np.ndarray:
        for _ in range(tries):
            r, a = self.rng.uniform(*radius), self.rng.uniform(*angle)
            p = np.array([r * np.cos(a), r * np.sin(a)])
            if self.fits(p, clearance, corridor_clearance):
                self.placed.append((p, clearance))
                return p
        raise RuntimeError("could not lay out the scene")  # not reached with the ranges below (tested)

    def fits(self, p: np.ndarray, clearance: float, corridor_clearance: float) -> bool:
        if any(np.linalg.norm(p - q) < clearance + c for q, c in self.placed):
            return False
        return all(_segment_distance(p, a, b) >= corridor_clearance for a, b in self.corridors)


# ---------------------------------------------------------------------------------------------- the env
class SO101Suite(SO101Env):
    """The multi-task suite; subclasses fix the families it samples from."""

    task_name = "so101-suite"
    xml_path = str(ASSETS / "so101_suite.xml")
    tracked_bodies = OBJECT_NAMES
    randomized_geoms = OBJECT_NAMES
    randomized_bodies = OBJECT_NAMES
    contact_sensors = tuple(f"{j}_jaw_{n}" for n in OBJECT_NAMES for j in ("fixed", "moving"))
    sized_geoms = ()  # the layout places every object by CUBE_HALF
    families: tuple[str, ...] = FAMILIES
    family_names: tuple[str, ...] = FAMILIES  # what ``info["episode"]["family"]`` indexes (rlrobot eval's tables)
    default_max_episode_steps = 150
    state_dim = 6 + 6 + 3 + 3 + 3 + len(OBJECTS) * 7 + 2 * 3 + 4 * 2 + len(OBJECTS) * 2

    # where each entity's features sit in ``state`` (``_state_obs``): flow.state_entities of the suite presets, so
    # the policy's entity attention reads objects (position, orientation, jaw contacts), containers and zones
    _arm_dims = 6 + 6 + 3 + 3 + 3
    _quat_start = _arm_dims + 3 * len(OBJECTS)
    _container_start = _quat_start + 4 * len(OBJECTS)
    _zone_start = _container_start + 3 * len(CONTAINERS)
    _contact_start = _zone_start + 2 * len(COLOURS)
    entity_name_tokens = tuple(" ".join(str(int(i)) for i in ids if i) for ids in VOCABULARY.encode(ENTITY_NAMES))
    """flow.entity_names of the suite presets: ENTITY_NAMES as instruction token ids"""
    tcp_index = 6 + 6  # the gripper's xyz in ``state`` (after joint positions and velocities): flow.entity_anchor
    state_entities = (f"{_arm_dims}:{len(OBJECTS)}:3+{_quat_start}:{len(OBJECTS)}:4+{_contact_start}:{len(OBJECTS)}:2",
                      f"{_container_start}:{len(CONTAINERS)}:3", f"{_zone_start}:{len(COLOURS)}:2")

    def __init__(self, num_envs: int, *, swapped_instruction: bool = False, instruction: str | None = None,
                 **kw: Any):
        """``swapped_instruction``: every episode shows the policy a colour-swapped instruction
        (``colour_swapped_spec``) and still judges success on the task it drew: a policy that follows the words
        then succeeds at about chance (the wrong-instruction check of the suite). ``instruction``: draw only this
        one task of the suite (one of ``instructions()``; the scene's layout, distractors and physics are still
        randomised per episode), LIBERO's sense of a task; None draws every instruction of ``families``."""
        self.check_instruction(instruction)
        n = num_envs
        self.swapped_instruction = swapped_instruction
        self.family = np.zeros(n, np.int64)
        self.num_subtasks = np.ones(n, np.int64)
        self.subtask_kind = np.zeros((n, MAX_SUBTASKS), np.int64)
        self.subtask_obj = np.zeros((n, MAX_SUBTASKS), np.int64)
        self.subtask_goal = np.zeros((n, MAX_SUBTASKS), np.int64)
        # the expert's own copy of the spec: ``relabel`` changes the instructed task, not what the expert does
        self.expert_kind = np.zeros((n, MAX_SUBTASKS), np.int64)
        self.expert_obj = np.zeros((n, MAX_SUBTASKS), np.int64)
        self.expert_goal = np.zeros((n, MAX_SUBTASKS), np.int64)
        self.expert_num = np.ones(n, np.int64)
        self.subtask_index = np.zeros(n, np.int64)
        self.subtask_done = np.zeros((n, MAX_SUBTASKS), bool)
        self.container_pos = np.tile(UNDER_TABLE, (n, len(CONTAINERS), 1))
        self.zone_pos = np.tile(UNDER_TABLE, (n, len(COLOURS), 1))
        self.push_dir = np.tile([1.0, 0.0], (n, 1))
        self.expert_subtask = np.zeros(n, np.int64)
        self._instructions = [" | ".join(TEMPLATES[f] for f in self.families)] * n  # until reset draws the tasks
        self._tokens = np.zeros((n, VOCABULARY.max_length), np.int64)
        self._embedding = np.zeros((n, EMBEDDING_DIM), np.float32)
        self._embeddings = InstructionEmbeddings(EMBEDDINGS_TABLE)
        self._family_ids = np.array([FAMILIES.index(f) for f in self.families], np.int64)
        self._specs = {f: family_specs(f) for f in self.families}
        if instruction is not None:  # keep the one spec whose words are the instruction
            self._specs = {f: [sp for sp in specs if _spec_text(sp) == instruction] for f, specs in self._specs.items()}
            self._family_ids = np.array([FAMILIES.index(f) for f, specs in self._specs.items() if specs], np.int64)
        self._advance = False
        super().__init__(num_envs, **kw)
        m = self.model
        self._container_mocap = [m.body(c).mocapid[0] for c in CONTAINERS]
        self._zone_mocap = [m.body(f"zone_{c}").mocapid[0] for c in COLOURS]
        self._obj_qadr = [m.jnt_qposadr[m.joint(name).id] for name in OBJECT_NAMES]
        spaces = dict(self.single_observation_space.spaces)
        spaces["instruction_tokens"] = gymnasium.spaces.Box(0, len(VOCABULARY) - 1, (VOCABULARY.max_length,), np.int64)
        spaces["instruction_embedding"] = gymnasium.spaces.Box(-1.0, 1.0, (EMBEDDING_DIM,), np.float32)
        self.single_observation_space = gymnasium.spaces.Dict(spaces)

    # ------------------------------------------------------------ instructions
    @classmethod
    def instructions(cls) -> list[str]:
        """Every instruction this task draws from (its families' task specs)."""
        return [_spec_text(spec) for family in cls.families for spec in family_specs(family)]

    @classmethod
    def check_instruction(cls, instruction: str | None) -> None:
        """One-line ValueError unless ``instruction`` is None or one of ``instructions()``."""
        if instruction is None:
            return
        allowed = cls.instructions()
        if instruction not in allowed:
            shown = ", ".join(repr(t) for t in allowed[:4])
            raise ValueError(f"instruction={instruction!r} is not one of the {len(allowed)} instructions of "
                             f"{cls.task_name} ({shown}, ...; rlrobot list-tasks --instructions {cls.task_name})")

    @property
    def instruction(self) -> list[str]:
        return list(self._instructions)

    @classmethod
    def instruction_observation(cls, texts: list[str]) -> dict[str, np.ndarray]:
        """The tensor forms of instructions (what the env observes; datasets are re-encoded with this)."""
        return {"instruction_tokens": VOCABULARY.encode(texts),
                "instruction_embedding": InstructionEmbeddings(EMBEDDINGS_TABLE)(texts)}

    def _set_instructions(self, ids: np.ndarray) -> None:
        specs = [self.colour_swapped_spec(int(i)) if self.swapped_instruction else
                 (self.subtask_kind[i], self.subtask_obj[i], self.subtask_goal[i], int(self.num_subtasks[i])) for i in ids]
        texts = [describe(*spec) for spec in specs]
        for i, t in zip(ids, texts, strict=True):
            self._instructions[i] = t
        self._tokens[ids] = VOCABULARY.encode(texts)
        self._embedding[ids] = self._embeddings(texts)

    def colour_swapped_spec(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """A wrong instruction for env i's scene, in the suite's instruction set: the object to place becomes another
        object on the table, the zone another zone on the table, the two cubes of a stack swap places."""
        kinds, objs, goals = self.subtask_kind[i].copy(), self.subtask_obj[i].copy(), self.subtask_goal[i].copy()
        num = int(self.num_subtasks[i])
        on_table = [o for o in range(len(OBJECTS)) if self.datas[i].qpos[self._obj_qadr[o]] > -0.1 and o not in objs[:num]]
        if kinds[0] == PLACE:
            pool = on_table if num == 1 else [o for o in on_table if o in CUBES]
            objs[0] = pool[0]
        elif kinds[0] == PUSH:
            zones = [z for z in range(len(COLOURS)) if self.zone_pos[i, z, 2] > -0.1 and z not in (goals[0], objs[0])]
            goals[0] = zones[0]
        else:
            objs[0], goals[0] = goals[0], objs[0]
        if num == 1:
            kinds[1], objs[1], goals[1] = kinds[0], objs[0], goals[0]
        return kinds, objs, goals, num

    def relabel(self, ids: np.ndarray, kinds: np.ndarray, objs: np.ndarray, goals: np.ndarray, num: np.ndarray) -> None:
        """Instruct envs ``ids`` to do another task in their current scene (success and the instruction follow; the
        scripted expert keeps doing the episode's original task): for wrong-instruction evaluations."""
        ids = np.asarray(ids)
        self.subtask_kind[ids], self.subtask_obj[ids], self.subtask_goal[ids] = kinds, objs, goals
        self.num_subtasks[ids] = num
        self.subtask_index[ids] = 0
        self._set_instructions(ids)

    # ------------------------------------------------------------ resets
    def _reset_task(self, ids: np.ndarray) -> None:
        rng = self.np_random
        for i in ids:
            family = FAMILIES[int(rng.choice(self._family_ids))]
            specs = self._specs[family]
            spec = specs[int(rng.integers(len(specs)))]
            self.family[i] = FAMILIES.index(family)
            self.num_subtasks[i] = self.expert_num[i] = len(spec)
            for s in range(MAX_SUBTASKS):
                k, o, g = spec[min(s, len(spec) - 1)]
                self.subtask_kind[i, s] = self.expert_kind[i, s] = k
                self.subtask_obj[i, s] = self.expert_obj[i, s] = o
                self.subtask_goal[i, s] = self.expert_goal[i, s] = g
            self._lay_out(int(i), family, spec)
        self.subtask_index[ids] = 0
        self.subtask_done[ids] = False
        self.expert_subtask[ids] = 0
        self._set_target(ids, np.tile(UNDER_TABLE, (len(ids), 1)))
        self._set_instructions(ids)

    def _lay_out(self, i: int, family: str, spec: tuple[tuple[int, int, int], ...]) -> None:
        """Place the episode's objects, containers and zones (the rest parked); retried until everything fits."""
        rng = self.np_random
        for _ in range(200):  # the long-horizon scene fits at about one try in four
            try:
                objects, containers, zones = self._sample_layout(rng, family, spec)
                break
            except RuntimeError:
                continue
        else:
            raise RuntimeError(f"could not lay out a {family} scene")
        d = self.datas[i]
        for o in range(len(OBJECTS)):
            adr = self._obj_qadr[o]
            if o in objects:
                yaw = rng.uniform(-np.pi / 4, np.pi / 4)
                d.qpos[adr:adr + 3] = (*objects[o], CUBE_HALF)
            else:
                yaw = 0.0
                d.qpos[adr:adr + 3] = PARK[o]
            d.qpos[adr + 3:adr + 7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        for c in range(len(CONTAINERS)):
            pos = np.array([*containers[c], 0.0]) if c in containers else UNDER_TABLE
            self.container_pos[i, c] = pos
            d.mocap_pos[self._container_mocap[c]] = pos
        for z in range(len(COLOURS)):
            pos = np.array([*zones[z], 0.0]) if z in zones else UNDER_TABLE
            self.zone_pos[i, z] = pos
            d.mocap_pos[self._zone_mocap[z]] = pos

    def _sample_layout(self, rng: np.random.Generator, family: str, spec) -> tuple[dict, dict, dict]:
        lay = _Layout(rng)
        objects: dict[int, np.ndarray] = {}
        containers: dict[int, np.ndarray] = {}
        zones: dict[int, np.ndarray] = {}
        wide = (-1.0, 1.0)
        for kind, obj, goal in spec:
            if kind == PUSH:  # the pushed cube, its zone and the corridor the pusher sweeps
                start = lay.sample((0.14, 0.18), (-0.6, 0.6), 0.035, 0.0)
                heading = np.arctan2(start[1], start[0]) + rng.uniform(-0.5, 0.5)
                direction = np.array([np.cos(heading), np.sin(heading)])
                end = start + rng.uniform(0.06, 0.08) * direction
                if np.linalg.norm(end) > 0.25 or not lay.fits(end, 0.035, 0.0):
                    raise RuntimeError
                objects[obj], zones[goal] = start, end
                lay.placed.append((end, 0.035))
                lay.corridors.append((start - 0.06 * direction, end))
        others = [z for z in rng.permutation(len(COLOURS)) if z not in zones]
        if family in ("pick-place", "long-horizon"):  # the walls stay clear of the pusher's corridor
            for c in range(len(CONTAINERS)):
                containers[c] = lay.sample((0.13, 0.21), (-1.1, 1.1), 0.05, 0.085)
        for z in others[: (2 if family == "push-to" else 1) if zones else 0]:  # other zones where a zone is named
            zones[int(z)] = lay.sample((0.12, 0.25), wide, 0.03, 0.04)
        for kind, obj, goal in spec:
            if kind in (PLACE, STACK) and obj not in objects:
                objects[obj] = lay.sample((0.125, 0.21), wide, 0.035, 0.06)
            if kind == STACK and goal not in objects:
                objects[goal] = lay.sample((0.125, 0.21), wide, 0.035, 0.06)
        pool = list(range(len(OBJECTS))) if family == "pick-place" else list(CUBES)
        distractors = [o for o in rng.permutation(pool) if o not in objects]
        for o in distractors[: 2 if family == "pick-place" else 1]:
            objects[int(o)] = lay.sample((0.125, 0.22), wide, 0.035, 0.06)
        return objects, containers, zones

    def _task_state(self) -> dict[str, np.ndarray]:
        return {**super()._task_state(), "family": self.family, "num_subtasks": self.num_subtasks,
                "subtask_kind": self.subtask_kind, "subtask_obj": self.subtask_obj, "subtask_goal": self.subtask_goal,
                "expert_kind": self.expert_kind, "expert_obj": self.expert_obj, "expert_goal": self.expert_goal,
                "expert_num": self.expert_num, "subtask_index": self.subtask_index, "container_pos": self.container_pos,
                "zone_pos": self.zone_pos, "push_dir": self.push_dir, "expert_subtask": self.expert_subtask}

    def _set_task_state(self, state: dict[str, np.ndarray]) -> None:
        super()._set_task_state(state)
        for key in ("family", "num_subtasks", "subtask_kind", "subtask_obj", "subtask_goal", "expert_kind", "expert_obj",
                    "expert_goal", "expert_num", "subtask_index", "container_pos", "zone_pos", "push_dir",
                    "expert_subtask"):
            getattr(self, key)[:] = state[key]
        self._set_instructions(np.arange(self.num_envs))

    # ------------------------------------------------------------ batched views
    @property
    def object_pos(self) -> np.ndarray:
        """[N, 6, 3]"""
        return self.body_pos

    def _rows(self) -> np.ndarray:
        return np.arange(self.num_envs)

    def _gripped(self) -> np.ndarray:
        """[N, 6]: both jaws touch the object."""
        return self.contacts.reshape(self.num_envs, len(OBJECTS), 2).all(-1)

    def _goal_point(self, kind: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """Where the object's centre should end up: container / zone centre, or on top of the base cube."""
        rows = self._rows()
        container = self.container_pos[rows, np.minimum(goal, len(CONTAINERS) - 1)] + [0.0, 0.0, CUBE_HALF + 0.004]
        zone = self.zone_pos[rows, np.minimum(goal, len(COLOURS) - 1)] + [0.0, 0.0, CUBE_HALF]
        top = self.body_pos[rows, goal] + [0.0, 0.0, 2 * CUBE_HALF]
        return np.where((kind == PLACE)[:, None], container, np.where((kind == PUSH)[:, None], zone, top))

    def _subtask_condition(self, kind: np.ndarray, obj: np.ndarray, goal: np.ndarray) -> np.ndarray:
        rows = self._rows()
        p = self.body_pos[rows, obj]
        released = ~self._gripped()[rows, obj]
        c = self.container_pos[rows, np.minimum(goal, len(CONTAINERS) - 1)]
        in_container = (np.abs(p[:, :2] - c[:, :2]).max(1) < CONTAINER_INNER) & (p[:, 2] < 0.045) & released
        z = self.zone_pos[rows, np.minimum(goal, len(COLOURS) - 1)]
        on_zone = (np.linalg.norm(p[:, :2] - z[:, :2], axis=1) < ZONE_RADIUS - 0.005) & (p[:, 2] < 0.02)
        base = self.body_pos[rows, goal]
        height = p[:, 2] - base[:, 2]
        stacked = ((np.linalg.norm(p[:, :2] - base[:, :2], axis=1) < STACK_TOLERANCE) & (height > 0.025)
                   & (height < 0.04) & (base[:, 2] < 0.02) & released & (goal != obj))
        return np.where(kind == PLACE, in_container, np.where(kind == PUSH, on_zone, stacked))

    # ------------------------------------------------------------ step, rewards, success
    def step(self, action: torch.Tensor):
        families, instructions = self.family.copy(), list(self._instructions)
        self._advance = True  # the subtask index moves in the step's own evaluation only (not in potential())
        try:
            obs, reward, terminated, truncated, info = super().step(action)
        finally:
            self._advance = False
        info["subtask_index"] = self._to_tensor(self._info_index)
        info["subtask_done"] = self._to_tensor(self._info_done)
        if "episode" in info:
            ids = info["episode"]["env_ids"].cpu().numpy()
            info["episode"]["family"] = self._to_tensor(families[ids])
            info["episode"]["instruction"] = [instructions[i] for i in ids]
        return obs, reward, terminated, truncated, info

    def _evaluate(self):
        rows = self._rows()
        done = np.stack([self._subtask_condition(self.subtask_kind[:, s], self.subtask_obj[:, s], self.subtask_goal[:, s])
                         for s in range(MAX_SUBTASKS)], 1)
        done[:, 1] &= self.num_subtasks > 1
        index = self.subtask_index
        if self._advance:
            current = np.minimum(index, self.num_subtasks - 1)
            index = index + ((index < self.num_subtasks) & done[rows, current])
            self.subtask_index[:] = index
            self.subtask_done[:] = done
            self._info_index, self._info_done = index.copy(), done.copy()
        needed = np.arange(MAX_SUBTASKS)[None, :] < self.num_subtasks[:, None]
        success = (index >= self.num_subtasks) & (done | ~needed).all(1)
        current = np.minimum(index, self.num_subtasks - 1)
        progress = self._subtask_dense(self.subtask_kind[rows, current], self.subtask_obj[rows, current],
                                       self.subtask_goal[rows, current])
        dense = np.where(success, 1.0, 0.9 * (np.minimum(index, self.num_subtasks - 1) + progress) / self.num_subtasks)
        lost = ((self.body_pos[:, :, 2] < -0.05) | (self.body_pos[:, :, 2] > 0.5)).any(1)
        return dense, success & ~lost, lost

    def _subtask_dense(self, kind: np.ndarray, obj: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """In [0, 1): reach the object, grip it, bring it to the goal (the push families: the contact pose)."""
        rows = self._rows()
        p = self.body_pos[rows, obj]
        target = self._goal_point(kind, goal)
        to_goal = np.linalg.norm(p - target, axis=1)
        place = 1.0 - np.tanh(10.0 * to_goal)
        reach_grasp = 1.0 - np.tanh(10.0 * np.linalg.norm(self.tcp - p, axis=1))
        gripped = self._gripped()[rows, obj]
        carry = (reach_grasp + gripped + 2.0 * place) / 4.0
        push_pose = push_contact_pose(p, target, self.pusher, self.push_dir)
        reach_push = 1.0 - np.tanh(10.0 * np.linalg.norm(self.pusher - push_pose, axis=1))
        push = (reach_push + 2.0 * place) / 3.0
        return np.where(kind == PUSH, push, carry) * 0.99

    # ------------------------------------------------------------ observations
    def _state_obs(self) -> np.ndarray:
        n = self.num_envs
        return np.concatenate(self._arm_obs()[:2] + [self.tcp, self.tcp_axes[:, :, 0], self.tcp_axes[:, :, 1],
                              self.body_pos.reshape(n, -1), self.body_quat.reshape(n, -1),
                              self.container_pos.reshape(n, -1), self.zone_pos[:, :, :2].reshape(n, -1),
                              self.contacts.astype(np.float64)], axis=1)

    def _observe(self):
        obs = super()._observe()
        obs["instruction_tokens"] = self._to_tensor(self._tokens.copy())
        obs["instruction_embedding"] = self._to_tensor(self._embedding.copy())
        return obs

    # ------------------------------------------------------------ scripted expert
    def _expert_command(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = self._rows()
        # move on to the next subtask once the current one holds (the expert's own spec, not the instruction)
        s = self.expert_subtask
        done = self._subtask_condition(self.expert_kind[rows, s], self.expert_obj[rows, s], self.expert_goal[rows, s])
        moving_on = done & (s + 1 < self.expert_num) & (self._expert_phase >= 6)
        self.expert_subtask[moving_on] += 1
        self._expert_phase[moving_on] = 0
        self._expert_timer[moving_on] = 0
        s = self.expert_subtask
        kind, obj, goal = self.expert_kind[rows, s], self.expert_obj[rows, s], self.expert_goal[rows, s]
        carry = self._carry_command(obj, self._goal_point(kind, goal), kind == PLACE)
        push = self._push_command(obj, self._goal_point(kind, goal))
        is_push = (kind == PUSH)[:, None]
        return (np.where(is_push, push[0], carry[0]), np.where(kind == PUSH, push[1], carry[1]),
                np.where(kind == PUSH, push[2], carry[2]))

    def _carry_command(self, obj: np.ndarray, goal: np.ndarray, into_container: np.ndarray):
        """Pick ``obj`` and let go of it at ``goal`` (above a container, or just above the base cube)."""
        rows = self._rows()
        n = self.num_envs
        phase, timer = self._expert_phase, self._expert_timer
        carrying = (self.expert_kind[rows, self.expert_subtask] != PUSH)
        p = self.body_pos[rows, obj]
        w, x, y, z = self.body_quat[rows, obj].T
        yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        jaw = self.tcp_axes[:, :, 1]
        is_cube = obj < len(CUBES)
        droll = np.where(is_cube, -_wrap(yaw - np.arctan2(jaw[:, 1], jaw[:, 0]), np.pi / 2), 0.0)
        aligned = np.abs(droll) < 0.05
        above = p + [0.0, 0.0, 0.05]
        grasp = p + [0.0, 0.0, 0.003]
        release = goal + [0.0, 0.0, 0.003]
        release[:, 2] = np.where(into_container, 0.055, release[:, 2] + 0.004)
        tcp = self.tcp
        # 0 above the object, open and aligned; 1 down; 2 close; 3 up; 4 over the goal; 5 down; 6 open; 7 up and wait
        step = carrying
        phase[step & (phase == 0) & (np.linalg.norm(tcp - above, axis=1) < 0.01) & aligned] = 1
        phase[step & (phase == 1) & (np.linalg.norm(tcp - grasp, axis=1) < 0.006)] = 2
        timer[step & ((phase == 2) | (phase == 6))] += 1
        closed = (timer > 3) & (np.abs(self.qvel[:, 5]) < 0.05) | (timer > 20)
        lifted = step & (phase == 2) & closed
        phase[lifted] = 3
        timer[lifted] = 0
        phase[step & (phase == 3) & (tcp[:, 2] > TRANSPORT_Z - 0.01)] = 4
        phase[step & (phase == 4) & (np.linalg.norm(tcp[:, :2] - release[:, :2], axis=1) < 0.008)] = 5
        at_release = step & (phase == 5) & (np.linalg.norm(tcp - release, axis=1) < 0.006)
        phase[at_release] = 6
        timer[at_release] = 0
        phase[step & (phase == 6) & (timer > 6)] = 7
        dropped = step & (phase >= 3) & (phase <= 5) & (np.linalg.norm(tcp - p, axis=1) > 0.03)
        phase[dropped] = 0
        goal_pos = np.where((phase == 0)[:, None], above, grasp)
        goal_pos = np.where((phase == 2)[:, None], tcp, goal_pos)
        goal_pos = np.where((phase == 3)[:, None], np.concatenate([tcp[:, :2], np.full((n, 1), TRANSPORT_Z)], 1), goal_pos)
        goal_pos = np.where((phase == 4)[:, None], np.concatenate([release[:, :2], np.full((n, 1), TRANSPORT_Z)], 1),
                            goal_pos)
        goal_pos = np.where(((phase == 5) | (phase == 6))[:, None], release, goal_pos)
        goal_pos = np.where((phase == 7)[:, None], np.concatenate([release[:, :2], np.full((n, 1), 0.12)], 1), goal_pos)
        grip = np.where((phase >= 2) & (phase <= 5), -1.0, 0.3)
        roll = np.where(phase <= 1, droll, 0.0)
        return self._move_command(goal_pos, 0.8), roll, grip

    def _push_command(self, obj: np.ndarray, zone: np.ndarray):
        """Push ``obj`` along a straight line onto the zone centre (the so101-push expert's phases), then lift off."""
        rows = self._rows()
        n = self.num_envs
        phase = self._expert_phase
        pushing = self.expert_kind[rows, self.expert_subtask] == PUSH
        p = self.body_pos[rows, obj]
        to_zone = zone[:, :2] - p[:, :2]
        dist = np.linalg.norm(to_zone, axis=1)
        fresh = pushing & (phase <= 1) & (dist > 1e-3)  # the line is fixed once the push starts
        self.push_dir[fresh] = to_zone[fresh] / dist[fresh, None]
        direction = self.push_dir
        pose = p.copy()
        pose[:, :2] -= direction * (CUBE_HALF * np.sqrt(2) + PUSHER_HALF_WIDTH + 0.005)
        pose[:, 2] = 0.022
        above = pose.copy()
        above[:, 2] = 0.06
        jaw = self.tcp_axes[:, :, 1]
        roll_err = _wrap(np.arctan2(direction[:, 1], direction[:, 0]) - np.arctan2(jaw[:, 1], jaw[:, 0]), np.pi)
        droll = np.where(phase == 0, -roll_err, 0.0)
        at_above = (np.linalg.norm(self.pusher - above, axis=1) < 0.012) & (np.abs(roll_err) < 0.1)
        behind = np.linalg.norm(self.pusher - pose, axis=1) < 0.01
        phase[pushing & (phase == 0) & at_above] = 1
        phase[pushing & (phase == 1) & behind] = 2
        # 3: on the zone: lift off (6 marks "done" for the subtask hand-over)
        arrived = pushing & (phase == 2) & (dist < 0.006)
        phase[arrived] = 6
        slipped = pushing & (phase == 2) & (np.linalg.norm(self.pusher[:, :2] - pose[:, :2], axis=1) > 0.03)
        phase[slipped] = 0
        push_goal = np.concatenate([zone[:, :2] - direction * (CUBE_HALF + PUSHER_HALF_WIDTH), np.full((n, 1), 0.022)], 1)
        goal = np.where((phase == 0)[:, None], above, pose)
        goal = np.where((phase == 2)[:, None], push_goal, goal)
        retreat = np.concatenate([self.pusher[:, :2], np.full((n, 1), 0.08)], 1)
        goal = np.where((phase >= 6)[:, None], retreat, goal)
        move = (goal - self.pusher) * 0.8
        norm = np.linalg.norm(move, axis=1, keepdims=True)
        slow = np.where((phase == 2)[:, None], np.minimum(1.0, 0.01 / np.maximum(norm, 1e-9)), 1.0)
        return move * slow, droll, np.full(n, PUSH_GRIPPER_ACTION)


class SO101PickPlace(SO101Suite):
    task_name = "so101-pick-place"
    families = ("pick-place",)
    default_max_episode_steps = 100


class SO101PushTo(SO101Suite):
    task_name = "so101-push-to"
    families = ("push-to",)
    default_max_episode_steps = 80


class SO101Stack(SO101Suite):
    task_name = "so101-stack"
    families = ("stack",)
    default_max_episode_steps = 100


class SO101LongHorizon(SO101Suite):
    task_name = "so101-long-horizon"
    families = ("long-horizon",)
    default_max_episode_steps = 150


def _check_option(task: str, name: str, value: Any) -> None:
    if name == "instruction":
        check_task_instruction(task, value)
    else:
        check_option(task, name, value)


SUITE_TASKS: dict[str, type[SO101Suite]] = {
    cls.task_name: cls for cls in (SO101Suite, SO101PickPlace, SO101PushTo, SO101Stack, SO101LongHorizon)}
for _cls in SUITE_TASKS.values():
    register_task(TaskSpec(_cls.task_name, _cls, SO101_OBS_MODES, REWARD_MODES, CONTROL_MODES,
                           _cls.default_max_episode_steps, options=("servo_limits", "instruction", "setup"),
                           check_option=_check_option))
