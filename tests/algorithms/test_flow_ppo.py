"""Flow-Noise / Flow-SDE PPO: the rollout's log-probs are reproduced exactly (ratio 1 before any step), the update
moves the policy, the hybrid SDE logs one step per sample, and bad settings are refused."""

import dataclasses

import pytest
import torch

from rlrobot.config import TrainConfig, train_config
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.runners.flow_on_policy import FlowOnPolicyRunner

SMALL_FLOW = FlowPolicyConfig(chunk_size=5, denoising_steps=3, state_hidden=(32, 32), embed_dim=32, time_embed_dim=16,
                              velocity_hidden=(64, 64), noise_hidden=(16,), value_hidden=(32,))


def small_config(tmp_path, algo: str, **flow_ppo) -> TrainConfig:
    cfg = train_config(algo, task="so101-reach", num_envs=4, total_steps=4 * 2 * 5, out=str(tmp_path / algo),
                       logger="none", video=False, eval_episodes=2, eval_envs=2, flow=dataclasses.replace(SMALL_FLOW),
                       num_threads=1, init="none")
    cfg.flow_ppo.rollout_chunks = 2
    cfg.flow_ppo.num_minibatches = 2
    for k, v in flow_ppo.items():
        setattr(cfg.flow_ppo, k, v)
    return cfg


@pytest.mark.parametrize("algo, sde_mode, ratio_level", [("flow-noise", "hybrid", "chunk"), ("flow-sde", "hybrid", "chunk"),
                                                         ("flow-sde", "full", "element"), ("flow-noise", "full", "element")])
def test_first_minibatch_ratio_is_one_and_update_moves_the_policy(tmp_path, algo, sde_mode, ratio_level):
    runner = FlowOnPolicyRunner(small_config(tmp_path, algo, sde_mode=sde_mode, ratio_level=ratio_level))
    runner.obs, _ = runner.env.reset(seed=0)
    runner._rollout()
    storage = runner.algo.storage
    expected_steps = 1 if (algo == "flow-sde" and sde_mode == "hybrid") else SMALL_FLOW.denoising_steps
    assert storage.steps.shape[-1] == expected_steps
    assert storage.log_probs.shape[-1] == 5 * 5  # executed actions x action dims (ee_delta: 5)
    # recompute the stored log-probs with the unchanged policy, in minibatch order
    mb = next(storage.minibatches(2, 1, shuffle=False))
    with torch.no_grad():
        log_probs, _, value = runner.algo.evaluate_chain(mb["obs"], mb["chains"], mb["steps"])
    assert torch.allclose(log_probs, mb["log_probs"], atol=1e-4, rtol=1e-5)
    assert torch.allclose(value, mb["values"], atol=1e-5)
    before = [p.detach().clone() for p in runner.policy.parameters()]
    stats = runner.algo.update(torch.Generator().manual_seed(0))
    assert stats["first_ratio_max_deviation"] < 1e-3  # chunk ratios multiply 25 element ratios: float32 noise only
    assert any(not torch.equal(a, b) for a, b in zip(before, runner.policy.parameters(), strict=True))
    runner.env.close()


@pytest.mark.parametrize("algo", ["flow-noise", "flow-sde"])
def test_joint_log_prob_is_rlinfs_mean_over_the_initial_noise_and_the_k_steps(tmp_path, algo):
    # RLinf's joint_logprob: per element, the mean of K + 1 terms (log N(x_K; 0, I) and the K transitions), so the PPO
    # log-ratio of a chain is the K steps' log-ratio sum / (K + 1)
    from rlrobot.policies.flow import gaussian_log_prob

    k = SMALL_FLOW.denoising_steps
    runner = FlowOnPolicyRunner(small_config(tmp_path, algo, sde_mode="full"))
    obs, _ = runner.env.reset(seed=0)
    algo_, policy, e = runner.algo, runner.policy, runner.algo.executed_dim
    with torch.no_grad():
        _, chain, steps, log_probs, _ = algo_.act(obs, torch.Generator().manual_seed(0))
        old_steps, _, _ = policy.chain_log_prob(obs, chain, steps, algo_.mode, algo_.cfg.noise_level)
        initial = gaussian_log_prob(chain[:, 0, :e], torch.zeros_like(chain[:, 0, :e]), torch.ones_like(chain[:, 0, :e]))
        assert torch.allclose(log_probs, (initial + old_steps[:, :, :e].sum(1)) / (k + 1), atol=1e-5)
        for p in policy.flow_matching_parameters():
            p.add_(0.01 * torch.randn_like(p))
        new_log_probs, _, _ = algo_.evaluate_chain(obs, chain, steps)
        new_steps, _, _ = policy.chain_log_prob(obs, chain, steps, algo_.mode, algo_.cfg.noise_level)
    step_ratio = (new_steps - old_steps)[:, :, :e].sum(1)
    assert step_ratio.abs().max() > 1e-3
    assert torch.allclose(new_log_probs - log_probs, step_ratio / (k + 1), atol=1e-5)
    runner.env.close()


