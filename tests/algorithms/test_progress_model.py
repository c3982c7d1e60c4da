"""Training the progress model (``--algo prm``, rlrobot.algorithms.progress_model): the options for the held-out
targets (the match gate that drives a mismatched instruction's delta to 0, the done threshold chosen on calibration
episodes kept out of training, the ranking loss) and every option's validation naming the field."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from progress_data import TINY, four_instruction_data, suite_entity_net

from rlrobot.algorithms.progress_model import PRMConfig, PRMLearner
from rlrobot.config import train_config
from rlrobot.data.progress_labels import FORWARD, MISMATCHED, REVERSED, other_instruction, sample_pairs, split_holdout
from rlrobot.rewards.progress_model import PRMNetConfig, VLACProgressModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
    for field, value in (("hard_mismatch_share", 1.5), ("done_positive_share", -0.1), ("match_weight", -1.0),
                         ("calibration_episodes", -1), ("success_labels", "return"),
                         ("after_success", "keep")):
        cfg = train_config("prm", task="so101-suite", dataset="x", prm=PRMConfig(**{field: value}))
        with pytest.raises(ValueError, match=f"prm.{field}"):
            cfg.validate()


def test_rank_loss_is_ranknet_on_ordered_pairs_only_and_training_lowers_it():
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
    for field, value in (("rank_weight", -0.5), ("rank_temperature", 0.0), ("rank_margin", -0.1)):
        cfg = train_config("prm", task="so101-suite", dataset="x", prm=PRMConfig(**{field: value}))
        with pytest.raises(ValueError, match=f"prm.{field}"):
            cfg.validate()


def test_config_validation_names_the_field():
    cfg = train_config("prm", task="so101-suite", dataset="x")
    cfg.prm = dataclasses.replace(cfg.prm, reversed_share=0.6, mismatched_share=0.5)
    with pytest.raises(ValueError, match="prm.\\*_share"):
        cfg.validate()
    cfg = train_config("prm", task="so101-suite", dataset="x", prm=PRMConfig(exclude_families=("towers",)))
    with pytest.raises(ValueError, match="prm.exclude_families: 'towers' is not one of"):
        cfg.validate()
    cfg = train_config("prm", task="so101-suite")
    with pytest.raises(ValueError, match="dataset: algo='prm' trains from LeRobotDatasets"):
        cfg.validate()
    cfg = train_config("prm", task="so101-suite", dataset="x", prm_net=PRMNetConfig(obs_keys=("depth",)))
    with pytest.raises(ValueError, match="prm_net.obs_keys: 'depth' is not 'state', 'instruction_tokens' or an image key"):
        cfg.validate()
    cfg = train_config("prm", task="so101-suite", dataset="x", prm_net=PRMNetConfig(progress_head="values"))
    with pytest.raises(ValueError, match="prm_net.progress_head must be one of \\('pair', 'value'\\)"):
        cfg.validate()
    cfg = train_config("prm", task="so101-suite", dataset="x", prm_net=PRMNetConfig(progress_head="value", match_gate=True))
    with pytest.raises(ValueError, match="prm_net.match_gate needs prm_net.progress_head 'pair'"):
        cfg.validate()


def test_entity_prm_config_names_the_missing_field():
    net = suite_entity_net()
    for bad, match in [(dict(obs_keys=("state",)), "entity_names needs 'instruction_tokens'"),
                       (dict(entity_names=()), "state_entities needs prm_net.entity_names"),
                       (dict(state_entities=(), entity_names=()), "entity_names / entity_anchor need"),
                       (dict(entity_names=net.entity_names[:2]), "prm_net.entity_names has 2 names")]:
        cfg = train_config("prm", task="so101-suite", dataset="x", prm_net=dataclasses.replace(net, **bad))
        with pytest.raises(ValueError, match=match):
            cfg.validate()
