"""Progress metrics (rlrobot.data.progress_metrics) and ``rlrobot prm-eval``: the causal progress curve of a perfect
pair model is the true curve, the command writes metrics and curves, its done F1 recounted by hand."""

from __future__ import annotations

import json
import os

import pytest
import torch
from progress_data import collect_suite_dataset, prm_run_config

from rlrobot.data.progress_labels import load_progress_data, relative_delta, task_instruction_observation
from rlrobot.data.progress_metrics import progress_curve
from rlrobot.rewards.progress_model import load_progress_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def suite_dataset(tmp_path_factory):
    return collect_suite_dataset(tmp_path_factory)


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


def test_prm_eval_command_writes_metrics_and_curves(suite_dataset, tmp_path):
    from rlrobot.commands.prm_eval import PRMEvalArgs, run_prm_eval
    from rlrobot.runners.base import make_runner

    make_runner(prm_run_config(tmp_path / "run", suite_dataset, 2)).learn()
    result = run_prm_eval(PRMEvalArgs(checkpoint=str(tmp_path / "run"), dataset=str(suite_dataset), out=str(tmp_path / "ev")))
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())["metrics"]
    assert json.dumps(m, sort_keys=True) == json.dumps(result["metrics"], sort_keys=True, default=float)  # as returned
    assert m["episodes"] == 3 and m["reversed_episodes"] == 3
    assert (tmp_path / "ev" / "progress_curves.png").stat().st_size > 10_000
    # done F1: done probabilities over the threshold against every frame's done label, recounted here
    model = load_progress_model(tmp_path / "run")
    data = load_progress_data(str(suite_dataset), model.obs_keys, {k: tuple(v) for k, v in model.observation_space.items()},
                              instruction_observation=task_instruction_observation("so101-push-to"))
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
