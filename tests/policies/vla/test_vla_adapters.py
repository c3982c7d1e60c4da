"""LeRobot pi0 / pi0.5 / SmolVLA behind the FlowPolicy protocol, on tiny random checkpoints built offline (LeRobot's own
classes, saved with LeRobot's save_pretrained): exact chain log-probs, Flow-Noise and Flow-SDE PPO through the CLI on
so101-lift (first-minibatch ratio 1, parameters move), LoRA, deterministic evaluation, save -> reload.

These need the ``vla`` extra (Python >= 3.12, lerobot 0.6.1): ``.ci/run`` runs them in ``.venv-vla``. The refusals
that need no LeRobot are in ``test_vla_config.py``.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12; .ci/run runs these in .venv-vla)")

from safetensors.torch import load_file, save_file  # noqa: E402

from rlrobot.algorithms.flow_ppo import FlowPPO, FlowPPOConfig  # noqa: E402
from rlrobot.checkpoints import load_checkpoint  # noqa: E402
from rlrobot.cli import main  # noqa: E402
from rlrobot.policies.flow import sde_sigmas, time_grid  # noqa: E402
from rlrobot.policies.vla.config import VLAConfig  # noqa: E402
from rlrobot.policies.vla.load import build_vla  # noqa: E402
from rlrobot.policies.vla.tiny import build_tiny  # noqa: E402
from rlrobot.tasks.registry import make  # noqa: E402

VARIANTS = ("pi0", "pi05", "smolvla")
TASK = dict(obs_mode="state+rgb", control_mode="joint_pos")


@pytest.fixture(scope="module")
def lift():
    env = make("so101-lift", 2, **TASK)
    obs, _ = env.reset(seed=0)
    meta = {"observation_space": {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()},
            "action_dim": int(env.single_action_space.shape[0])}
    instruction = env.instruction[0]
    env.close()
    return meta, obs, instruction


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, lift):
    meta, _, instruction = lift
    root = tmp_path_factory.mktemp("vla")
    return {v: build_tiny(v, root / v, meta["observation_space"], meta["action_dim"], [instruction], chunk_size=5,
                          denoising_steps=3, seed=1) for v in VARIANTS}


def _policy(tiny_dirs, lift, variant: str, **kw):
    meta, _, instruction = lift
    torch.manual_seed(0)
    return build_vla(meta, VLAConfig(path=str(tiny_dirs[variant]), instruction=instruction, **kw))


def _normal(x, mean, std):
    return torch.distributions.Normal(mean, std).log_prob(x)


@pytest.mark.parametrize("variant", VARIANTS)
def test_chain_log_probs_equal_independent_per_step_gaussians(variant, tiny_dirs, lift):
    """sample_chain's and chain_log_prob's per-step log-densities against torch.distributions.Normal on means / stds
    recomputed step by step from the adapter's velocity (the padded dims carried along) and noise head (Flow-Noise) or
    the SDE formula (Flow-SDE); chain_log_prob of a single later step (the padded dims recomputed) agrees too."""
    policy = _policy(tiny_dirs, lift, variant)
    _, obs, _ = lift
    k = policy.denoising_steps
    grid = time_grid(k)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        emb = policy.encode(obs)
        for mode in ("noise", "sde"):
            chain, log_probs = policy.sample_chain(obs, mode, 0.5, generator=g, emb=emb)
            assert chain.shape == (2, k + 1, policy.flat_dim)
            sigmas = sde_sigmas(grid, 0.5)
            padded = torch.zeros(2, policy.chunk_size, policy.padded_dim)  # LeRobot's padded dims, integrated by the ODE
            for step in range(k):
                x, t, dt = chain[:, step], grid[step], grid[step] - grid[step + 1]
                with policy._padded_state(padded):
                    v, feats = policy.velocity(x, t.expand(2), emb)
                    padded = padded - dt * policy._padded_velocity
                if mode == "noise":
                    mean, std = x - dt * v, policy.noise_std(feats)
                else:
                    a_hat, eps_hat = x - t * v, x + (1 - t) * v
                    s = sigmas[step]
                    mean = a_hat * (1 - (t - dt)) + eps_hat * ((t - dt) - s**2 * dt / (2 * t))
                    std = (dt.sqrt() * s).expand_as(mean)
                expected = _normal(chain[:, step + 1], mean, std)
                torch.testing.assert_close(log_probs[:, step], expected, rtol=1e-4, atol=1e-4)
            steps = torch.arange(k).expand(2, k)
            again, _, _ = policy.chain_log_prob(obs, chain, steps, mode, 0.5)
            torch.testing.assert_close(again, log_probs, rtol=1e-4, atol=1e-4)
            last, _, _ = policy.chain_log_prob(obs, chain, torch.tensor([[k - 1], [1]]), mode, 0.5)
            torch.testing.assert_close(last[:, 0], torch.stack([log_probs[0, k - 1], log_probs[1, 1]]), rtol=1e-4, atol=1e-4)
        # Flow-Noise stds stay in [0.08, 0.16]; deterministic sampling is repeatable
        _, feats = policy.velocity(torch.zeros(2, policy.flat_dim), torch.ones(2), emb)
        std = policy.noise_std(feats)
        assert float(std.min()) >= 0.08 - 1e-6 and float(std.max()) <= 0.16 + 1e-6
        a1, a2 = policy.sample_actions(obs), policy.sample_actions(obs)
    assert a1.shape == (2, 5, 6) and torch.equal(a1, a2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_flow_ppo_update_ratio_one_and_parameters_move(variant, tiny_dirs, lift, tmp_path):
    """One Flow-Noise and one Flow-SDE (hybrid) PPO update on a real so101-lift rollout batch: the first minibatch's
    ratios are 1, every trainable part (VLM, expert, noise and value heads) moves."""
    for algo in ("noise", "sde"):
        policy = _policy(tiny_dirs, lift, variant)
        env = make("so101-lift", 4, **TASK)
        obs, _ = env.reset(seed=0)
        keys = policy.obs_keys
        specs = {k: (tuple(env.single_observation_space[k].shape), obs[k].dtype) for k in keys}
        learner = FlowPPO(policy, FlowPPOConfig(rollout_chunks=2, num_epochs=1, num_minibatches=2, lr=1e-3),
                          algo, torch.device("cpu"), 4, specs)
        g = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            for _ in range(2):
                actions, fields, value = learner.rollout_act(obs, g)
                chunk_obs = {k: obs[k] for k in keys}
                reward = torch.zeros(4)
                for j in range(policy.execute_steps):
                    obs, r, _, _, _ = env.step(actions[:, j].clamp(-1, 1))
                    reward += r
                learner.storage.add(chunk_obs, **fields, values=value, rewards=reward, dones=torch.zeros(4))
            learner.storage.compute_returns(policy.value(obs), 0.99, 0.95)
        env.close()
        before = {n: p.detach().clone() for n, p in policy.named_parameters()}
        stats = learner.update(g)
        assert stats["first_ratio_max_deviation"] < 1e-4, (variant, algo, stats)
        moved = {n for n, p in policy.named_parameters() if not torch.equal(before[n], p)}
        assert any(n.startswith("value_head") for n in moved)
        assert any(n.startswith("lerobot.model.") for n in moved), "the VLA's own weights must train"
        if algo == "noise":
            assert any(n.startswith("noise_head") for n in moved)
            # save -> reload (a fresh build from the pretrained directory + the saved weights): identical actions
            path = tmp_path / f"{variant}.safetensors"
            save_file(policy.state_dict(), path)
            reloaded = _policy(tiny_dirs, lift, variant)
            reloaded.load_state_dict(load_file(path))
            with torch.no_grad():
                assert torch.equal(policy.sample_actions(obs), reloaded.sample_actions(obs))


def test_lora_deltas_move_and_base_weights_stay(tiny_dirs, lift):
    policy = _policy(tiny_dirs, lift, "pi0", lora_rank=4)
    _, obs, _ = lift
    lora = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    assert lora and frozen
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # the LoRA B matrices start at 0: the A matrices move from the second step on
        t = torch.full((2,), 0.5)
        loss = policy.flow_matching_loss(obs, torch.zeros(2, 5, 6), t, torch.randn(2, 5, 6))
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = dict(policy.named_parameters())
    still = sorted(n for n in lora if torch.equal(lora[n], params[n]))
    # only the VLM's last layer's query / output projections get no gradient: the expert reads that layer's K / V
    last = policy.model.paligemma_with_expert.paligemma.config.text_config.num_hidden_layers - 1
    assert still and all(f"language_model.layers.{last}.self_attn." in n and ("q_proj" in n or "o_proj" in n)
                         for n in still), still
    assert len(still) < len(lora) // 4
    assert all(torch.equal(frozen[n], params[n]) for n in frozen)


def _sft_run(pretrained, tmp_path):
    """vla-sft on a LeRobotDataset from `rlrobot collect` (state + cameras, joint positions): the flow-matching loss
    falls and our dataset's statistics become the state normalisation."""
    demos = tmp_path / "demos"
    main(["collect", "--task", "so101-lift", "--episodes", "2", "--out", str(demos), "--num-envs", "2",
          "--obs-mode", "state+rgb", "--control-mode", "joint_pos"])
    sft = tmp_path / "sft"
    main(["train", "--algo", "vla-sft", "--task", "so101-lift", "--obs-mode", "state+rgb", "--control-mode", "joint_pos",
          "--vla.path", str(pretrained), "--dataset", str(demos), "--out", str(sft), "--num-envs", "2",
          "--sft.num-updates", "20", "--sft.updates-per-iteration", "10", "--sft.batch-size", "8", "--sft.warmup-updates",
          "2", "--sft.lr", "1e-3", "--logger", "none", "--no-video", "--eval-episodes", "2", "--eval-envs", "2",
          "--max-episode-steps", "10", "--eval-every", "0", "--num-threads", "1"])
    losses = [json.loads(x)["loss/flow_matching"] for x in (sft / "metrics.jsonl").read_text().splitlines()
              if "loss/flow_matching" in x]
    assert len(losses) == 2 and losses[1] < losses[0]
    weights, _, _ = load_checkpoint(sft)
    assert float(weights["state_std"].sub(1).abs().max()) > 0
    return sft


