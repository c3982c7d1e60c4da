"""The FAST action tokenizer fitted offline on our action data (DCT + quantisation + a BPE from ``tokenizers``): the
round-trip error bound, compression, persistence, refusals. No LeRobot needed."""

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.policies.vla.fast_tokenizer import FASTActionTokenizer, dct_matrix


def expert_chunks(task="so101-lift", envs=4, steps=60, horizon=5, seed=0):
    """Sliding windows of the scripted expert's actions on the simulator: [N, horizon, action_dim]."""
    env = rlrobot.make(task, envs, control_mode="ee_delta", seed=seed)
    env.reset(seed=seed)
    actions = []
    for _ in range(steps):
        a = env.expert_action().clamp(-1, 1)
        actions.append(a)
        env.step(a)
    env.close()
    seq = torch.stack(actions, 1).numpy()  # [envs, steps, A]
    return np.concatenate([seq[:, i:i + horizon] for i in range(steps - horizon + 1)])


def test_dct_matrix_is_orthonormal():
    c = dct_matrix(7)
    assert np.allclose(c @ c.T, np.eye(7), atol=1e-12)


def test_round_trip_within_the_bound_on_expert_chunks(tmp_path):
    chunks = expert_chunks()
    tok = FASTActionTokenizer.fit(chunks, scale=10.0, vocab_size=128)
    bound = tok.error_bound()
    inside = np.clip(chunks, tok.low, tok.high)  # the fitted 1st / 99th percentiles clip the rest, as FAST's
    errors = np.stack([np.abs(tok.decode(tok.encode(c)) - x).max(0) for c, x in zip(chunks, inside, strict=True)])
    assert (errors.max(0) <= bound + 1e-6).all(), (errors.max(0), bound)
    assert errors.mean() < 0.5 * bound.mean()
    lengths = [len(tok.encode(c)) for c in chunks]
    assert np.mean(lengths) < 0.8 * chunks.shape[1] * chunks.shape[2]  # the BPE compresses the integer string
    tok.save(tmp_path / "fast")
    loaded = FASTActionTokenizer.load(tmp_path / "fast")
    assert all(loaded.encode(c) == tok.encode(c) for c in chunks[:20])
    assert loaded.decode([1, 2, 3]).shape == (5, chunks.shape[2])  # any ids decode to a chunk (padded / cut)


def test_refusals(tmp_path):
    chunks = np.zeros((4, 5, 2))
    with pytest.raises(ValueError, match="vocab_size"):
        FASTActionTokenizer.fit(chunks, vocab_size=8)
    with pytest.raises(ValueError, match=r"chunks must be \[N"):
        FASTActionTokenizer.fit(np.zeros((5, 2)))
    tok = FASTActionTokenizer.fit(chunks)
    with pytest.raises(ValueError, match="chunk shape"):
        tok.encode(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="no fitted FAST tokenizer"):
        FASTActionTokenizer.load(tmp_path)
