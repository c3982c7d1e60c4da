"""Progress-model test data shared by tests/data, tests/rewards, tests/algorithms and tests/runners: synthetic
labelled episodes, a tiny network, a suite dataset collected once per module and a short PRM run's config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlrobot.algorithms.progress_model import PRMConfig
from rlrobot.data.progress_labels import ProgressData
from rlrobot.rewards.progress_model import PRMNetConfig

TINY = PRMNetConfig(state_hidden=(32,), embed_dim=16, text_dim=8, head_hidden=(32, 32))


def synthetic_data(episodes: int = 12, length: int = 30, seed: int = 0) -> ProgressData:
    """Instruction 0 moves coordinate 0 from 0 to 1, instruction 1 moves coordinate 1; progress = time to the end;
    coordinates 2 and 3 jitter. Episodes alternate instructions; done over the last fifth."""
    rng = np.random.default_rng(seed)
    states, prog, done, ins, ep, start = [], [], [], [], [], []
    for e in range(episodes):
        k = e % 2
        t = np.arange(length) / (length - 1)
        s = rng.normal(0, 0.05, (length, 4)).astype(np.float32)
        s[:, k], s[:, 1 - k] = t, 0.0  # jitter only on the coordinates no instruction moves
        states.append(s)
        prog.append(t)
        done.append(t >= 0.8)
        ins += [k] * length
        ep += [e] * length
        start += [e * length] * length
    emb = torch.nn.functional.normalize(torch.randn(2, 384, generator=torch.Generator().manual_seed(seed)), dim=1)
    n = episodes * length
    return ProgressData(obs={"state": torch.as_tensor(np.concatenate(states))}, instruction_id=torch.tensor(ins),
                        instruction_embeddings=emb, instructions=["move x", "move y"],
                        progress=torch.as_tensor(np.concatenate(prog), dtype=torch.float32),
                        done=torch.as_tensor(np.concatenate(done)), episode_index=torch.tensor(ep),
                        episode_start=torch.tensor(start), trains_progress=torch.ones(n, dtype=torch.bool),
                        episode_info=[{"success": True, "family": "synthetic", "trains_progress": True}] * episodes)


def four_instruction_data(episodes: int = 16, length: int = 30, seed: int = 0) -> ProgressData:
    """Instruction k moves state coordinate k from 0 to 1 (progress = time; done over the last fifth); instructions
    0, 1 are family 0 and 2, 3 family 1; the other coordinates jitter."""
    rng = np.random.default_rng(seed)
    states, prog, ins, ep, start = [], [], [], [], []
    for e in range(episodes):
        k = e % 4
        t = np.arange(length) / (length - 1)
        s = rng.normal(0, 0.05, (length, 4)).astype(np.float32)
        s[:, k] = t
        states.append(s)
        prog.append(t)
        ins += [k] * length
        ep += [e] * length
        start += [e * length] * length
    emb = torch.nn.functional.normalize(torch.randn(4, 384, generator=torch.Generator().manual_seed(seed)), dim=1)
    n = episodes * length
    progress = torch.as_tensor(np.concatenate(prog), dtype=torch.float32)
    return ProgressData(obs={"state": torch.as_tensor(np.concatenate(states))}, instruction_id=torch.tensor(ins),
                        instruction_embeddings=emb, instructions=["x", "y", "z", "w"], progress=progress,
                        done=progress >= 0.8, episode_index=torch.tensor(ep), episode_start=torch.tensor(start),
                        trains_progress=torch.ones(n, dtype=torch.bool),
                        episode_info=[{"success": True, "family": f"f{e % 4 // 2}", "trains_progress": True,
                                       "dataset": f"d{e % 2}"} for e in range(episodes)],
                        instruction_family=torch.tensor([0, 0, 1, 1]))


def collect_suite_dataset(tmp_path_factory: pytest.TempPathFactory):
    """Three expert episodes of so101-push-to as a LeRobotDataset (a module fixture's body)."""
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    out = tmp_path_factory.mktemp("prm") / "push-to"
    collect_demonstrations(CollectArgs(task="so101-push-to", episodes=3, out=str(out), num_envs=3, recipe="expert"))
    return out


def prm_run_config(out, dataset, updates: int):
    """A tiny PRM run on so101-suite, evaluated on its own dataset."""
    from rlrobot.config import train_config

    return train_config("prm", task="so101-suite", num_envs=1, out=str(out), dataset=str(dataset), logger="none",
                        video=True, num_threads=1, checkpoint_every=1, eval_every=0,
                        prm=PRMConfig(num_updates=updates, updates_per_iteration=2, batch_size=32, eval_dataset=str(dataset)),
                        prm_net=TINY)


def suite_entity_net() -> PRMNetConfig:
    """TINY reading the state through the suite's named entity attention and the instruction's token ids."""
    import dataclasses

    from rlrobot.tasks.so101_suite import SO101Suite

    return dataclasses.replace(TINY, obs_keys=("state", "instruction_tokens"), state_entities=SO101Suite.state_entities,
                               entity_names=SO101Suite.entity_name_tokens, entity_anchor=SO101Suite.tcp_index,
                               entity_dim=16)
