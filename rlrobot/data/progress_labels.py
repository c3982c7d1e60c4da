"""Training data of the process reward model: LeRobotDatasets (``rlrobot collect``, any recipe) as frames with
per-frame progress and done labels, and the batches of labelled pairs the PRM learns from.

Labels (``label_episode``), from what ``rlrobot collect`` stores per frame (``next.success``: the task's success after
the frame's step; ``next.reward``: the dense reward after it, which on the native tasks is the task's own progress
measure, e.g. the suite's 0.9 * (subtasks done + progress in the current one) / subtasks, 1 at success):

- done of frame i = the success flag of the state the frame shows (``next.success`` of frame i - 1; frame 0: False).
  On the suite this flag is "every subtask's done flag held, in order" (``info["subtask_index"]``): the automatic
  segmentation of an episode into "not yet done" / "done" that the completion model learns (VLA-RL's pseudo labels).
- successful episodes (done at some frame; T = the first such frame): VLAC's time progress min(i / T, 1) (an expert
  that waits after success stays at 1, not i / length).
- failed episodes: the task's dense progress relative to the first frame, clip((phi_i - phi_0) / (1 - phi_0), 0, 1)
  with phi_i = ``next.reward`` of frame i - 1 (phi_0 = that of frame 0), so a failure that got the object halfway is
  labelled about halfway. A dataset without ``next.reward`` labels its failures 0.
- VLAC's filter: an episode whose labels move but do not rise with time (Spearman(progress, frame index) below
  ``min_time_correlation``) trains no progress pairs; its frames still train the completion model. A failure whose
  labels stay flat (within ``flat_tolerance``: random flailing, no progress) is kept, as zero-progress pairs.

Pairs (``sample_pairs``): a frame j, an earlier frame i of the same episode (skip 1..max_skip, or the episode's first
frame), label ``relative_delta(p_i, p_j)`` (the delta the VLAC value update turns back into p_j); a share of them
reversed (j, i: negative delta), repeated (j, j: 0) and with a mismatched instruction (another instruction of the
data: delta 0, done 0).

Instructions: the data's task encodes them (``instruction_observation``: token ids over its vocabulary and sentence
embeddings, as its env observes them); the caller passes that encoder in (``task_instruction_observation``), so this
module knows no task's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlrobot.data.demonstrations import obs_feature
from rlrobot.data.lerobot_dataset import read_lerobot_dataset
from rlrobot.data.transitions import dataset_meta
from rlrobot.envs.language import EMBEDDING_DIM, EMBEDDING_KEY, TOKENS_KEY, InstructionEmbeddings
from rlrobot.tasks.registry import is_adapter_task, task_spec

InstructionObservation = Callable[[list[str]], dict[str, np.ndarray]]
"""instruction strings -> the task's observations of them (``instruction_tokens`` [N, L] token ids,
``instruction_embedding`` [N, 384]): a language task's ``instruction_observation``, which datasets are encoded with"""


def value_update(value: Tensor, delta: Tensor) -> Tensor:
    """VLAC's value update V_{i+1} = V_i + (1 - V_i) * delta, clipped to [0, 1] (values are progress fractions)."""
    return (value + (1.0 - value) * delta).clamp(0.0, 1.0)


def relative_delta(p_before: Tensor, p_after: Tensor, floor: float = 0.05) -> Tensor:
    """The delta label of a pair of frames with progress p_before -> p_after: the one the value update turns back into
    p_after, (p_after - p_before) / (1 - p_before), the denominator floored (a frame at progress 1), clipped to
    [-1, 1]."""
    return ((p_after - p_before) / (1.0 - p_before).clamp_min(floor)).clamp(-1.0, 1.0)


