"""The process reward model (issue 20): the VLAC value update, the training labels (reversed, repeated, mismatched
pairs; done pseudo labels), a tiny trained model flips the sign of reversed pairs, a checkpoint of another observation
space is refused, resume continues bit-exactly, prm-eval writes its curves and metrics."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from rlrobot.algorithms.prm import PRMConfig, PRMLearner, split_holdout
from rlrobot.data.progress_labels import (
    FORWARD,
    MISMATCHED,
    REPEATED,
    REVERSED,
    ProgressData,
    label_episode,
    sample_pairs,
    spearman,
)
from rlrobot.rewards.prm import (
    PRMEnsemble,
    PRMNetConfig,
    ProgressRewardModel,
    VLACProgressModel,
    check_observation_space,
    load_progress_model,
    progress_curve,
    relative_delta,
    value_update,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TINY = PRMNetConfig(state_hidden=(32,), embed_dim=16, text_dim=8, head_hidden=(32, 32))


# ---------------------------------------------------------------------------------------------- value update
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


class _OracleProgress:
    """A perfect pair model: the state is the true progress, delta = relative_delta(before, after)."""

    obs_keys = ("state",)
    done_threshold = 0.5

    def progress(self, obs_before, obs_after, instruction_embedding):
        return relative_delta(obs_before["state"][:, 0], obs_after["state"][:, 0]), (obs_after["state"][:, 0] >= 1).float()


@pytest.mark.parametrize("stride", [1, 4, 5, 7])
def test_causal_progress_curve_of_a_perfect_pair_model_is_the_true_curve_and_hold_lags(stride):
    t = torch.arange(23, dtype=torch.float32)
    # rises, falls and rises again (falls no deeper than the update's delta >= -1 can follow); frame 0 at 0
    true = (0.3 + 0.2 * torch.sin(t / 3.0)) * (t > 0)
    obs, emb = {"state": true[:, None]}, torch.zeros(384)
    values, done, chain = progress_curve(_OracleProgress(), obs, emb, stride=stride)
    assert torch.allclose(values, true, atol=1e-5)
    assert len(chain) == len(range(stride, 23, stride)) + (22 % stride != 0)
    held, _, held_chain = progress_curve(_OracleProgress(), obs, emb, stride=stride, curve="hold")
    assert torch.equal(held_chain, chain)
    ends = torch.tensor(sorted(set(range(stride, 23, stride)) | {22}))
    assert torch.allclose(held[ends], true[ends], atol=1e-5)  # the chain's ends agree
    between = torch.tensor([i for i in range(1, 23) if i % stride and i != 22], dtype=torch.long)
    if stride > 1:  # in between, hold keeps the last end's value
        assert torch.allclose(held[between], true[between // stride * stride], atol=1e-5)
        assert not torch.allclose(held, true, atol=1e-3)
    with pytest.raises(ValueError, match="curve must be one of"):
        progress_curve(_OracleProgress(), obs, emb, stride=stride, curve="linear")


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


# ---------------------------------------------------------------------------------------------- synthetic data
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


# ---------------------------------------------------------------------------------------------- checkpoints
def test_observation_space_check_names_the_key():
    check_observation_space({"state": [89]}, {"state": (89,), "instruction_embedding": (384,)})
    with pytest.raises(ValueError, match="PRM observation 'state' has shape \\[89\\] in the checkpoint; the env has \\[27\\]"):
        check_observation_space({"state": [89]}, {"state": (27,)})
    with pytest.raises(ValueError, match="PRM observation 'image_front' .* is not an observation of the env"):
        check_observation_space({"image_front": [3, 64, 64]}, {"state": (89,)})


@pytest.fixture(scope="module")
def suite_dataset(tmp_path_factory):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    out = tmp_path_factory.mktemp("prm") / "push-to"
    collect_demonstrations(CollectArgs(task="so101-push-to", episodes=3, out=str(out), num_envs=3, recipe="expert"))
    return out


def _config(out, dataset, updates: int):
    from rlrobot.config import train_config

    return train_config("prm", task="so101-suite", num_envs=1, out=str(out), dataset=str(dataset), logger="none",
                        video=True, num_threads=1, checkpoint_every=1, eval_every=0,
                        prm=PRMConfig(num_updates=updates, updates_per_iteration=2, batch_size=32, eval_dataset=str(dataset)),
                        prm_net=TINY)


def test_train_checkpoint_refuses_other_observation_space_and_resumes_exactly(suite_dataset, tmp_path):
    import rlrobot
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.runners.base import make_runner

    straight = make_runner(_config(tmp_path / "a", suite_dataset, 6)).learn()
    assert set(straight["eval"]) >= {"spearman_mean", "done_f1", "reversed_total_mean", "mismatch_ratio"}
    assert (tmp_path / "a" / "prm_eval" / "progress_curves.png").is_file()
    # interrupted after 2 of 3 iterations, then resumed
    runner = make_runner(_config(tmp_path / "b", suite_dataset, 6))
    runner._start()
    for _ in range(2):
        runner._train_and_log(None)
    runner.save()
    resumed = _config(tmp_path / "b", suite_dataset, 6)
    resumed.resume = True
    make_runner(resumed).learn()
    wa, _, _ = load_checkpoint(tmp_path / "a")
    wb, _, _ = load_checkpoint(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    env = rlrobot.make("so101-suite", 2, seed=0)
    model = load_progress_model(tmp_path / "a", "cpu", observation_space=env.single_observation_space)
    obs, _ = env.reset(seed=0)
    nxt = env.step(env.expert_action())[0]
    delta, done = model.progress(obs, nxt, obs["instruction_embedding"])
    assert delta.shape == done.shape == (2,)
    env.close()
    reach = rlrobot.make("so101-reach", 1, seed=0)
    with pytest.raises(ValueError, match="PRM observation 'state' has shape \\[89\\] in the checkpoint; the env has \\[27\\]"):
        load_progress_model(tmp_path / "a", "cpu", observation_space=reach.single_observation_space)
    reach.close()
    with pytest.raises(ValueError, match="is not a process-reward-model checkpoint"):
        bad = tmp_path / "a" / "checkpoints" / "latest"
        ckpt = tmp_path / "a" / "checkpoints" / bad.read_text().strip()
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg.pop("prm")
        (ckpt / "config.json").write_text(json.dumps(cfg))
        (ckpt / "checksums.json").unlink()
        load_progress_model(tmp_path / "a")


def test_value_head_run_trains_loads_and_refuses_a_pair_head_warm_start(suite_dataset, tmp_path):
    import rlrobot
    from rlrobot.runners.base import make_runner

    pair = make_runner(_config(tmp_path / "pair", suite_dataset, 2))
    pair.learn()
    cfg = _config(tmp_path / "value", suite_dataset, 2)
    cfg.prm_net = dataclasses.replace(TINY, progress_head="value")
    make_runner(cfg).learn()
    env = rlrobot.make("so101-suite", 2, seed=0)
    model = load_progress_model(tmp_path / "value", "cpu", observation_space=env.single_observation_space)
    assert model.cfg.progress_head == "value"
    obs, _ = env.reset(seed=0)
    delta, done = model.progress(obs, env.step(env.expert_action())[0], obs["instruction_embedding"])
    assert delta.shape == done.shape == (2,) and (delta >= -1).all() and (delta <= 1).all()
    env.close()
    cfg = _config(tmp_path / "warm", suite_dataset, 2)
    cfg.prm_net = dataclasses.replace(TINY, progress_head="value")
    cfg.prm = dataclasses.replace(cfg.prm, init=str(tmp_path / "pair"))
    with pytest.raises(ValueError, match="prm.init: .* has prm_net.progress_head 'pair', this run 'value'"):
        make_runner(cfg).learn()


def test_prm_eval_command_writes_metrics_and_curves(suite_dataset, tmp_path, trained_tiny):
    from rlrobot.commands.prm_eval import PRMEvalArgs, run_prm_eval
    from rlrobot.runners.base import make_runner

    make_runner(_config(tmp_path / "run", suite_dataset, 2)).learn()
    result = run_prm_eval(PRMEvalArgs(checkpoint=str(tmp_path / "run"), dataset=str(suite_dataset), out=str(tmp_path / "ev")))
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())["metrics"]
    assert json.dumps(m, sort_keys=True) == json.dumps(result["metrics"], sort_keys=True, default=float)  # as returned
    assert m["episodes"] == 3 and m["reversed_episodes"] == 3
    assert (tmp_path / "ev" / "progress_curves.png").stat().st_size > 10_000
    # done F1: done probabilities over the threshold against every frame's done label, recounted here
    from rlrobot.data.progress_labels import load_progress_data

    model = load_progress_model(tmp_path / "run")
    data = load_progress_data(str(suite_dataset), model.obs_keys, {k: tuple(v) for k, v in model.observation_space.items()})
    predicted, labels = [], []
    for a, b in data.episodes():
        idx = torch.arange(a, b)
        _, done, _ = progress_curve(model, data.frames(idx), data.embedding(idx), stride=5)
        predicted.append(done > model.done_threshold)
        labels.append(data.done[idx])
    predicted, labels = torch.cat(predicted), torch.cat(labels)
    tp, fp, fn = (int((p & q).sum()) for p, q in ((predicted, labels), (predicted, ~labels), (~predicted, labels)))
    assert tp + fp > 0 and labels.any() and m["frames"] == len(labels)
    assert m["done_f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    with pytest.raises(ValueError, match="stride must be >= 1"):
        run_prm_eval(PRMEvalArgs(checkpoint=str(tmp_path / "run"), dataset=str(suite_dataset), stride=0))


def test_ensemble_of_runs_averages_deltas_and_done_and_refuses_another_observation_space(suite_dataset, tmp_path):
    import rlrobot
    from rlrobot.commands.prm_eval import PRMEvalArgs, run_prm_eval
    from rlrobot.rewards.prm_reward import check_prm_path
    from rlrobot.runners.base import make_runner

    for seed in (0, 1):
        cfg = _config(tmp_path / f"s{seed}", suite_dataset, 2)
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


def test_holdout_split_keeps_whole_episodes_and_one_per_dataset_for_training():
    data = synthetic_data(episodes=5)
    data.episode_info = [dict(r, dataset="d") for r in data.episode_info]
    train, held = split_holdout(data, 3)
    assert len(train) == 60 and len(held) == 90
    assert held.episode_start.tolist()[:31] == [0] * 30 + [30]
    train, held = split_holdout(data, 99)
    assert len(train) == 30 and held is not None and len(held) == 120


def test_config_validation_names_the_field():
    from rlrobot.config import train_config

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


def test_bench_prm_figure_beside_the_env_step():
    from rlrobot.bench.prm_bench import prm_bench

    row = prm_bench(num_envs=4, seconds=0.1, num_threads=1)
    assert row["num_envs"] == 4 and row["env_step_ms"] > 0 and row["prm_ms"] > 0
    assert row["prm_over_env"] == pytest.approx(row["prm_ms"] / row["env_step_ms"])


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



def _suite_entity_net() -> PRMNetConfig:
    from rlrobot.tasks.so101_suite import SO101Suite

    return dataclasses.replace(TINY, obs_keys=("state", "instruction_tokens"), state_entities=SO101Suite.state_entities,
                               entity_names=SO101Suite.entity_name_tokens, entity_anchor=SO101Suite.tcp_index,
                               entity_dim=16)


def test_token_and_entity_prm_reads_the_instruction_words_in_training_eval_and_the_env(suite_dataset, tmp_path):
    """--prm-net.obs-keys state instruction_tokens (+ entity attention): the token ids come from each frame's task
    string; a mismatched pair or done frame carries the *other* instruction's ids (not only its embedding); the run
    trains, evaluates, and its checkpoint scores env observations."""
    import rlrobot
    from rlrobot.data.progress_labels import load_progress_data
    from rlrobot.runners.base import make_runner
    from rlrobot.tasks.so101_suite import VOCABULARY

    data = load_progress_data(str(suite_dataset), ("state", "instruction_tokens"), {"state": (89,), "instruction_tokens": (24,)})
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

    cfg = _config(tmp_path / "run", suite_dataset, 4)
    cfg.prm_net = _suite_entity_net()
    result = make_runner(cfg).learn()
    assert (result["eval"]["episodes"], result["eval"]["frames"]) == (3, len(data))  # evaluated on every eval frame
    env = rlrobot.make("so101-suite", 2, seed=0)
    model = load_progress_model(tmp_path / "run", "cpu", observation_space=env.single_observation_space)
    assert model.encoder.entities is not None and model.completion.encoder.entities is not None
    obs, _ = env.reset(seed=0)
    nxt = env.step(env.expert_action())[0]
    done_own = model.done_logits(nxt, obs["instruction_embedding"])
    swapped = {**nxt, "instruction_tokens": nxt["instruction_tokens"].flip(0)}
    assert not torch.allclose(done_own, model.done_logits(swapped, obs["instruction_embedding"]))
    env.close()


def test_entity_prm_config_names_the_missing_field():
    from rlrobot.config import train_config

    net = _suite_entity_net()
    for bad, match in [(dict(obs_keys=("state",)), "entity_names needs 'instruction_tokens'"),
                       (dict(entity_names=()), "state_entities needs prm_net.entity_names"),
                       (dict(state_entities=(), entity_names=()), "entity_names / entity_anchor need"),
                       (dict(entity_names=net.entity_names[:2]), "prm_net.entity_names has 2 names")]:
        cfg = train_config("prm", task="so101-suite", dataset="x", prm_net=dataclasses.replace(net, **bad))
        with pytest.raises(ValueError, match=match):
            cfg.validate()
