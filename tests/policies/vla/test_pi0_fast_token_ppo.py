"""Token-level PPO (VLA-RL) on a tiny random LeRobot pi0-FAST built offline, its FAST tokenizer fitted on the scripted
expert's so101-lift actions: per-token log-probs against an independent autoregressive evaluation, batch decoding,
first-minibatch ratio 1, parameters move. Needs the ``vla`` extra (.ci/run runs these in the Python 3.12 venv)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12; .ci/run runs these in .venv-vla)")

import rlrobot  # noqa: E402
from rlrobot.algorithms.token_ppo import TokenPPO, TokenPPOConfig, collect  # noqa: E402
from rlrobot.policies.vla.pi0_fast import build_tiny_pi0_fast, load_pi0_fast  # noqa: E402

from .test_fast_tokenizer import expert_chunks  # noqa: E402


@pytest.fixture(scope="module")
def fast_dir(tmp_path_factory):
    torch.set_num_threads(1)
    env = rlrobot.make("so101-lift", 1, control_mode="ee_delta")
    state_dim = int(env.single_observation_space["state"].shape[0])
    env.close()
    return build_tiny_pi0_fast(tmp_path_factory.mktemp("pi0fast") / "tiny", state_dim, expert_chunks(envs=2, steps=40),
                               "lift the cube", max_action_tokens=12, fast_vocab=96, seed=0)


def test_per_token_log_probs_sum_to_the_sequence_log_prob(fast_dir):
    torch.manual_seed(0)
    policy = load_pi0_fast(fast_dir)
    obs = {"state": torch.randn(3, policy.state_dim)}
    tokens, logp, mask = policy.sample(obs, generator=torch.Generator().manual_seed(1))
    assert tokens.shape == (3, 12) and bool((mask[:, 0] == 1).all())
    teacher, entropy, value = policy.token_log_probs(obs, tokens, mask)
    # independent: the sequence log-prob token by token, each from its own forward over the prefix so far
    independent = torch.zeros(3)
    with torch.no_grad():
        for t in range(tokens.shape[1]):
            hidden, _ = policy._forward(obs, tokens[:, :t])
            step = torch.log_softmax(policy._logits(hidden[:, -1]), -1).gather(1, tokens[:, t:t + 1]).squeeze(1)
            independent += step * mask[:, t]
    assert torch.allclose(teacher.sum(1), independent, atol=1e-4)
    assert torch.allclose(teacher, logp, atol=1e-4) and bool((teacher[mask == 0] == 0).all())
    assert value.shape == (3,) and bool((entropy >= 0).all())
    # a sequence ends at its first <eos>; greedy decoding is deterministic; every sequence decodes to a chunk
    for row, m in zip(tokens, mask, strict=True):
        n = int(m.sum())
        assert bool((row[:n - 1] < policy.n_actions).all())
        assert n == 12 or int(row[n - 1]) == policy.n_actions
    g1, _, m1 = policy.sample(obs, greedy=True)
    g2, _, _ = policy.sample(obs, greedy=True)
    assert torch.equal(g1, g2)
    assert policy.actions(g1, m1).shape == (3, 5, 5)
    # demonstrations round-trip through the VLM's vocabulary mapping
    demo = torch.as_tensor(expert_chunks(envs=1, steps=8)[:2], dtype=torch.float32)
    demo_tokens, demo_mask = policy.encode_actions(demo)
    assert np.abs(policy.actions(demo_tokens, demo_mask).numpy() - np.clip(demo.numpy(), policy.fast.low, policy.fast.high)
                  ).max() <= policy.fast.error_bound().max() + 1e-6


def test_token_ppo_iteration_on_so101_lift(fast_dir):
    torch.manual_seed(0)
    policy = load_pi0_fast(fast_dir)
    env = rlrobot.make("so101-lift", 2, control_mode="ee_delta", seed=0)
    obs, _ = env.reset(seed=0)
    cfg = TokenPPOConfig(rollout_chunks=2, epochs=1, num_minibatches=2, learning_rate=1e-3)
    learner = TokenPPO(policy, cfg)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    batch, obs = collect(env, policy, obs, cfg, generator=torch.Generator().manual_seed(0))
    env.close()
    assert batch["tokens"].shape[0] == 4 and batch["returns"].shape == (4,)
    stats = learner.update(batch, generator=torch.Generator().manual_seed(0))
    assert stats["first_ratio_max_dev"] < 1e-4
    moved = [n for n, p in policy.named_parameters() if not torch.equal(before[n], p)]
    assert any(n.startswith("value_head") for n in moved)
    assert any("language_model" in n for n in moved)  # the VLM itself is trained through the token log-probs
    with pytest.raises(ValueError, match="token_ppo.clip"):
        TokenPPOConfig(clip=0.0).validate()


def test_bad_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a pi0-FAST directory"):
        load_pi0_fast(tmp_path)


def test_vla_token_ppo_through_the_cli_then_served(fast_dir, tmp_path, capsys):
    """rlrobot train --algo vla-token-ppo on so101-lift (2 envs, 2 iterations), then the checkpoint reloads (the
    vla-fast policy kind) and serves the same greedy chunk as the trained policy."""
    import json

    from rlrobot.cli import main
    from rlrobot.real_robot.policy_runtime import LoadedPolicy

    out = tmp_path / "run"
    main(["train", "--algo", "vla-token-ppo", "--task", "so101-lift", "--control-mode", "ee_delta",
          "--vla-fast.path", str(fast_dir), "--out", str(out), "--num-envs", "2", "--max-episode-steps", "10",
          "--token-ppo.rollout-chunks", "1", "--token-ppo.num-minibatches", "2", "--token-ppo.epochs", "1",
          "--total-steps", "20", "--logger", "none", "--no-video", "--eval-episodes", "2", "--eval-envs", "2",
          "--eval-every", "0", "--num-threads", "1"])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ratios = [x["train/first_ratio_max_dev"] for x in lines if "train/first_ratio_max_dev" in x]
    assert len(ratios) == 2 and max(ratios) < 1e-4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 20
    served = LoadedPolicy(str(out / "checkpoints"))
    assert served.metadata["policy_kind"] == "vla-fast" and served.metadata["chunk_size"] == 5
    state = torch.zeros(served.metadata["observation_space"]["state"], dtype=torch.float32).numpy()
    first = served.infer({"state": state})
    assert first.shape == (5, 5) and (served.infer({"state": state}) == first).all()
    # rlrobot eval takes the run (its chunk timing has no denoising steps to report: it crashed on them before)
    main(["eval", "--checkpoint", str(out), "--episodes", "2", "--num-envs", "2", "--no-video", "--out",
          str(tmp_path / "eval")])
    result = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert result["episodes"] == 2 and "denoising_steps" not in result and result["chunk_latency_ms"] > 0
    # the reloaded checkpoint acts as the trained policy did in the run's own final evaluation (same seed, episodes, envs)
    assert (result["return_mean"], result["success_rate"]) == (summary["eval"]["return_mean"], summary["eval"]["success_rate"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--algo", "vla-token-ppo", "--task", "so101-lift", "--out", str(tmp_path / "bad")])
    captured = capsys.readouterr()
    assert "vla_fast.path is empty" in captured.out + captured.err


def test_token_sft_then_saved_and_reloaded(fast_dir, tmp_path):
    """pi0-FAST's next-token loss on expert chunks goes down; save_pi0_fast keeps the weights and the state
    normalisation, so the reloaded directory decodes the same greedy tokens."""
    from rlrobot.policies.vla.pi0_fast import save_pi0_fast

    torch.manual_seed(0)
    policy = load_pi0_fast(fast_dir)
    chunks = torch.as_tensor(expert_chunks(envs=1, steps=12)[:8], dtype=torch.float32)
    obs = {"state": torch.randn(8, policy.state_dim) * 0.1 + 0.5}
    policy.fit_observation_stats(obs)
    opt = torch.optim.Adam(policy.policy_parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = policy.sft_loss(obs, chunks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    out = save_pi0_fast(policy, fast_dir, tmp_path / "sft")
    reloaded = load_pi0_fast(out)
    assert torch.equal(reloaded.state_mean, policy.state_mean)
    assert torch.equal(reloaded.sample(obs, greedy=True)[0], policy.sample(obs, greedy=True)[0])