def test_hybrid_sde_step_is_the_only_stochastic_one(tmp_path):
    runner = FlowOnPolicyRunner(small_config(tmp_path, "flow-sde", sde_mode="hybrid"))
    obs, _ = runner.env.reset(seed=0)
    with torch.no_grad():
        _, chain, steps, _, _ = runner.algo.act(obs, torch.Generator().manual_seed(0))
        # re-running the ODE from each stored state reproduces every step except the stochastic one
        emb = runner.policy.encode(obs)
        for k in range(SMALL_FLOW.denoising_steps):
            ks = torch.full((len(chain),), k, dtype=torch.long)
            mean, _, _ = runner.policy.step_distribution(chain[:, k], ks, emb, "ode")
            same = torch.isclose(mean, chain[:, k + 1], atol=1e-5).all(-1)
            assert torch.equal(same, steps[:, 0] != k)
    runner.env.close()


def test_critic_warmup_leaves_the_actor_alone(tmp_path):
    runner = FlowOnPolicyRunner(small_config(tmp_path, "flow-noise", critic_warmup_iterations=1))
    runner.obs, _ = runner.env.reset(seed=0)
    runner._rollout()
    velocity_before = runner.policy.velocity_out.weight.detach().clone()
    value_before = runner.policy.value_head[0].weight.detach().clone()
    runner.algo.update()
    assert torch.equal(velocity_before, runner.policy.velocity_out.weight)
    assert not torch.equal(value_before, runner.policy.value_head[0].weight)
    runner.env.close()


def test_freeze_encoder_updates_the_action_expert_and_value_head_only(tmp_path):
    runner = FlowOnPolicyRunner(small_config(tmp_path, "flow-noise", freeze_encoder=True))
    runner.obs, _ = runner.env.reset(seed=0)
    runner._rollout()
    encoder = {id(p) for p in runner.policy.encoder_parameters()}
    assert encoder and encoder <= {id(p) for p in runner.policy.parameters()}
    before = {name: p.detach().clone() for name, p in runner.policy.named_parameters()}
    runner.algo.update()
    for name, p in runner.policy.named_parameters():
        assert torch.equal(before[name], p) == (id(p) in encoder), name
    runner.env.close()


def test_bad_flow_settings(tmp_path):
    cfg = small_config(tmp_path, "flow-noise", sde_mode="sometimes")
    with pytest.raises(ValueError, match="sde_mode"):
        cfg.validate()
    cfg = small_config(tmp_path, "flow-noise")
    cfg.flow = FlowPolicyConfig(denoising_steps=0)
    with pytest.raises(ValueError, match="denoising_steps"):
        cfg.validate()
    cfg = small_config(tmp_path, "flow-noise")
    cfg.flow = FlowPolicyConfig(chunk_size=60)  # so101-reach episodes are 50 steps
    with pytest.raises(ValueError, match="chunk_size=60 is larger than the episode"):
        cfg.validate()
    cfg = small_config(tmp_path, "flow-noise")
    cfg.flow.execute_steps = 9
    with pytest.raises(ValueError, match="execute_steps"):
        cfg.validate()
    cfg = small_config(tmp_path, "flow-sde")
    cfg.init = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        cfg.prepare()
    cfg = small_config(tmp_path, "flow-noise")
    cfg.init = ""  # fine-tuning without a checkpoint must be asked for explicitly (--init none)
    with pytest.raises(ValueError, match="--init none"):
        cfg.validate()


@pytest.mark.parametrize("max_kl, steps", [(1e-12, 1), (0.0, 2 * 4)])
def test_kl_early_stop_ends_the_update_once_the_policy_moved_too_far(tmp_path, max_kl, steps):
    runner = FlowOnPolicyRunner(small_config(tmp_path, "flow-noise", max_kl=max_kl, num_epochs=4))
    runner.obs, _ = runner.env.reset(seed=0)
    runner._rollout()
    taken = []
    step = runner.algo.optimizer.step
    runner.algo.optimizer.step = lambda *a, **k: (taken.append(1), step(*a, **k))[1]
    stats = runner.algo.update(torch.Generator().manual_seed(0))
    # the first minibatch steps from the rollout's parameters (KL 0); the next one sees the moved policy and stops
    assert len(taken) == steps and stats["kl_early_stop"] == float(max_kl > 0)
    assert stats["approx_kl_max"] > 0
    runner.env.close()


