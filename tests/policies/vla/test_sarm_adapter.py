"""LeRobot's SARM behind the ProgressRewardModel protocol (``rlrobot.rewards.sarm``, trained by ``--algo sarm``):
LeRobot's own SARMRewardModel built offline with tiny random weights, trained on our labels with its own loss; windows
with rewind and language perturbation; the protocol's pair deltas flip sign when reversed; save -> load round trip
through LeRobot's save_pretrained / from_pretrained (local directory only) and the observation-space refusal; a
``--algo sarm`` run trains, evaluates, resumes bit-exactly and loads like any PRM on a LeRobotDataset collected here.

Needs the ``vla`` extra (Python >= 3.12, lerobot 0.6.1): ``.ci/run`` runs these in the VLA venv.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12; .ci/run runs these in its venv)")

from rlrobot.algorithms.sarm import SARMConfig, SARMLearner, sarm_batch  # noqa: E402
from rlrobot.data.progress_labels import ProgressData  # noqa: E402
from rlrobot.rewards.progress_model import ProgressRewardModel, load_progress_model  # noqa: E402
from rlrobot.rewards.sarm import SARMNetConfig, SARMProgressModel, build_sarm, load_sarm, save_sarm  # noqa: E402

TINY = SARMNetConfig(hidden_dim=32, num_layers=1, num_heads=2, n_obs_steps=3, frame_gap=2, max_rewind_steps=2, dropout=0.0)
TRAIN = SARMConfig(batch_size=16, num_updates=100, lr=3e-3)


def moving_data(episodes: int = 8, length: int = 24, seed: int = 0) -> ProgressData:
    """Instruction k moves state coordinate k from 0 to 1 (progress = time, done over the last fifth)."""
    rng = np.random.default_rng(seed)
    states, prog, ins, ep, start = [], [], [], [], []
    for e in range(episodes):
        k = e % 2
        t = np.arange(length) / (length - 1)
        s = rng.normal(0, 0.03, (length, 4)).astype(np.float32)
        s[:, k] = t
        states.append(s)
        prog.append(t)
        ins += [k] * length
        ep += [e] * length
        start += [e * length] * length
    emb = torch.nn.functional.normalize(torch.randn(2, 384, generator=torch.Generator().manual_seed(0)), dim=1)
    progress = torch.as_tensor(np.concatenate(prog), dtype=torch.float32)
    return ProgressData(obs={"state": torch.as_tensor(np.concatenate(states))}, instruction_id=torch.tensor(ins),
                        instruction_embeddings=emb, instructions=["x", "y"], progress=progress, done=progress >= 0.8,
                        episode_index=torch.tensor(ep), episode_start=torch.tensor(start),
                        trains_progress=torch.ones(len(progress), dtype=torch.bool),
                        episode_info=[{"success": True, "family": "t", "dataset": "d"} for _ in range(episodes)])


def test_windows_end_at_the_frame_rewind_goes_back_and_perturbed_targets_are_zero():
    data = moving_data()
    cfg = dataclasses.replace(TINY, rewind_probability=1.0, language_perturbation_probability=0.25)
    batch = sarm_batch(data, cfg, 512, torch.Generator().manual_seed(0), torch.arange(len(data)))
    n = cfg.n_obs_steps + 1
    assert batch["states"].shape == (512, n + cfg.max_rewind_steps, 4)
    own = batch["text_features"] @ data.instruction_embeddings.T
    k = own.argmax(1)
    perturbed = batch["sparse_targets"].abs().sum(1) == 0
    assert 0.15 < float(perturbed.float().mean()) < 0.35
    coord = batch["states"][torch.arange(512), :, 0] + batch["states"][torch.arange(512), :, 1]  # the moving one
    window = coord[:, :n]
    assert (window[:, 1:] - window[:, :-1] > -0.15).all()  # oldest first, the target frame last (jitter 0.03)
    t = batch["sparse_targets"]
    rewound = ~perturbed & (batch["lengths"] > n)
    assert rewound.float().mean() > 0.3 and (batch["lengths"] <= n + cfg.max_rewind_steps).all()
    rows = rewound.nonzero().squeeze(1)
    for r in rows[:50].tolist():  # rewind frames continue backwards in time: lower progress than the window's first
        length = int(batch["lengths"][r])
        assert (t[r, n:length] <= t[r, 0] + 1e-6).all() and (t[r, length:] == 0).all()
    assert (t < 1.0).all()  # stage 0 + tau < 1, as LeRobot's targets
    del k


@pytest.fixture(scope="module")
def trained():
    import random

    torch.manual_seed(0)
    random.seed(0)  # SARM's teacher forcing draws from Python's random
    data = moving_data()
    model = SARMProgressModel(build_sarm(4, TINY), 4, TINY)
    model.fit_state_stats(data.obs["state"])
    learner = SARMLearner(model, data, TRAIN)
    generator = torch.Generator().manual_seed(0)
    history = [learner.update(25, generator) for _ in range(4)]
    return model, data, history, learner


def test_trained_tiny_sarm_flips_reversed_pairs_and_round_trips(trained, tmp_path):
    model, data, history, learner = trained
    assert isinstance(model, ProgressRewardModel)
    assert history[-1]["sparse_subtask_loss"] < 0.5 * history[0]["sparse_subtask_loss"]
    test = dataclasses.replace(moving_data(episodes=4, seed=3), instruction_embeddings=data.instruction_embeddings)
    j = torch.arange(4)[:, None] * 24 + torch.arange(8, 24, 3)[None, :]
    j = j.reshape(-1)
    i = j - 6
    fwd, done = model.progress(test.frames(i), test.frames(j), test.embedding(j))
    rev, _ = model.progress(test.frames(j), test.frames(i), test.embedding(j))
    assert fwd.shape == done.shape == j.shape and fwd.abs().max() <= 1.0 and ((done >= 0) & (done <= 1)).all()
    assert float(((fwd > 0) & (rev < 0)).float().mean()) > 0.9
    learner.calibration_data = test
    calib = learner.calibrate_done_threshold()
    # the threshold of 0.05, 0.10, ..., 0.95 with the best F1 of the done probability against the done labels
    every = torch.arange(len(test))
    with torch.no_grad():
        probs = model.progress(test.frames(every), test.frames(every), test.embedding(every))[1]
    f1 = {}
    for threshold in np.round(np.arange(0.05, 0.951, 0.05), 2).tolist():
        pred = probs > threshold
        tp, fp, fn = (int((a & b).sum()) for a, b in ((pred, test.done), (pred, ~test.done), (~pred, test.done)))
        f1[threshold] = 2 * tp / (2 * tp + fp + fn)
    assert model.done_threshold == calib["done_threshold"] and calib["done_threshold"] in f1
    assert f1[calib["done_threshold"]] == pytest.approx(max(f1.values())) == pytest.approx(calib["calibration_done_f1"])
    assert max(f1.values()) > min(f1.values()) + 0.1  # the choice mattered
    save_sarm(model, tmp_path / "sarm")
    again = load_sarm(tmp_path / "sarm", observation_space={"state": (4,)})
    fwd2, done2 = again.progress(test.frames(i), test.frames(j), test.embedding(j))
    assert torch.allclose(fwd, fwd2, atol=1e-6) and torch.allclose(done, done2, atol=1e-6)
    assert again.done_threshold == model.done_threshold
    with pytest.raises(ValueError, match="PRM observation 'state' has shape \\[4\\] in the checkpoint; the env has \\[89\\]"):
        load_sarm(tmp_path / "sarm", observation_space={"state": (89,)})
    with pytest.raises(FileNotFoundError, match="not a SARM adapter directory"):
        load_sarm(tmp_path)


def test_config_validation_names_the_field():
    for field, value in (("max_rewind_steps", 3), ("hidden_dim", 31), ("rewind_probability", 2.0)):
        with pytest.raises(ValueError, match=f"sarm_net.{field}"):
            dataclasses.replace(TINY, **{field: value}).validate()


def test_sarm_run_trains_evaluates_resumes_and_loads_like_any_prm(tmp_path):
    import json

    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations
    from rlrobot.commands.prm_eval import PRMEvalArgs, run_prm_eval
    from rlrobot.config import train_config
    from rlrobot.runners.base import make_runner

    data = tmp_path / "push-to"
    collect_demonstrations(CollectArgs(task="so101-push-to", episodes=3, out=str(data), num_envs=3, recipe="expert"))

    def config(out):
        return train_config("sarm", task="so101-push-to", dataset=str(data), num_envs=1, out=str(out), logger="none",
                            num_threads=1, checkpoint_every=1, eval_every=0, video=True, sarm_net=TINY,
                            sarm=dataclasses.replace(TRAIN, num_updates=4, updates_per_iteration=2, calibration_episodes=1,
                                                     eval_dataset=str(data)))

    result = make_runner(config(tmp_path / "sarm")).learn()
    m = json.loads((tmp_path / "sarm" / "prm_eval" / "metrics.json").read_text())["metrics"]
    assert m["episodes"] == 3 and m["spearman_mean"] == pytest.approx(result["eval"]["spearman_mean"], nan_ok=True)
    assert (tmp_path / "sarm" / "prm_eval" / "progress_curves.png").is_file()
    # behind the same loader as the VLAC-style PRM (rlrobot prm-eval, --reward.shaping prm:PATH, deploy --reward)
    model = load_progress_model(tmp_path / "sarm", observation_space={"state": (89,)})
    assert isinstance(model, SARMProgressModel) and isinstance(model, ProgressRewardModel)
    assert model.observation_space == {"state": [89]} and model.done_threshold == m["done_threshold"]
    again = run_prm_eval(PRMEvalArgs(checkpoint=str(tmp_path / "sarm"), dataset=str(data), out=str(tmp_path / "ev")))
    assert again["metrics"]["spearman_mean"] == pytest.approx(m["spearman_mean"], nan_ok=True)
    assert again["metrics"]["done_f1"] == m["done_f1"] and again["metrics"]["done_threshold"] == m["done_threshold"]
    with pytest.raises(ValueError, match="PRM observation 'state' has shape \\[89\\] in the checkpoint"):
        load_progress_model(tmp_path / "sarm", observation_space={"state": (27,)})
    # interrupted after 1 of 2 iterations, then resumed: the same weights (Adam, the generator and Python's random)
    runner = make_runner(config(tmp_path / "b"))
    runner._start()
    runner._train_and_log(None)
    runner.save()
    resumed = config(tmp_path / "b")
    resumed.resume = True
    make_runner(resumed).learn()
    wa, _, _ = load_checkpoint(tmp_path / "sarm")
    wb, _, _ = load_checkpoint(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # a SARM adapter directory (save_sarm) loads through the same loader
    save_sarm(model, tmp_path / "adapter")
    assert isinstance(load_progress_model(tmp_path / "adapter", observation_space={"state": (89,)}), SARMProgressModel)