def dataset_dirs(spec: str) -> list[Path]:
    """``DIR[,DIR...]``; a directory without ``meta/info.json`` whose sub-directories are datasets counts as all of
    them (e.g. a folder of per-family datasets)."""
    out: list[Path] = []
    for part in [p for p in spec.split(",") if p.strip()]:
        root = Path(part.strip())
        if (root / "meta" / "info.json").is_file():
            out.append(root)
            continue
        subs = sorted(p for p in root.glob("*") if (p / "meta" / "info.json").is_file()) if root.is_dir() else []
        if not subs:
            raise FileNotFoundError(f"dataset={part!r} is not a LeRobotDataset (no meta/info.json) nor a folder of them")
        out.extend(subs)
    if not out:
        raise ValueError("dataset: no dataset directory given (--dataset DIR[,DIR...])")
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant."""
    from scipy.stats import rankdata  # scipy is not a declared dependency: loaded only where ranks are compared

    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


SUCCESS_LABELS = ("time", "dense")
AFTER_SUCCESS = ("hold", "track")


def label_episode(success_next: np.ndarray, reward_next: np.ndarray | None, success_labels: str = "time",
                  after_success: str = "hold") -> tuple[np.ndarray, np.ndarray, bool]:
    """(progress [T], done [T], succeeded) of one episode from its ``next.success`` / ``next.reward`` columns.
    ``success_labels="dense"`` labels successful episodes like failures (the task's dense progress relative to the
    first frame), 1 from the first done frame on; "time" is VLAC's i / T. ``after_success="track"``: after the first
    done frame, 1 only while the task stays done and the dense progress where it is lost again (a cube dropped after
    the lift); "hold" labels every later frame 1 (VLAC: a demonstration ends at success)."""
    if success_labels not in SUCCESS_LABELS:
        raise ValueError(f"success_labels must be one of {SUCCESS_LABELS}, got {success_labels!r}")
    if after_success not in AFTER_SUCCESS:
        raise ValueError(f"after_success must be one of {AFTER_SUCCESS}, got {after_success!r}")
    if after_success == "track" and reward_next is None:
        raise ValueError("after_success='track' needs the dataset's 'next.reward' (the task's dense progress)")
    if success_labels == "dense" and reward_next is None:
        raise ValueError("success_labels='dense' needs the dataset's 'next.reward' (the task's dense progress)")
    n = len(success_next)
    done = np.zeros(n, bool)
    done[1:] = success_next[:-1]
    succeeded = bool(done.any())
    if reward_next is None:
        if not succeeded:
            return np.zeros(n, np.float32), done, False
        return np.minimum(np.arange(n) / int(np.argmax(done)), 1.0).astype(np.float32), done, True
    phi = np.empty(n, np.float64)
    phi[0] = reward_next[0]
    phi[1:] = reward_next[:-1]
    rel = np.clip((phi - phi[0]) / max(1.0 - phi[0], 1e-3), 0.0, 1.0)
    if not succeeded:
        return rel.astype(np.float32), done, False
    first = int(np.argmax(done))
    labels = np.minimum(np.arange(n) / first, 1.0) if success_labels == "time" else rel.copy()
    labels[first:] = 1.0
    if after_success == "track":
        lost = ~done
        lost[:first] = False
        labels[lost] = rel[lost]
    return labels.astype(np.float32), done, True


@dataclass
class ProgressData:
    """Frames of one or more datasets (episodes contiguous) with labels, tensors on one device."""

    obs: dict[str, Tensor]  # env keys (state [N, D] float32, image_<cam> [N, 3, H, W] uint8)
    instruction_id: Tensor  # [N] int64 into ``instructions``
    instruction_embeddings: Tensor  # [I, 384]
    instructions: list[str]
    progress: Tensor  # [N] float32 in [0, 1]
    done: Tensor  # [N] bool
    episode_index: Tensor  # [N] int64, unique over all datasets
    episode_start: Tensor  # [N] int64 flat index of the episode's first frame
    trains_progress: Tensor  # [N] bool: the episode passed the time-correlation filter
    episode_info: list[dict[str, Any]] = field(default_factory=list)  # per episode: dataset, success, kept, family
    info: dict[str, Any] = field(default_factory=dict)
    instruction_family: Tensor | None = None  # [I] int64: the suite family each instruction was seen with (hard negatives)
    instruction_tokens: Tensor | None = None  # [I, L] int64 token ids per instruction, when the PRM reads them

    def __len__(self) -> int:
        return len(self.progress)

    @property
    def device(self) -> torch.device:
        return self.progress.device

    def embedding(self, idx: Tensor) -> Tensor:
        return self.instruction_embeddings[self.instruction_id[idx]]

    def frames(self, idx: Tensor, instruction_ids: Tensor | None = None) -> dict[str, Tensor]:
        """The observations of frames ``idx``; where the PRM reads token ids, those of ``instruction_ids`` (default:
        the frames' own instructions; a mismatched one for the negatives)."""
        out = {k: v[idx] for k, v in self.obs.items()}
        if self.instruction_tokens is not None:
            ids = self.instruction_id[idx] if instruction_ids is None else instruction_ids
            out[TOKENS_KEY] = self.instruction_tokens[ids]
        return out

    def episodes(self) -> list[tuple[int, int]]:
        """(first, end) flat frame ranges of the episodes, in order."""
        starts = torch.unique(self.episode_start).tolist()
        return list(zip(starts, [*starts[1:], len(self)], strict=True))


def _family(task: str | None) -> str:
    return (task or "").removeprefix("so101-")


def load_progress_data(spec: str, obs_keys: tuple[str, ...], obs_shapes: dict[str, tuple[int, ...]],
                       min_time_correlation: float = 0.5, device: torch.device | str = "cpu",
                       exclude_families: tuple[str, ...] = (), only_families: tuple[str, ...] = (),
                       max_episodes: int = 0, flat_tolerance: float = 0.05, filter_failures: bool = True,
                       success_labels: str = "time", after_success: str = "hold",
                       instruction_observation: InstructionObservation | None = None) -> ProgressData:
    """Read and label the datasets of ``spec`` (``DIR[,DIR...]``). Refuses (one line naming the feature) a dataset
    without an observation the PRM reads, or with another shape. ``exclude_families`` / ``only_families`` select
    datasets by the suite family of the task they were collected on (``meta/rlrobot.json``). ``filter_failures=False``
    applies the time-correlation filter to successful episodes only: a failure's labels are the task's measured
    progress (not time), so a failure that rises and falls is what teaches regressions, not label noise.
    ``success_labels``, ``after_success``: ``label_episode``'s (evaluation data keeps "time" and "hold", the metric's
    definition). ``instruction_observation``: the task's encoder of instructions (token ids and sentence embeddings,
    as its env observes them); None for a task without instructions."""
    read_tokens = TOKENS_KEY in obs_keys  # token ids come from the frames' task strings, not from a stored feature
    obs_keys = tuple(k for k in obs_keys if k != TOKENS_KEY)
    obs: dict[str, list[np.ndarray]] = {k: [] for k in obs_keys}
    texts: list[str] = []
    progress, done, episode, start, trains = [], [], [], [], []
    episode_info: list[dict[str, Any]] = []
    total = 0
    used_dirs = []
    for root in dataset_dirs(spec):
        info, meta = dataset_meta(root)
        family = _family(meta.get("task"))
        if family in exclude_families or (only_families and family not in only_families):
            continue
        features = info["features"]
        for key in obs_keys:
            name = obs_feature(key)
            if name not in features:
                raise ValueError(f"dataset {root} has no feature {name!r} (the PRM reads observation {key!r}); it has "
                                 f"{sorted(k for k in features if k.startswith('observation'))}")
            shape = list(features[name]["shape"])
            want = list(obs_shapes[key]) if key == "state" else [obs_shapes[key][1], obs_shapes[key][2], obs_shapes[key][0]]
            if shape != want:
                raise ValueError(f"dataset feature {name!r} has shape {shape}; the PRM's observation {key!r} needs {want}")
        if "next.success" not in features:
            raise ValueError(f"dataset {root} has no feature 'next.success' (the done labels come from it)")
        if success_labels == "dense" and "next.reward" not in features:
            raise ValueError(f"dataset {root} has no feature 'next.reward', which prm.success_labels='dense' labels "
                             "successful episodes by; use prm.success_labels='time'")
        if after_success == "track" and "next.reward" not in features:
            raise ValueError(f"dataset {root} has no feature 'next.reward', which prm.after_success='track' labels lost "
                             "successes by; use prm.after_success='hold'")
        data = read_lerobot_dataset(root)
        frames = data["frames"]
        names = {i: t for t, i in data["tasks"].items()}
        ep = frames["episode_index"].reshape(-1)
        reward = frames["next.reward"].reshape(-1) if "next.reward" in frames else None
        success = frames["next.success"].reshape(-1).astype(bool)
        task_index = frames["task_index"].reshape(-1)
        used_dirs.append(str(root))
        for e in np.unique(ep):
            if max_episodes and len(episode_info) >= max_episodes:
                break
            rows = np.nonzero(ep == e)[0]
            p, d, ok = label_episode(success[rows], None if reward is None else reward[rows], success_labels,
                                     after_success)
            corr = spearman(p, np.arange(len(p))) if len(p) > 2 else float("nan")
            # a failure that made no progress at all (flat labels, e.g. random flailing) is kept: its pairs teach
            # "moving without progress is 0" (VLAC's stagnation negatives); only episodes whose labels move without
            # rising with time are filtered out
            flat = not ok and float(p.max() - p.min()) < flat_tolerance
            keep = bool(flat or (not ok and not filter_failures) or (np.isfinite(corr) and corr >= min_time_correlation))
            for key in obs_keys:
                values = frames[obs_feature(key)][rows]
                obs[key].append(values if key == "state" else values.transpose(0, 3, 1, 2))
            texts.extend(names[int(t)] for t in task_index[rows])
            progress.append(p)
            done.append(d)
            episode.append(np.full(len(rows), len(episode_info)))
            start.append(np.full(len(rows), total))
            trains.append(np.full(len(rows), keep))
            episode_info.append({"dataset": str(root), "family": family, "success": ok, "length": len(rows),
                                 "time_correlation": corr, "trains_progress": keep, "recipe": meta.get("recipe"),
                                 "instruction": names[int(task_index[rows[0]])]})
            total += len(rows)
    if not episode_info:
        raise ValueError(f"dataset={spec!r}: no episodes left (exclude_families={exclude_families}, "
                         f"only_families={only_families})")
    instructions = sorted(set(texts))
    lookup = {t: i for i, t in enumerate(instructions)}
    observed = instruction_observation(instructions) if instruction_observation is not None else {}
    if observed:
        embeddings = observed[EMBEDDING_KEY]
    elif len(instructions) == 1:
        # a single-task dataset of a task without instructions: its one instruction carries no information (and the
        # task's env observes none), so a zero embedding stands for it instead of loading the sentence encoder (~20 s)
        embeddings = np.zeros((1, EMBEDDING_DIM), np.float32)
    else:
        embeddings = InstructionEmbeddings()(instructions)

    def t(x: np.ndarray, dtype=None) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype, device=device)

    families = sorted({e["family"] for e in episode_info})
    family_of = {e["instruction"]: families.index(e["family"]) for e in episode_info}
    instruction_family = np.array([family_of.get(x, -1) for x in instructions], np.int64)

    obs_t = {k: t(np.concatenate(v), torch.float32 if k == "state" else torch.uint8) for k, v in obs.items()}
    tokens = None
    if read_tokens:
        if TOKENS_KEY not in observed:
            raise ValueError(f"the PRM reads {TOKENS_KEY!r}, the instruction's token ids: the data's task has no "
                             "instruction vocabulary to encode its instructions with")
        if list(observed[TOKENS_KEY].shape[1:]) != list(obs_shapes[TOKENS_KEY]):
            raise ValueError(f"the PRM's observation {TOKENS_KEY!r} has shape {list(obs_shapes[TOKENS_KEY])}; the "
                             f"task's instruction vocabulary writes {list(observed[TOKENS_KEY].shape[1:])}")
        tokens = t(observed[TOKENS_KEY])
    kept = sum(e["trains_progress"] for e in episode_info)
    info = {"datasets": used_dirs, "episodes": len(episode_info), "frames": total,
            "successful_episodes": sum(e["success"] for e in episode_info), "progress_episodes": kept,
            "filtered_episodes": len(episode_info) - kept, "instructions": len(instructions),
            "families": sorted({e["family"] for e in episode_info})}
    return ProgressData(obs=obs_t, instruction_id=t(np.array([lookup[x] for x in texts], np.int64)),
                        instruction_embeddings=t(embeddings, torch.float32), instructions=instructions,
                        progress=t(np.concatenate(progress)), done=t(np.concatenate(done)),
                        episode_index=t(np.concatenate(episode).astype(np.int64)),
                        episode_start=t(np.concatenate(start).astype(np.int64)), trains_progress=t(np.concatenate(trains)),
                        episode_info=episode_info, info=info, instruction_family=t(instruction_family),
                        instruction_tokens=tokens)


