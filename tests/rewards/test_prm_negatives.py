"""PRM training options for the held-out targets (issue 20): hard (same-family) mismatched instructions, the match
gate that drives a mismatched instruction's delta to 0, done-positive sampling, failures kept out of the time filter,
and the done threshold chosen on calibration episodes kept out of training."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from rlrobot.algorithms.prm import PRMConfig, PRMLearner, split_holdout
from rlrobot.data.progress_labels import MISMATCHED, ProgressData, other_instruction, sample_pairs
from rlrobot.rewards.prm import PRMNetConfig, VLACProgressModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TINY = PRMNetConfig(state_hidden=(32,), embed_dim=16, text_dim=8, head_hidden=(32, 32))


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


def test_hard_mismatches_come_from_the_same_family_and_never_the_own_instruction():
    data = four_instruction_data()
    ids = torch.tensor([0, 1, 2, 3] * 500)
    g = torch.Generator().manual_seed(0)
    hard = other_instruction(data, ids, g, same_family_share=1.0)
    assert (hard != ids).all() and torch.equal(hard, ids ^ 1)  # the family's other member
    uniform = other_instruction(data, ids, g)
    assert (uniform != ids).all()
    same = float((data.instruction_family[uniform] == data.instruction_family[ids]).float().mean())
    assert 0.25 < same < 0.42  # uniform over the 3 others: 1 of 3 in the same family
    half = other_instruction(data, ids, g, same_family_share=0.5)
    same = float((data.instruction_family[half] == data.instruction_family[ids]).float().mean())
    assert 0.6 < same < 0.73  # 0.5 + 0.5 / 3
    data.instruction_family = None  # data without families: uniform
    assert (other_instruction(data, ids, g, same_family_share=1.0) != ids).all()


def test_done_positive_share_draws_done_frames():
    data = four_instruction_data()
    g = torch.Generator().manual_seed(0)
    base = sample_pairs(data, 4000, g, mismatched_share=0.0)
    more = sample_pairs(data, 4000, g, mismatched_share=0.0, done_positive_share=0.5)
    assert abs(float(base.done.mean()) - float(data.done.float().mean())) < 0.03
    assert abs(float(more.done.mean()) - (0.5 + 0.5 * float(data.done.float().mean()))) < 0.03
    # done frames get their own mismatched share (the pairs keep theirs); mismatched done frames are labelled 0
    split = sample_pairs(data, 4000, g, mismatched_share=0.4, done_mismatched_share=0.0)
    assert abs(float((split.kind == MISMATCHED).float().mean()) - 0.4) < 0.03
    shown = (split.done_embedding @ data.instruction_embeddings.T).argmax(1)
    state = split.done_obs["state"]
    far = state.max(1).values > 0.5  # the moving coordinate names the frame's own instruction
    assert int(far.sum()) > 1000 and torch.equal(shown[far], state[far].argmax(1))
    all_wrong = sample_pairs(data, 1000, g, mismatched_share=0.0, done_mismatched_share=1.0)
    assert float(all_wrong.done.sum()) == 0.0


@pytest.fixture(scope="module")
def gated():
    torch.manual_seed(0)
    data = four_instruction_data()
    model = VLACProgressModel({"state": [4]}, dataclasses.replace(TINY, match_gate=True))
    model.fit_state_stats(data.obs["state"])
    cfg = PRMConfig(num_updates=250, batch_size=64, lr=3e-3, max_skip=10, mismatched_share=0.3, hard_mismatch_share=0.5)
    learner = PRMLearner(model, data, cfg, torch.device("cpu"))
    stats = learner.update(250, torch.Generator().manual_seed(1))
    return model, data, stats


def test_match_gate_drives_mismatched_deltas_to_zero_and_keeps_forward_progress(gated):
    model, data, stats = gated
    assert stats["match_bce"] < 0.3
    test = dataclasses.replace(four_instruction_data(episodes=8, seed=5), instruction_embeddings=data.instruction_embeddings)
    j = torch.arange(8) * 30 + 20
    i = j - 5
    own, _ = model.progress(test.frames(i), test.frames(j), test.embedding(j))
    wrong_ids = other_instruction(test, test.instruction_id[j], torch.Generator().manual_seed(2), same_family_share=1.0)
    wrong, _ = model.progress(test.frames(i), test.frames(j), test.instruction_embeddings[wrong_ids])
    assert (own > 0.05).all()
    assert float(wrong.abs().mean()) < 0.2 * float(own.abs().mean())
    # the gate is a factor in [0, 1] of the ungated delta, and training saw the mismatched kind
    logit, match = model.pair_outputs(test.frames(i), test.frames(j), test.embedding(j))
    assert match is not None and torch.allclose(own, torch.tanh(logit) * torch.sigmoid(match))
    batch = sample_pairs(data, 512, torch.Generator().manual_seed(0), mismatched_share=0.3)
    assert int((batch.kind == MISMATCHED).sum()) > 100


def test_done_threshold_is_calibrated_on_the_calibration_episodes():
    """The calibration episodes are the last of each dataset, kept out of training; the threshold is the one of 0.05,
    0.10, ..., 0.95 with the best F1 on their frames (recomputed here from the counts), set on the model. The done
    score is a fixed function of the moving coordinate (done from 0.8), so the best threshold is inside the grid."""
    torch.manual_seed(0)
    data = four_instruction_data()
    train, calibration = split_holdout(data, 4)
    # 2 of each dataset's (d0: even, d1: odd episodes) 8 episodes: episodes 12-15, the last 120 frames
    assert torch.equal(calibration.obs["state"], data.obs["state"][360:])
    assert torch.equal(train.obs["state"], data.obs["state"][:360])
    model = VLACProgressModel({"state": [4]}, TINY)
    learner = PRMLearner(model, train, PRMConfig(num_updates=1), torch.device("cpu"), calibration_data=calibration)
    seen = []

    def score(obs, emb):  # the logit of a done score that rises with the moving coordinate, a little noisy
        seen.append(obs["state"].clone())
        moving = obs["state"].max(1).values
        return 10.0 * (moving - 0.78) + torch.sin(31.0 * obs["state"].sum(1))

    model.done_logits = score
    out = learner.calibrate_done_threshold()
    frames = torch.cat(seen)
    assert len(frames) == len(calibration)  # every calibration frame, nothing else
    order = torch.cdist(frames, calibration.obs["state"], compute_mode="donot_use_mm_for_euclid_dist").argmin(1)
    assert sorted(order.tolist()) == list(range(len(calibration)))
    probs = torch.sigmoid(score({"state": calibration.obs["state"]}, None)).numpy()
    labels = calibration.done.numpy()
    f1 = {}
    for threshold in np.round(np.arange(0.05, 0.951, 0.05), 2):
        pred = probs > threshold
        tp, fp, fn = (pred & labels).sum(), (pred & ~labels).sum(), (~pred & labels).sum()
        f1[float(threshold)] = 2 * tp / (2 * tp + fp + fn)
    best = max(f1, key=f1.get)
    assert sorted(f1.values())[-2] < f1[best] - 0.01  # one best threshold (0.5 here), inside the grid
    assert f1[best] > f1[0.05] + 0.1 and f1[best] > f1[0.95] + 0.1
    assert out["done_threshold"] == best and out["calibration_done_f1"] == pytest.approx(f1[best], abs=1e-9)
    assert model.done_threshold == model.cfg.done_threshold == best


def test_new_options_are_validated():
    from rlrobot.config import train_config

    for field, value in (("hard_mismatch_share", 1.5), ("done_positive_share", -0.1), ("match_weight", -1.0),
                         ("calibration_episodes", -1), ("success_labels", "return"),
                         ("after_success", "keep")):
        cfg = train_config("prm", task="so101-suite", dataset="x", prm=PRMConfig(**{field: value}))
        with pytest.raises(ValueError, match=f"prm.{field}"):
            cfg.validate()


def test_rank_loss_is_ranknet_on_ordered_pairs_only_and_training_lowers_it():
    from rlrobot.data.progress_labels import FORWARD, REVERSED

    torch.manual_seed(0)
    data = four_instruction_data()
    model = VLACProgressModel({"state": [4]}, dataclasses.replace(TINY, progress_head="value"))
    model.fit_state_stats(data.obs["state"])
    cfg = PRMConfig(num_updates=150, batch_size=64, lr=3e-3, max_skip=10, rank_weight=1.0, rank_temperature=0.05,
                    rank_margin=0.01)
    learner = PRMLearner(model, data, cfg, torch.device("cpu"))
    batch = sample_pairs(data, 512, torch.Generator().manual_seed(0), mismatched_share=0.2)
    with torch.no_grad():
        first = learner.losses(batch)
        logit, _ = model.pair_outputs(batch.before, batch.after, batch.embedding)
    ordered = ((batch.kind == FORWARD) | (batch.kind == REVERSED)) & (batch.delta.abs() > 0.01)
    assert 100 < int(ordered.sum()) < 512  # repeated, mismatched and tied pairs are left out
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logit[ordered] / 0.05, (batch.delta[ordered] > 0).float())
    assert torch.allclose(first["rank_bce"], expected)
    assert "rank_bce" not in PRMLearner(model, data, PRMConfig(), torch.device("cpu")).losses(batch)  # off by default
    ties = PRMLearner(model, data, dataclasses.replace(cfg, rank_mismatched_ties=True), torch.device("cpu"))
    with torch.no_grad():
        tied = ties.losses(batch)["rank_bce"]
    wrong = batch.kind == MISMATCHED  # mismatched pairs join as ties (target 1/2)
    assert int(wrong.sum()) > 50
    keep = ordered | wrong
    target = torch.where(wrong, 0.5, (batch.delta > 0).float())
    assert torch.allclose(tied, torch.nn.functional.binary_cross_entropy_with_logits(logit[keep] / 0.05, target[keep]))
    learner.update(150, torch.Generator().manual_seed(1))
    with torch.no_grad():
        after = learner.losses(batch)
    assert float(after["rank_bce"]) < 0.5 * float(first["rank_bce"])


def test_rank_options_are_validated():
    from rlrobot.config import train_config

    for field, value in (("rank_weight", -0.5), ("rank_temperature", 0.0), ("rank_margin", -0.1)):
        cfg = train_config("prm", task="so101-suite", dataset="x", prm=PRMConfig(**{field: value}))
        with pytest.raises(ValueError, match=f"prm.{field}"):
            cfg.validate()
