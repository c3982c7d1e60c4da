"""Progress labels and pairs (rlrobot.data.progress_labels): the VLAC value update and its inverse delta label, per
episode labels, pairs (reversed, repeated, mismatched; hard same-family mismatches; done-positive sampling), the
held-out split, and instructions encoded by the encoder the caller passes in (token ids from the task's vocabulary)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from progress_data import collect_suite_dataset, four_instruction_data, synthetic_data

from rlrobot.data.progress_labels import (
    FORWARD,
    MISMATCHED,
    REPEATED,
    REVERSED,
    label_episode,
    load_progress_data,
    other_instruction,
    relative_delta,
    sample_pairs,
    spearman,
    split_holdout,
    task_instruction_observation,
    value_update,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def suite_dataset(tmp_path_factory):
    return collect_suite_dataset(tmp_path_factory)


def test_value_update_is_vlac_formula_and_relative_deltas_rebuild_the_progress_curve():
    v = value_update(torch.tensor([0.0, 0.5, 0.5, 0.8]), torch.tensor([0.3, 0.5, -0.5, 1.0]))
    assert torch.allclose(v, torch.tensor([0.3, 0.75, 0.25, 1.0]))  # V + (1 - V) * delta
    assert float(value_update(torch.tensor(0.2), torch.tensor(-1.0))) == 0.0  # clipped at 0
    p = torch.tensor([0.0, 0.1, 0.3, 0.25, 0.6, 0.55, 0.9])  # progress with regressions
    value = torch.tensor(0.0)
    for before, after in zip(p[:-1], p[1:], strict=True):
        value = value_update(value, relative_delta(before, after))
        assert torch.isclose(value, after, atol=1e-6)
    assert float(relative_delta(torch.tensor(0.6), torch.tensor(0.3))) < 0 < float(relative_delta(torch.tensor(0.3),
                                                                                                    torch.tensor(0.6)))
    assert float(relative_delta(torch.tensor(1.0), torch.tensor(0.0))) == -1.0  # clipped


def test_episode_labels_time_progress_to_first_success_and_relative_dense_progress_for_failures():
    success = np.array([False, False, False, True, True, False, True])  # next.success: done from frame 4
    p, done, ok = label_episode(success, None)
    assert ok and done.tolist() == [False, False, False, False, True, True, False]
    assert np.allclose(p, [0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    reward = np.array([0.2, 0.4, 0.6, 0.5, 0.6])
    p, done, ok = label_episode(np.zeros(5, bool), reward)
    assert not ok and not done.any()
    assert np.allclose(p, [0.0, 0.0, 0.25, 0.5, 0.375])  # (phi_i - phi_0) / (1 - phi_0), phi_i = reward[i - 1]
    assert spearman(np.arange(5.0), np.arange(5.0) ** 2) == pytest.approx(1.0)
    assert np.isnan(spearman(np.zeros(4), np.arange(4.0)))
    # --prm.success-labels dense: a success labelled by its dense progress like a failure, 1 from its first done frame
    reward = np.array([0.2, 0.6, 0.4, 1.0, 1.0, 0.9, 1.0])
    p, done, ok = label_episode(success, reward, "dense")
    assert ok and done.tolist() == [False, False, False, False, True, True, False]
    assert np.allclose(p, [0.0, 0.0, 0.5, 0.25, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="success_labels must be one of"):
        label_episode(success, reward, "return")
    with pytest.raises(ValueError, match="needs the dataset's 'next.reward'"):
        label_episode(success, None, "dense")
    # --prm.after-success track: frame 6 (done lost again, e.g. the cube dropped) gets its dense progress, not 1
    p, done, ok = label_episode(success, reward, "time", "track")
    assert np.allclose(p, [0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.875])  # (0.9 - 0.2) / (1 - 0.2)
    p, _, _ = label_episode(success, reward, "time")  # hold (default): 1 from the first done frame on
    assert np.allclose(p, [0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    p, _, _ = label_episode(success, reward, "dense", "track")
    assert np.allclose(p, [0.0, 0.0, 0.5, 0.25, 1.0, 1.0, 0.875])
    with pytest.raises(ValueError, match="after_success must be one of"):
        label_episode(success, reward, "time", "keep")
    with pytest.raises(ValueError, match="after_success='track' needs"):
        label_episode(success, None, "time", "track")


def test_pairs_reversed_repeated_mismatched_labels():
    data = synthetic_data()
    batch = sample_pairs(data, 4096, torch.Generator().manual_seed(0), max_skip=10, reversed_share=0.25,
                         repeated_share=0.1, mismatched_share=0.15)
    kind = batch.kind
    for k, share in ((REVERSED, 0.25), (REPEATED, 0.1), (MISMATCHED, 0.15), (FORWARD, 0.5)):
        assert abs(float((kind == k).float().mean()) - share) < 0.03
    fwd, rev = kind == FORWARD, kind == REVERSED
    moved = batch.after["state"][:, :2].sum(1) - batch.before["state"][:, :2].sum(1)  # the moving coordinate
    assert (batch.delta[fwd] >= 0).all() and (batch.delta[rev] <= 0).all()
    assert (batch.delta[rev & (moved.abs() > 1e-6)] < 0).all() and (moved[rev] <= 1e-6).all()
    assert torch.equal(batch.before["state"][kind == REPEATED], batch.after["state"][kind == REPEATED])
    assert (batch.delta[(kind == REPEATED) | (kind == MISMATCHED)] == 0).all()
    # the mismatched pairs show the other instruction than the frames' own (which moved coordinate k)
    own = (batch.after["state"][:, 1] > batch.after["state"][:, 0]).long()  # crude: valid away from the start
    far = (batch.after["state"][:, :2].max(1).values > 0.3)
    shown = (batch.embedding @ data.instruction_embeddings.T).argmax(1)
    assert (shown[far & (kind == MISMATCHED)] != own[far & (kind == MISMATCHED)]).all()
    assert (shown[far & fwd] == own[far & fwd]).all()
    # done labels: the frames' own, except with a mismatched instruction (0)
    assert 0.05 < float(batch.done.mean()) < 0.25


def test_one_instruction_data_has_no_mismatched_negatives():
    """A single-task dataset has no other instruction: a "mismatched" pair would show its own words with label 0 and
    contradict the forward pairs (measured: it capped a lift PRM's progress at ~0.69)."""
    data = synthetic_data()
    one = dataclasses.replace(data, instruction_id=torch.zeros_like(data.instruction_id), instructions=["move x"],
                              instruction_embeddings=data.instruction_embeddings[:1])
    batch = sample_pairs(one, 4096, torch.Generator().manual_seed(0), max_skip=10, mismatched_share=0.15)
    assert not (batch.kind == MISMATCHED).any() and abs(float((batch.kind == FORWARD).float().mean()) - 0.65) < 0.03
    all_frames = float(one.done.float().mean())  # every frame's done label is its own, none zeroed as "mismatched"
    assert abs(float(batch.done.mean()) - all_frames) < 0.03


def test_holdout_split_keeps_whole_episodes_and_one_per_dataset_for_training():
    data = synthetic_data(episodes=5)
    data.episode_info = [dict(r, dataset="d") for r in data.episode_info]
    train, held = split_holdout(data, 3)
    assert len(train) == 60 and len(held) == 90
    assert held.episode_start.tolist()[:31] == [0] * 30 + [30]
    train, held = split_holdout(data, 99)
    assert len(train) == 30 and held is not None and len(held) == 120


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


def test_token_ids_come_from_the_task_encoder_passed_in_and_mismatched_pairs_carry_the_other_instructions_ids(
        suite_dataset):
    """The token ids come from each frame's task string, encoded by the task's encoder the caller passes in; a
    mismatched pair or done frame carries the *other* instruction's ids (not only its embedding); without an encoder
    the token ids are refused and a single instruction's embedding is zero."""
    from rlrobot.tasks.so101_suite import VOCABULARY

    encoder = task_instruction_observation("so101-push-to")
    shapes = {"state": (89,), "instruction_tokens": (24,)}
    data = load_progress_data(str(suite_dataset), ("state", "instruction_tokens"), shapes, instruction_observation=encoder)
    frames = data.frames(torch.arange(len(data)))
    assert "instruction_tokens" not in data.obs and frames["instruction_tokens"].shape == (len(data), 24)
    own = torch.as_tensor(VOCABULARY.encode([data.instructions[int(i)] for i in data.instruction_id]))
    assert torch.equal(frames["instruction_tokens"], own)
    batch = sample_pairs(data, 256, torch.Generator().manual_seed(0), mismatched_share=0.5)
    wrong = batch.kind == MISMATCHED
    assert wrong.any() and not torch.equal(batch.after["instruction_tokens"][wrong], own[:int(wrong.sum())])
    shown = {tuple(t.tolist()) for t in batch.after["instruction_tokens"][wrong]}
    assert shown <= {tuple(x) for x in VOCABULARY.encode(data.instructions).tolist()}
    # the tokens shown agree with the embedding shown, pair by pair
    by_embedding = {tuple(e.tolist()): i for i, e in enumerate(data.instruction_embeddings)}
    for emb, tok in zip(batch.embedding[wrong], batch.after["instruction_tokens"][wrong], strict=True):
        assert tok.tolist() == VOCABULARY.encode([data.instructions[by_embedding[tuple(emb.tolist())]]])[0].tolist()
    with pytest.raises(ValueError, match="reads 'instruction_tokens'.*no instruction vocabulary"):
        load_progress_data(str(suite_dataset), ("state", "instruction_tokens"), shapes)
    with pytest.raises(ValueError, match="has shape \\[12\\]; the task's instruction vocabulary writes \\[24\\]"):
        load_progress_data(str(suite_dataset), ("state", "instruction_tokens"), {"state": (89,), "instruction_tokens": (12,)},
                           instruction_observation=encoder)
    plain = load_progress_data(str(suite_dataset), ("state",), {"state": (89,)}, max_episodes=1)  # no encoder
    assert len(plain.instructions) == 1 and not plain.instruction_embeddings.any()
    assert task_instruction_observation("so101-lift") is None and task_instruction_observation("gym:Pendulum-v1") is None