@dataclass
class PairBatch:
    before: dict[str, Tensor]
    after: dict[str, Tensor]
    embedding: Tensor  # [B, 384] the instruction shown (mismatched for some)
    delta: Tensor  # [B] label in [-1, 1]
    kind: Tensor  # [B] int64: 0 forward, 1 reversed, 2 repeated, 3 mismatched
    done_obs: dict[str, Tensor]  # frames for the completion loss
    done_embedding: Tensor
    done: Tensor  # [B] float label


FORWARD, REVERSED, REPEATED, MISMATCHED = 0, 1, 2, 3


def other_instruction(data: ProgressData, ids: Tensor, generator: torch.Generator, same_family_share: float = 0.0
                      ) -> Tensor:
    """A different instruction id for each of ``ids``: uniform over the others, or (a ``same_family_share`` of them)
    uniform over the other instructions of the same suite family (hard negatives: "the red cube" for "the blue cube",
    which a uniform draw, mostly another family, rarely shows)."""
    n = len(data.instructions)
    if n < 2:
        return ids
    shift = torch.randint(1, n, ids.shape, generator=generator, device=ids.device)
    out = (ids + shift) % n
    fam = data.instruction_family
    if same_family_share <= 0 or fam is None:
        return out
    # a random other instruction of the same family: rank the family's members by a random key, excluding ids itself
    same = (fam[None, :] == fam[ids][:, None]) & (torch.arange(n, device=ids.device)[None, :] != ids[:, None])
    key = torch.rand(same.shape, generator=generator, device=ids.device).masked_fill(~same, -1.0)
    hard = key.argmax(1)
    use = (torch.rand(ids.shape, generator=generator, device=ids.device) < same_family_share) & same.any(1)
    return torch.where(use, hard, out)