@pytest.mark.parametrize("variant", VARIANTS)
def test_cli_trains_from_the_pretrained_directory_and_reloads_identical_actions(variant, tiny_dirs, lift, tmp_path):
    """`rlrobot train --algo vla-flow-sde --vla.path DIR`: LeRobot's save_pretrained directory loads by path, the run
    logs ratio-1 first minibatches, its checkpoint rebuilds the fine-tuned VLA with identical deterministic actions and
    a deterministic evaluation."""
    out = tmp_path / "run"
    algo = "vla-flow-noise" if variant == "pi0" else "vla-flow-sde"
    start = ["--vla.path", str(tiny_dirs[variant])]
    if variant == "smolvla":  # SFT from the directory on our demonstrations, then RL from that run
        start = ["--init", str(_sft_run(tiny_dirs["smolvla"], tmp_path))]
    main(["train", "--algo", algo, "--task", "so101-lift", "--obs-mode", "state+rgb", "--control-mode", "joint_pos",
          *start, "--out", str(out), "--num-envs", "2", "--max-episode-steps", "10",
          "--flow-ppo.rollout-chunks", "2", "--flow-ppo.num-minibatches", "2", "--flow-ppo.num-epochs", "1",
          "--flow-ppo.lr", "1e-3", "--flow-ppo.critic-warmup-iterations", "0", "--total-steps", "40",
          "--logger", "none", "--no-video", "--eval-episodes", "2", "--eval-envs", "2",
          "--eval-every", "0", "--num-threads", "1"])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    deviations = [x["loss/first_ratio_max_deviation"] for x in lines if "loss/first_ratio_max_deviation" in x]
    assert len(deviations) == 2 and max(deviations) < 1e-4
    saved = json.loads((out / "config.json").read_text())
    assert saved["policy_kind"] == "vla" and saved["train"]["vla"]["variant"] == variant
    assert saved["train"]["vla"]["path"] == str(tiny_dirs[variant])

    from rlrobot.config import config_from_checkpoint
    from rlrobot.policies.registry import build_policy

    weights, meta, _ = load_checkpoint(out)
    pretrained = load_file(tiny_dirs[variant] / "model.safetensors")  # LeRobot's names: "model.*"
    changed = [n for n, p in pretrained.items() if not torch.equal(p, weights["lerobot." + n])]
    # the VLA itself was fine-tuned, not only our heads: its action expert moved, and its vision encoder too unless
    # the checkpoint's config freezes it (SmolVLA's default: train_expert_only, freeze_vision_encoder)
    assert any("expert" in n for n in changed), changed
    assert any("vision" in n for n in changed) == (variant != "smolvla"), changed
    reloaded = build_policy(meta, config_from_checkpoint(meta))
    reloaded.load_state_dict(weights)
    _, obs, _ = lift
    with torch.no_grad():
        assert torch.equal(reloaded.sample_actions(obs), reloaded.sample_actions(obs))
    # the rebuilt checkpoint acts as the fine-tuned VLA did in the run's final evaluation (`rlrobot eval`'s defaults:
    # the run's seed, episodes and envs)
    summary = json.loads((out / "summary.json").read_text())
    main(["eval", "--checkpoint", str(out), "--no-video", "--out", str(tmp_path / "ev0")])
    again = json.loads((tmp_path / "ev0" / "eval.json").read_text())
    assert (again["episodes"], again["return_mean"], again["success_rate"]) == \
        (2, summary["eval"]["return_mean"], summary["eval"]["success_rate"])
    if variant == "pi0":  # `rlrobot serve`'s policy runtime and `rlrobot eval` rebuild it from the run directory
        from rlrobot.real_robot.policy_runtime import LoadedPolicy

        served = LoadedPolicy(str(out))
        assert served.metadata["policy_kind"] == "vla" and served.metadata["chunk_size"] == 5
        chunk = served.infer({k: obs[k][0].numpy() for k in served.obs_keys})
        with torch.no_grad():
            expected = reloaded.sample_actions({k: obs[k][:1] for k in served.obs_keys})[0]
        torch.testing.assert_close(torch.from_numpy(chunk), expected, rtol=1e-5, atol=1e-5)
        results = []
        for _ in range(2):
            main(["eval", "--checkpoint", str(out), "--episodes", "2", "--num-envs", "2", "--no-video", "--out",
                  str(tmp_path / "ev")])
            results.append(json.loads((tmp_path / "ev" / "eval.json").read_text()))
        assert results[0]["return_mean"] == results[1]["return_mean"] and results[0]["episodes"] == 2


