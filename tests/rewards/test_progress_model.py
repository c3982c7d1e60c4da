"""The VLAC-style progress model (rlrobot.rewards.progress_model): a tiny trained model flips the sign of reversed
pairs and shrinks under a mismatched instruction, the value head's deltas compose, images are encoded, a checkpoint of
another observation space is refused, runs average as an ensemble, a checkpoint that records no vocabulary size takes
its token embedding's, and the bench figure of its inference cost."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from progress_data import TINY, collect_suite_dataset, prm_run_config, suite_entity_net, synthetic_data

from rlrobot.algorithms.progress_model import PRMConfig, PRMLearner
from rlrobot.data.progress_labels import spearman, value_update
from rlrobot.data.progress_metrics import progress_curve
from rlrobot.rewards.progress_model import (
    PRMEnsemble,
    ProgressRewardModel,
    VLACProgressModel,
    check_observation_space,
    load_progress_model,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def suite_dataset(tmp_path_factory):
    return collect_suite_dataset(tmp_path_factory)


@pytest.fixture(scope="module", params=["pair", "value"])
def trained_tiny(request):
    torch.manual_seed(0)
    data = synthetic_data()
    model = VLACProgressModel({"state": [4]}, dataclasses.replace(TINY, progress_head=request.param))
    model.fit_state_stats(data.obs["state"])
    learner = PRMLearner(model, data, PRMConfig(num_updates=300, batch_size=128, lr=3e-3, max_skip=10), torch.device("cpu"))
    learner.update(300, torch.Generator().manual_seed(1))
    return model, data


def test_trained_tiny_model_flips_the_sign_of_reversed_pairs(trained_tiny):
    model, _ = trained_tiny
    assert isinstance(model, ProgressRewardModel)
    test = synthetic_data(episodes=4, seed=7)
    g = torch.Generator().manual_seed(3)
    j = torch.randint(5, 30, (200,), generator=g) + 30 * torch.randint(0, 4, (200,), generator=g)
    i = j - torch.randint(3, 6, (200,), generator=g)
    emb = test.embedding(j)
    fwd, done_fwd = model.progress(test.frames(i), test.frames(j), emb)
    rev, _ = model.progress(test.frames(j), test.frames(i), emb)
    assert fwd.shape == (200,) and done_fwd.shape == (200,) and fwd.abs().max() <= 1.0
    assert float((fwd > 0).float().mean()) > 0.95 and float((rev < 0).float().mean()) > 0.95
    assert float(((fwd > 0) & (rev < 0)).float().mean()) > 0.95  # the same pairs flip sign
    # a whole held-out episode: the value curve rises with time, done late
    idx = torch.arange(30)
    values, done, _ = progress_curve(model, test.frames(idx), test.embedding(idx), stride=3)
    assert spearman(values.numpy(), np.arange(30)) > 0.9
    assert float(done[-3:].mean()) > 0.5 > float(done[:10].mean())


def test_mismatched_instruction_gives_smaller_deltas(trained_tiny):
    model, data = trained_tiny
    j = torch.arange(10, 360, 30) + 15
    i = j - 5
    own, _ = model.progress(data.frames(i), data.frames(j), data.embedding(j))
    other = data.instruction_embeddings[1 - data.instruction_id[j]]
    wrong, done = model.progress(data.frames(i), data.frames(j), other)
    assert float(wrong.abs().mean()) < 0.5 * float(own.abs().mean())


def test_value_head_deltas_compose_so_a_chain_equals_the_long_pair():
    """progress_head "value": delta = (V_a - V_b) / (1 - V_b) of one per-frame V, so the value update of delta(a, b)
    by delta(b, c) is delta(a, c) wherever nothing is clipped: an episode's chain does not depend on the stride."""
    torch.manual_seed(0)
    model = VLACProgressModel({"state": [4]}, dataclasses.replace(TINY, progress_head="value"))
    g = torch.Generator().manual_seed(0)
    a, b, c = ({"state": torch.randn(4000, 4, generator=g)} for _ in range(3))
    emb = torch.randn(4000, 384, generator=g)
    d_ab, _ = model.progress(a, b, emb)
    d_bc, _ = model.progress(b, c, emb)
    d_ac, _ = model.progress(a, c, emb)
    chained = value_update(d_ab, d_bc)
    free = (d_ab >= 0) & (d_bc > -1 + 1e-4) & (d_ac > 0)  # no clip at -1 nor at value 0
    assert int(free.sum()) > 200
    assert torch.allclose(chained[free], d_ac[free], atol=1e-5)
    with torch.no_grad():
        w = model.frame_score(a, emb), model.frame_score(b, emb)
    assert torch.allclose(d_ab, (1 - torch.exp(w[0] - w[1])).clamp_min(-1), atol=1e-5)
    pair = VLACProgressModel({"state": [4]}, TINY)  # the pair head reads both frames' encodings, the value head one
    assert pair.pair_in.in_features == 3 * TINY.embed_dim + TINY.text_dim
    assert model.pair_in.in_features == TINY.embed_dim + TINY.text_dim


def test_observation_space_check_names_the_key():
    check_observation_space({"state": [89]}, {"state": (89,), "instruction_embedding": (384,)})
    with pytest.raises(ValueError, match="PRM observation 'state' has shape \\[89\\] in the checkpoint; the env has \\[27\\]"):
        check_observation_space({"state": [89]}, {"state": (27,)})
    with pytest.raises(ValueError, match="PRM observation 'image_front' .* is not an observation of the env"):
        check_observation_space({"image_front": [3, 64, 64]}, {"state": (89,)})