def sample_pairs(data: ProgressData, batch_size: int, generator: torch.Generator, max_skip: int = 40,
                 anchor_share: float = 0.2, reversed_share: float = 0.25, repeated_share: float = 0.1,
                 mismatched_share: float = 0.15, candidates: Tensor | None = None, hard_mismatch_share: float = 0.0,
                 done_positive_share: float = 0.0, positives: Tensor | None = None,
                 done_mismatched_share: float | None = None) -> PairBatch:
    """One training batch: ``batch_size`` labelled pairs (module docstring) and ``batch_size`` frames for the done
    loss. ``candidates``: the flat frame indices pairs end at (default: the frames of episodes that train progress)."""
    dev = data.device
    if len(data.instructions) < 2:  # one instruction (a single-task dataset): no other one to mismatch with; a
        # "mismatched" pair would show the matched words with label 0, contradicting the forward pairs (it capped the
        # progress of a lift PRM at ~0.69, sigmoid of the match gate, and its done probability at ~0.78)
        mismatched_share, done_mismatched_share = 0.0, 0.0
    if candidates is None:
        candidates = torch.nonzero(data.trains_progress).squeeze(1)
    if len(candidates) == 0:
        raise ValueError("no episode passed the time-correlation filter: nothing to train progress on "
                         "(lower prm.min_time_correlation or add successful episodes)")
    j = candidates[torch.randint(len(candidates), (batch_size,), generator=generator, device=dev)]
    first = data.episode_start[j]
    skip = torch.randint(1, max_skip + 1, (batch_size,), generator=generator, device=dev)
    i = torch.maximum(first, j - skip)
    anchored = torch.rand(batch_size, generator=generator, device=dev) < anchor_share
    i = torch.where(anchored, first, i)
    u = torch.rand(batch_size, generator=generator, device=dev)
    kind = torch.full((batch_size,), FORWARD, dtype=torch.long, device=dev)
    kind[u < reversed_share + repeated_share + mismatched_share] = MISMATCHED
    kind[u < reversed_share + repeated_share] = REPEATED
    kind[u < reversed_share] = REVERSED
    b = torch.where(kind == REVERSED, j, torch.where(kind == REPEATED, j, i))
    a = torch.where(kind == REVERSED, i, j)
    delta = relative_delta(data.progress[b], data.progress[a])
    delta = torch.where((kind == REPEATED) | (kind == MISMATCHED), torch.zeros_like(delta), delta)
    ids = data.instruction_id[j]
    ids = torch.where(kind == MISMATCHED, other_instruction(data, ids, generator, hard_mismatch_share), ids)
    # completion: frames of every episode (the filtered ones too); a share with a mismatched instruction (not done)
    f = torch.randint(len(data), (batch_size,), generator=generator, device=dev)
    if done_positive_share > 0:  # a share drawn from done frames (rare in long episodes that succeed late)
        positives = torch.nonzero(data.done).squeeze(1) if positives is None else positives
        if len(positives):
            pos = positives[torch.randint(len(positives), (batch_size,), generator=generator, device=dev)]
            f = torch.where(torch.rand(batch_size, generator=generator, device=dev) < done_positive_share, pos, f)
    f_ids = data.instruction_id[f]
    # (hard, same-family negatives train the pairs only: on a done frame they ask the completion model for exact
    # relations it then misses on held-out scenes, measured as a recall loss on long-horizon)
    share = mismatched_share if done_mismatched_share is None else done_mismatched_share
    wrong = torch.rand(batch_size, generator=generator, device=dev) < share
    f_ids = torch.where(wrong, other_instruction(data, f_ids, generator), f_ids)
    return PairBatch(before=data.frames(b, ids), after=data.frames(a, ids), embedding=data.instruction_embeddings[ids],
                     delta=delta, kind=kind, done_obs=data.frames(f, f_ids), done_embedding=data.instruction_embeddings[f_ids],
                     done=(data.done[f] & ~wrong).float())