def test_missing_extra_is_named(tiny_dirs, lift, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lerobot", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[vla\]'"):
        _policy(tiny_dirs, lift, "smolvla")



def test_tiny_builder_cli_writes_a_checkpoint_with_the_tasks_features(tmp_path, capsys):
    """python -m rlrobot.policies.vla.tiny: a LeRobot directory whose features are so101-reach's state, both cameras
    and the joint_pos action, which our loader accepts for that task."""
    from rlrobot.policies.vla.config import check_features, read_pretrained_config
    from rlrobot.policies.vla.tiny import main as tiny_main

    tiny_main(["--variant", "pi0", "--task", "so101-reach", "--out", str(tmp_path / "pi0"), "--chunk-size", "4"])
    assert "parameters" in capsys.readouterr().out
    cfg = read_pretrained_config(str(tmp_path / "pi0"))
    env = make("so101-reach", 1, obs_mode="state+rgb", control_mode="joint_pos")
    space = {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()}
    env.close()
    assert cfg["type"] == "pi0" and cfg["chunk_size"] == 4
    assert cfg["input_features"]["observation.state"]["shape"] == space["state"]
    assert {"observation.images.front", "observation.images.wrist"} <= set(cfg["input_features"])
    check_features(cfg, space, 6)  # raises on a mismatch


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_deep_copy_acts_on_its_own(variant, tiny_dirs, lift):
    """An overlapped run's actor and NFT's reference are deep copies: the copy's expert features reach the copy (not
    the original), so it samples the original's chunks and its chain log-probs."""
    import copy

    policy = _policy(tiny_dirs, lift, variant)
    _, obs, _ = lift
    twin = copy.deepcopy(policy)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    with torch.no_grad():
        assert torch.equal(policy.sample_actions(obs), twin.sample_actions(obs))
        chain, _ = twin.sample_chain(obs, "noise", generator=g1)
        again, _ = policy.sample_chain(obs, "noise", generator=g2)
    torch.testing.assert_close(chain, again, rtol=0, atol=0)
    assert not policy._features and not twin._features
