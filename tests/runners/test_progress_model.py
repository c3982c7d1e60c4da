"""Progress-model runs (rlrobot.runners.progress_model): a PRM run checkpoints, evaluates, resumes bit-exactly and its
checkpoint refuses another observation space; a value-head run refuses a pair-head warm start; a token / entity PRM
run reads the instruction's words in training, evaluation and the env."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from progress_data import TINY, collect_suite_dataset, prm_run_config, suite_entity_net

from rlrobot.data.progress_labels import load_progress_data, task_instruction_observation
from rlrobot.rewards.progress_model import load_progress_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def suite_dataset(tmp_path_factory):
    return collect_suite_dataset(tmp_path_factory)


def test_train_checkpoint_refuses_other_observation_space_and_resumes_exactly(suite_dataset, tmp_path):
    import rlrobot
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.runners.base import make_runner

    straight = make_runner(prm_run_config(tmp_path / "a", suite_dataset, 6)).learn()
    assert set(straight["eval"]) >= {"spearman_mean", "done_f1", "reversed_total_mean", "mismatch_ratio"}
    assert (tmp_path / "a" / "prm_eval" / "progress_curves.png").is_file()
    # interrupted after 2 of 3 iterations, then resumed
    runner = make_runner(prm_run_config(tmp_path / "b", suite_dataset, 6))
    runner._start()
    for _ in range(2):
        runner._train_and_log(None)
    runner.save()
    resumed = prm_run_config(tmp_path / "b", suite_dataset, 6)
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

    pair = make_runner(prm_run_config(tmp_path / "pair", suite_dataset, 2))
    pair.learn()
    cfg = prm_run_config(tmp_path / "value", suite_dataset, 2)
    cfg.prm_net = dataclasses.replace(TINY, progress_head="value")
    make_runner(cfg).learn()
    env = rlrobot.make("so101-suite", 2, seed=0)
    model = load_progress_model(tmp_path / "value", "cpu", observation_space=env.single_observation_space)
    assert model.cfg.progress_head == "value"
    obs, _ = env.reset(seed=0)
    delta, done = model.progress(obs, env.step(env.expert_action())[0], obs["instruction_embedding"])
    assert delta.shape == done.shape == (2,) and (delta >= -1).all() and (delta <= 1).all()
    env.close()
    cfg = prm_run_config(tmp_path / "warm", suite_dataset, 2)
    cfg.prm_net = dataclasses.replace(TINY, progress_head="value")
    cfg.prm = dataclasses.replace(cfg.prm, init=str(tmp_path / "pair"))
    with pytest.raises(ValueError, match="prm.init: .* has prm_net.progress_head 'pair', this run 'value'"):
        make_runner(cfg).learn()


def test_token_and_entity_prm_run_reads_the_instruction_words_in_training_eval_and_the_env(suite_dataset, tmp_path):
    """--prm-net.obs-keys state instruction_tokens (+ entity attention): the run trains, evaluates every frame of its
    evaluation episodes, and its checkpoint scores env observations by their token ids."""
    import rlrobot
    from rlrobot.runners.base import make_runner

    data = load_progress_data(str(suite_dataset), ("state",), {"state": (89,)},
                              instruction_observation=task_instruction_observation("so101-push-to"))
    cfg = prm_run_config(tmp_path / "run", suite_dataset, 4)
    cfg.prm_net = suite_entity_net()
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