def split_holdout(data: ProgressData, holdout: int) -> tuple[ProgressData, ProgressData | None]:
    """(train, held-out) ProgressData: the last ``holdout`` episodes of each dataset directory go to held-out."""
    info = data.episode_info
    per_dir: dict[str, list[int]] = {}
    for e, row in enumerate(info):
        per_dir.setdefault(row["dataset"], []).append(e)
    share = max(1, holdout // max(len(per_dir), 1)) if holdout else 0
    # at most all but one episode of each dataset is held out (a dataset of one episode trains)
    held = sorted(e for eps in per_dir.values() for e in eps[len(eps) - min(share, len(eps) - 1):] if share)
    mask = np.isin(data.episode_index.cpu().numpy(), held)
    return subset(data, ~mask), (subset(data, mask) if held else None)


def subset(data: ProgressData, keep_mask: np.ndarray) -> ProgressData:
    """The frames of ``keep_mask`` (whole episodes) as a new ProgressData with re-based episode starts."""
    keep = torch.as_tensor(np.asarray(keep_mask), device=data.device)
    idx = torch.nonzero(keep).squeeze(1)
    episodes = data.episode_index[idx]
    new_index = torch.unique_consecutive(episodes, return_inverse=True)[1]
    first = torch.ones(len(idx), dtype=torch.bool, device=data.device)
    first[1:] = episodes[1:] != episodes[:-1]
    starts = torch.nonzero(first).squeeze(1)
    start = starts[new_index]
    kept_eps = torch.unique_consecutive(episodes).tolist()
    return ProgressData(obs={k: v[idx] for k, v in data.obs.items()}, instruction_id=data.instruction_id[idx],
                        instruction_family=data.instruction_family,
                        instruction_embeddings=data.instruction_embeddings, instructions=data.instructions,
                        progress=data.progress[idx], done=data.done[idx], episode_index=new_index, episode_start=start,
                        trains_progress=data.trains_progress[idx], episode_info=[data.episode_info[e] for e in kept_eps],
                        info=dict(data.info, episodes=len(kept_eps), frames=len(idx),
                                  successful_episodes=sum(data.episode_info[e]["success"] for e in kept_eps),
                                  progress_episodes=sum(data.episode_info[e]["trains_progress"] for e in kept_eps),
                                  filtered_episodes=sum(not data.episode_info[e]["trains_progress"] for e in kept_eps)),
                        instruction_tokens=data.instruction_tokens)


def task_instruction_observation(task: str | None) -> InstructionObservation | None:
    """The instruction encoder of a native task (its env class's ``instruction_observation``: the language suite's),
    or None for a task without instructions (or none named)."""
    if not task or is_adapter_task(task):
        return None
    return getattr(task_spec(task).entry_point, "instruction_observation", None)


def recorded_task(spec: str) -> str | None:
    """The task the first dataset of ``spec`` was recorded on (``meta/rlrobot.json``), None where it names none."""
    return dataset_meta(dataset_dirs(spec)[0])[1].get("task")


__all__ = ["AFTER_SUCCESS", "EMBEDDING_KEY", "FORWARD", "MISMATCHED", "REPEATED", "REVERSED", "InstructionObservation",
           "PairBatch", "ProgressData", "dataset_dirs", "label_episode", "load_progress_data", "other_instruction",
           "recorded_task", "relative_delta", "sample_pairs", "spearman", "split_holdout", "subset",
           "task_instruction_observation", "value_update"]