def test_lr_start_makes_the_first_policy_step_small_and_the_adaptive_rule_climbs_from_it(tmp_path):
    runs = {}
    for lr_start in (0.0, 1e-6):
        runner = FlowOnPolicyRunner(small_config(tmp_path / str(lr_start), "flow-noise", lr_start=lr_start, num_epochs=2))
        runner.obs, _ = runner.env.reset(seed=0)
        runner._rollout()
        lrs = []
        step = runner.algo.optimizer.step
        runner.algo.optimizer.step = lambda *a, _s=step, _r=runner, _l=lrs, **k: (
            _l.append(_r.algo.optimizer.param_groups[0]["lr"]), _s(*a, **k))[1]
        stats = runner.algo.update(torch.Generator().manual_seed(0))
        runs[lr_start] = (lrs, stats["approx_kl_max"])
        runner.env.close()
    (full_lrs, full_kl), (small_lrs, small_kl) = runs[0.0], runs[1e-6]
    assert full_lrs[0] == pytest.approx(1e-4) and small_lrs[0] == pytest.approx(1e-6)
    # the first minibatch steps before any KL is measured; after it, a tiny KL lets the lr grow x1.5 per minibatch
    growth = [b / a for a, b in zip(small_lrs[1:], small_lrs[2:], strict=False)]
    assert small_lrs[1] == small_lrs[0] and growth == pytest.approx([1.5] * len(growth))
    assert small_kl < full_kl / 10  # the policy moved far less in its first update


def _updated_flow_policy(variant: str = "noise", **flow_ppo):
    """Three updates of a small flow policy on a fixed synthetic rollout: (weights, the last update's statistics)."""
    from rlrobot.algorithms.flow_ppo import FlowPPO, FlowPPOConfig
    from rlrobot.bench.flow_rl_bench import fill
    from rlrobot.policies.flow import MLPFlowPolicy

    torch.manual_seed(0)
    policy = MLPFlowPolicy({"state": (6,)}, 2, dataclasses.replace(SMALL_FLOW))
    algo = FlowPPO(policy, FlowPPOConfig(rollout_chunks=4, num_minibatches=2, num_epochs=2, **flow_ppo), variant,
                   torch.device("cpu"), 8, {"state": ((6,), torch.float32)})
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(4, 8, 6, generator=g)
    for _ in range(3):
        fill(algo, obs, g)
        stats = algo.update(g)
    return policy.state_dict(), stats


@pytest.mark.parametrize("variant", ["noise", "sde"])
def test_fused_adam_is_the_same_flow_update_up_to_rounding(variant):
    plain, plain_stats = _updated_flow_policy(variant)
    again, again_stats = _updated_flow_policy(variant)
    fused, fused_stats = _updated_flow_policy(variant, fused_adam=True)
    assert all(torch.equal(plain[k], again[k]) for k in plain) and plain_stats == again_stats
    assert any(not torch.equal(plain[k], fused[k]) for k in plain)  # a different kernel: not the same bits
    assert all(torch.allclose(plain[k], fused[k], atol=1e-5) for k in plain)
    for key in ("policy_loss", "value_loss", "approx_kl", "clip_fraction", "lr"):
        assert fused_stats[key] == pytest.approx(plain_stats[key], rel=1e-3, abs=1e-6), key


@pytest.mark.slow
def test_compiled_flow_update_is_the_same_update_up_to_rounding():
    """--flow-ppo.compile runs the minibatch loss (chain log-probs, value, surrogate) through torch.compile: the same
    parameters and statistics as the eager update, up to float rounding (the compile takes 20-60 s on the CPU). With a
    fixed lr: the adaptive schedule multiplies the lr by 1.5 per minibatch here, which amplifies rounding to 1e-3."""
    plain, plain_stats = _updated_flow_policy(lr_schedule="fixed")
    compiled, compiled_stats = _updated_flow_policy(compile=True, lr_schedule="fixed")
    torch.manual_seed(0)
    from rlrobot.policies.flow import MLPFlowPolicy

    start = MLPFlowPolicy({"state": (6,)}, 2, dataclasses.replace(SMALL_FLOW)).state_dict()
    assert max((plain[k] - start[k]).abs().max().item() for k in plain) > 1e-4  # the updates moved them
    assert all(torch.allclose(plain[k], compiled[k], atol=1e-5) for k in plain)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        assert compiled_stats[key] == pytest.approx(plain_stats[key], rel=1e-3, abs=1e-6), key