def test_image_and_state_observations_are_encoded():
    cfg = dataclasses.replace(TINY, obs_keys=("state", "image_front"), conv_channels=(4, 8))
    model = VLACProgressModel({"state": [4], "image_front": [3, 16, 16]}, cfg)
    gen = torch.Generator().manual_seed(0)
    obs = {"state": torch.randn(5, 4, generator=gen), "image_front": torch.randint(0, 256, (5, 3, 16, 16), generator=gen,
                                                                                   dtype=torch.uint8)}
    other = {"state": obs["state"], "image_front": 255 - obs["image_front"]}
    delta, done = model.progress(obs, other, torch.randn(5, 384, generator=gen))
    assert delta.shape == done.shape == (5,) and delta.abs().max() <= 1.0 and ((done > 0) & (done < 1)).all()
    assert model.observation_space == {"state": [4], "image_front": [3, 16, 16]}
    logits = model.delta_logits(obs, other, torch.zeros(5, 384))
    logits.sum().backward()  # the conv encoder is trained with the rest
    assert model.encoder.parts["image_front"][0].weight.grad.abs().sum() > 0


def test_ensemble_of_runs_averages_deltas_and_done_and_refuses_another_observation_space(suite_dataset, tmp_path):
    import rlrobot
    from rlrobot.commands.prm_eval import PRMEvalArgs, run_prm_eval
    from rlrobot.rewards.progress_reward import check_prm_path
    from rlrobot.runners.base import make_runner

    for seed in (0, 1):
        cfg = prm_run_config(tmp_path / f"s{seed}", suite_dataset, 2)
        cfg.seed = seed
        make_runner(cfg).learn()
    env = rlrobot.make("so101-suite", 3, seed=0)
    paths = f"{tmp_path / 's0'},{tmp_path / 's1'}"
    ensemble = load_progress_model(paths, "cpu", observation_space=env.single_observation_space)
    members = [load_progress_model(tmp_path / f"s{seed}") for seed in (0, 1)]
    assert isinstance(ensemble, PRMEnsemble) and isinstance(ensemble, ProgressRewardModel)
    obs, _ = env.reset(seed=0)
    nxt = env.step(env.expert_action())[0]
    emb = obs["instruction_embedding"]
    (d0, p0), (d1, p1) = (m.progress(obs, nxt, emb) for m in members)
    delta, done = ensemble.progress(obs, nxt, emb)
    assert not torch.allclose(d0, d1)  # two seeds: two models
    assert torch.allclose(delta, (d0 + d1) / 2) and torch.allclose(done, (p0 + p1) / 2)
    assert ensemble.done_threshold == pytest.approx(sum(m.done_threshold for m in members) / 2)
    env.close()
    other = VLACProgressModel({"state": [27]}, TINY)
    with pytest.raises(ValueError, match="members must share one observation space"):
        PRMEnsemble([members[0], other], ["a", "reach"])
    with pytest.raises(ValueError, match="at least 2 members"):
        PRMEnsemble([members[0]])
    with pytest.raises(ValueError, match="reward.shaping: PRM checkpoint .*nope.* does not exist"):
        check_prm_path(f"{tmp_path / 's0'},{tmp_path / 'nope'}")
    run_prm_eval(PRMEvalArgs(checkpoint=paths, dataset=str(suite_dataset)))
    assert (tmp_path / "s0" / "prm_eval_ensemble2" / "metrics.json").is_file()


def test_bench_prm_figure_beside_the_env_step():
    from rlrobot.bench.prm_bench import prm_bench

    row = prm_bench(num_envs=4, seconds=0.1, num_threads=1)
    assert row["num_envs"] == 4 and row["env_step_ms"] > 0 and row["prm_ms"] > 0
    assert row["prm_over_env"] == pytest.approx(row["prm_ms"] / row["env_step_ms"])


def test_a_checkpoint_without_a_vocabulary_size_takes_its_token_embeddings_rows(suite_dataset, tmp_path):
    """A PRM that reads token ids is built with the task's vocabulary size (the range of its instruction_tokens
    observation), recorded in the checkpoint; a checkpoint that records none loads with its token embedding's rows."""
    import json

    from rlrobot.runners.base import make_runner
    from rlrobot.tasks.so101_suite import VOCABULARY

    cfg = prm_run_config(tmp_path / "run", suite_dataset, 2)
    cfg.prm_net = suite_entity_net()
    assert cfg.prm_net.instruction_vocab == 0  # the task's, read when the run builds the model
    make_runner(cfg).learn()
    model = load_progress_model(tmp_path / "run")
    assert model.cfg.instruction_vocab == len(VOCABULARY)
    ckpt = tmp_path / "run" / "checkpoints" / (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    saved = json.loads((ckpt / "config.json").read_text())
    del saved["prm"]["net"]["instruction_vocab"]
    (ckpt / "config.json").write_text(json.dumps(saved))
    (ckpt / "checksums.json").unlink()
    again = load_progress_model(tmp_path / "run")
    assert again.cfg.instruction_vocab == len(VOCABULARY)
    obs = {"state": torch.randn(3, 89), "instruction_tokens": torch.as_tensor(VOCABULARY.encode(["push the red cube"] * 3))}
    emb = torch.randn(3, 384)
    assert torch.equal(model.progress(obs, obs, emb)[0], again.progress(obs, obs, emb)[0])
    with pytest.raises(ValueError, match="prm_net.instruction_vocab=0: a PRM that reads 'instruction_tokens'"):
        VLACProgressModel({"state": [89], "instruction_tokens": [24]}, suite_entity_net())
