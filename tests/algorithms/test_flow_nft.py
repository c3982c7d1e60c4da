"""Flow-NFT: the objective's two limits (r = 1, beta = 1 is flow matching; r = 1/2 cancels), the sign of its update,
the reference policy's soft update, a rollout + update through the runner, and bad settings."""

import copy
import dataclasses

import pytest
import torch

from rlrobot.algorithms.flow_nft import FlowNFT, FlowNFTConfig, nft_loss, optimality
from rlrobot.config import train_config
from rlrobot.policies.flow import FlowPolicyConfig, MLPFlowPolicy
from rlrobot.runners.flow_on_policy import FlowNFTRunner

SMALL_FLOW = FlowPolicyConfig(chunk_size=4, denoising_steps=3, state_hidden=(32, 32), embed_dim=32, time_embed_dim=16,
                              velocity_hidden=(64, 64), noise_hidden=(16,), value_hidden=(32,))


def small_policy(seed: int = 0) -> MLPFlowPolicy:
    torch.manual_seed(seed)
    return MLPFlowPolicy({"state": (6,)}, 2, dataclasses.replace(SMALL_FLOW))


def batch(seed: int = 1, n: int = 16):
    g = torch.Generator().manual_seed(seed)
    obs = {"state": torch.randn(n, 6, generator=g)}
    chunks = torch.randn(n, 4, 2, generator=g).clamp(-1, 1)
    t = torch.rand(n, generator=g) * 0.98 + 0.01
    noise = torch.randn(n, 4, 2, generator=g)
    return obs, chunks, t, noise


def velocities(policy, reference, obs, chunks, t, noise):
    a, eps = chunks.reshape(len(chunks), -1), noise.reshape(len(noise), -1)
    x_t = t[:, None] * eps + (1 - t[:, None]) * a
    v_theta, _ = policy.velocity(x_t, t, policy.encode(obs))
    with torch.no_grad():
        v_old, _ = reference.velocity(x_t, t, reference.encode(obs))
    return v_theta, v_old, eps - a


def grads(policy, loss):
    policy.zero_grad()
    loss.backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in policy.parameters()]


def test_r_one_and_beta_one_is_plain_flow_matching_toward_the_sampled_chunks():
    policy, reference = small_policy(0), small_policy(1)  # beta = 1: v+ = v_theta whatever the reference is
    obs, chunks, t, noise = batch()
    v_theta, v_old, target = velocities(policy, reference, obs, chunks, t, noise)
    nft = nft_loss(v_theta, v_old, target, torch.ones(len(t)), beta=1.0, times=t, weighting="none").mean()
    g_nft = grads(policy, nft)
    g_fm = grads(policy, policy.flow_matching_loss(obs, chunks, t, noise))
    for a, b in zip(g_nft, g_fm, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in g_fm)


@pytest.mark.parametrize("weighting", ["none", "adaptive"])
@pytest.mark.parametrize("beta", [0.3, 1.0])
def test_r_one_half_cancels_while_the_policy_equals_the_reference(weighting, beta):
    policy = small_policy(0)
    reference = copy.deepcopy(policy)
    obs, chunks, t, noise = batch()
    v_theta, v_old, target = velocities(policy, reference, obs, chunks, t, noise)
    loss = nft_loss(v_theta, v_old, target, torch.full((len(t),), 0.5), beta=beta, times=t, weighting=weighting).mean()
    for g in grads(policy, loss):
        assert g.abs().max() < 1e-6
    # away from the reference the r = 1/2 gradient is 2 beta^2 (v_theta - v_old) per element: it pulls back to v_old
    with torch.no_grad():
        policy.velocity_out.bias.add_(0.1)
    v_theta, v_old, target = velocities(policy, reference, obs, chunks, t, noise)
    v_theta.retain_grad()
    nft_loss(v_theta, v_old, target, torch.full((len(t),), 0.5), beta=beta, times=t, weighting="none").sum().backward()
    expected = 2 * beta ** 2 * (v_theta - v_old).detach() / v_theta.shape[1] / beta
    assert torch.allclose(v_theta.grad, expected, atol=1e-6)


def test_optimality_maps_advantages_into_zero_one():
    r = optimality(torch.tensor([-10.0, -2.0, -1.0, 0.0, 1.0, 2.0, 10.0]), adv_clip=2.0)
    assert torch.allclose(r, torch.tensor([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]))


def test_nft_on_its_own_samples_raises_a_bandits_reward():
    """The whole loop on a bandit: sample chunks from the policy, score them, group-normalise, NFT steps, refresh the
    reference. The mean reward must rise well above the pretrained policy's (it starts around N(0, 0.5^2) chunks)."""
    from rlrobot.algorithms.flow_nft import group_advantages

    torch.manual_seed(0)
    policy = MLPFlowPolicy({"state": (3,)}, 2, dataclasses.replace(SMALL_FLOW, chunk_size=2))
    g = torch.Generator().manual_seed(0)
    obs = {"state": torch.zeros(128, 3)}
    optimizer = torch.optim.Adam(policy.parameters(), 1e-3)
    for _ in range(150):  # "SFT": chunks ~ N(0, 0.5^2)
        chunks = torch.randn(128, 2, 2, generator=g) * 0.5
        loss = policy.flow_matching_loss(obs, chunks, torch.rand(128, generator=g), torch.randn(128, 2, 2, generator=g))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    target = torch.tensor([0.6, -0.4, 0.6, -0.4])
    cfg = FlowNFTConfig(lr=3e-4)
    algo = FlowNFT(policy, cfg, torch.device("cpu"), 128, {"state": ((3,), torch.float32)})
    rewards = []
    for _ in range(15):
        _, fields, _ = algo.rollout_act(obs, g)
        reward = -(fields["chunks"] - target).square().sum(-1)
        rewards.append(reward.mean().item())
        r = optimality(group_advantages(reward, 128), cfg.adv_clip)
        for _ in range(8):
            idx = torch.randperm(128, generator=g)[:64]
            loss, _ = algo.loss({"state": obs["state"][idx]}, fields["chunks"][idx], r[idx], g)
            algo.optimizer.zero_grad()
            loss.backward()
            algo.optimizer.step()
        algo.refresh_reference()
    assert rewards[0] < -1.0 and rewards[-1] > 0.5 * rewards[0] + 0.3, rewards


def test_antithetic_draws_pair_the_noise_and_cut_the_gradient_variance():
    """Antithetic (t, eps), (t, -eps) draws: the same loss in expectation, a lower-variance gradient on a fixed batch
    where the policy equals the reference (the gradient there is (2r - 1)(v_old - u): the eps in u is pure noise)."""
    policy = small_policy(0)
    obs, chunks, _, _ = batch(n=64)
    flat = chunks.reshape(len(chunks), -1)
    r = torch.rand(64, generator=torch.Generator().manual_seed(3))

    def gradient_samples(antithetic: bool) -> torch.Tensor:
        algo = FlowNFT(policy, FlowNFTConfig(times_per_sample=2, antithetic=antithetic), torch.device("cpu"), 64,
                       {"state": ((6,), torch.float32)})
        out = []
        for seed in range(24):
            loss, _ = algo.loss(obs, flat, r, torch.Generator().manual_seed(seed))
            out.append(torch.cat([g.reshape(-1) for g in grads(policy, loss)]))
        return torch.stack(out)

    plain, paired = gradient_samples(False), gradient_samples(True)
    ratio = (paired.var(0).sum() / plain.var(0).sum()).item()
    assert ratio < 0.6, ratio
    cos = torch.nn.functional.cosine_similarity(plain.mean(0), paired.mean(0), dim=0).item()
    assert cos > 0.5, cos  # the same expected gradient (up to 24 draws' noise)


@pytest.mark.parametrize("weighting", ["none", "adaptive"])
def test_paired_baseline_leaves_only_what_distinguishes_the_chunk_from_an_own_sample(weighting, monkeypatch):
    """With the paired baseline, at theta = theta_old the gradient is (2r - 1)(a - a'): zero for any r when the stored
    chunk equals the fresh own sample a', nonzero when they differ (and without the pairing it is not zero)."""
    policy = small_policy(0)
    obs, chunks, _, _ = batch(n=32)
    flat = chunks.reshape(len(chunks), -1)
    r = torch.rand(32, generator=torch.Generator().manual_seed(4))
    cfg = FlowNFTConfig(times_per_sample=2, paired_baseline=True, weighting=weighting)
    algo = FlowNFT(policy, cfg, torch.device("cpu"), 32, {"state": ((6,), torch.float32)})
    fresh = {"chunk": flat}
    monkeypatch.setattr(algo.reference, "sample_chain",
                        lambda obs, mode, emb=None, generator=None: (fresh["chunk"][:, None].repeat(1, 4, 1), None))
    loss, _ = algo.loss(obs, flat, r, torch.Generator().manual_seed(0))
    assert max(g.abs().max().item() for g in grads(policy, loss)) < 1e-6
    fresh["chunk"] = flat.flip(0)  # another chunk than the executed one at each observation
    loss, _ = algo.loss(obs, flat, r, torch.Generator().manual_seed(0))
    assert max(g.abs().max().item() for g in grads(policy, loss)) > 1e-4
    algo.cfg = dataclasses.replace(cfg, paired_baseline=False)
    loss, _ = algo.loss(obs, flat, r, torch.Generator().manual_seed(0))
    assert max(g.abs().max().item() for g in grads(policy, loss)) > 1e-4


def test_reference_soft_update():
    policy = small_policy(0)
    algo = FlowNFT(policy, FlowNFTConfig(ref_ema_ramp=0.25, ref_ema_max=0.5), torch.device("cpu"), 4,
                   {"state": ((6,), torch.float32)})
    old = policy.velocity_out.weight.detach().clone()
    with torch.no_grad():
        policy.velocity_out.weight.add_(1.0)
    algo.iterations = 1  # eta = min(0.25 * 1, 0.5) = 0.25: the reference moves 75 % of the way
    algo.refresh_reference()
    assert torch.allclose(algo.reference.velocity_out.weight, old + 0.75, atol=1e-6)
    algo.iterations = 10  # eta capped at 0.5
    assert algo.ref_ema() == 0.5


def test_rollouts_sample_with_the_reference_policy_once_it_lags():
    policy = small_policy(0)
    algo = FlowNFT(policy, FlowNFTConfig(ref_ema_ramp=0.5, ref_ema_max=0.5), torch.device("cpu"), 4,
                   {"state": ((6,), torch.float32)})
    with torch.no_grad():
        policy.velocity_out.weight.add_(0.5)  # the current policy moved; the reference (v_old) did not
    obs = {"state": torch.randn(4, 6, generator=torch.Generator().manual_seed(2))}
    actions, fields, value = algo.rollout_act(obs, torch.Generator().manual_seed(3))
    expected, _ = algo.reference.sample_chain(obs, "ode", generator=torch.Generator().manual_seed(3))
    current, _ = policy.sample_chain(obs, "ode", generator=torch.Generator().manual_seed(3))
    assert torch.equal(fields["chunks"], expected[:, -1])
    assert not torch.allclose(fields["chunks"], current[:, -1])
    assert torch.equal(value, policy.value(obs))  # the value head being trained scores the state


def test_rollout_and_update_through_the_runner(tmp_path):
    cfg = train_config("flow-nft", task="so101-reach", num_envs=4, total_steps=4 * 2 * 4, out=str(tmp_path / "nft"),
                       logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1, init="none",
                       flow=dataclasses.replace(SMALL_FLOW, chunk_size=4))
    cfg.flow_nft.rollout_chunks, cfg.flow_nft.num_minibatches, cfg.flow_nft.anchor_coef = 2, 2, 0.1
    cfg.validate()
    runner = FlowNFTRunner(cfg)
    runner.obs, _ = runner.env.reset(seed=0)
    runner._rollout()
    assert runner.algo.storage.chunks.shape == (2, 4, 4 * 5)  # [chunks, envs, H * A] (ee_delta: 5 action dims)
    before = runner.policy.velocity_out.weight.detach().clone()
    stats = runner.algo.update(torch.Generator().manual_seed(0))
    assert {"nft_loss", "anchor_drift", "value_loss", "r_mean"} <= stats.keys()
    assert not torch.equal(before, runner.policy.velocity_out.weight)
    # eta = 0: after the update the reference is the updated policy
    assert torch.equal(runner.algo.reference.velocity_out.weight, runner.policy.velocity_out.weight)
    runner.env.close()


@pytest.mark.parametrize("field, value, match", [("beta", 0.0, "beta"), ("sampler", "sde", "sampler"),
                                                 ("weighting", "x0", "weighting"), ("ref_ema_max", 1.0, "ref_ema_max"),
                                                 ("num_minibatches", 3, "divisible"), ("times_per_sample", 3, "even")])
def test_bad_settings_are_refused(field, value, match):
    cfg = train_config("flow-nft", task="so101-reach", num_envs=4, init="none")
    setattr(cfg.flow_nft, field, value)
    cfg.flow_nft.antithetic = field == "times_per_sample"
    with pytest.raises(ValueError, match=match):
        cfg.validate()


def test_execute_curriculum_advances_only_when_its_rule_holds():
    from rlrobot.curricula.execute_length import ExecuteCurriculum, PolicyTrimConfig

    c = ExecuteCurriculum(PolicyTrimConfig(curriculum=True, step=2, window=4, tolerance=0.1, min_iterations=2),
                          execute_steps=1, chunk_size=4)
    c.record([1, 1, 1])
    assert c.end_iteration() is None  # 3 of 4 episodes in the window
    c.record([1])
    assert c.end_iteration() == 3 and c.best == 1.0  # window full, 2 iterations at the stage, success 1.0 >= best - 0.1
    assert c.windowed_success is None  # the new stage is judged on its own episodes
    c.record([1, 0, 1, 1])
    assert c.end_iteration() is None  # only one iteration at this stage
    assert c.end_iteration() is None  # 0.75 < best 1.0 - 0.1: success did not hold
    c.record([1, 1])  # window now [1, 1, 1, 1]
    assert c.end_iteration() == 4  # capped at the chunk size
    c.record([1, 1, 1, 1])
    c.end_iteration()
    assert c.end_iteration() is None and c.execute_steps == 4  # nothing beyond the chunk
    restored = ExecuteCurriculum(c.cfg, 1, 4)
    restored.load_state_dict(c.state_dict())
    assert restored.state_dict() == c.state_dict()


def test_curriculum_in_a_run_keeps_the_env_step_budget_and_saves_the_execute_length(tmp_path):
    from rlrobot.checkpoints import load_config
    from rlrobot.runners.base import make_runner

    cfg = train_config("flow-nft", task="so101-reach", num_envs=4, total_steps=4 * 2 * 6, out=str(tmp_path / "trim"),
                       logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1, init="none",
                       max_episode_steps=4, flow=dataclasses.replace(SMALL_FLOW, chunk_size=4, execute_steps=2))
    cfg.flow_nft.rollout_chunks, cfg.flow_nft.num_minibatches = 2, 2
    cfg.trim.curriculum, cfg.trim.window, cfg.trim.min_iterations, cfg.trim.tolerance = True, 4, 1, 0.99
    cfg.validate()
    runner = make_runner(cfg)
    summary = runner.learn()
    assert runner.policy.execute_steps == 4  # 2 -> 3 -> 4: every stage held (tolerance 0.99)
    assert runner.env_steps <= cfg.total_steps and runner.env_steps >= cfg.total_steps - 4 * 2 * 4
    assert load_config(summary["checkpoint"])["train"]["flow"]["execute_steps"] == 4
    assert runner.algo.executed_mask.all()
    # a fine-tuning run from this checkpoint adopts its architecture; flow_nft.denoising_steps sets a new K
    follow = train_config("flow-nft", task="so101-reach", num_envs=4, init=summary["checkpoint"])
    follow.flow_nft.denoising_steps = 1
    follow.prepare()
    assert (follow.flow.chunk_size, follow.flow.execute_steps, follow.flow.denoising_steps) == (4, 4, 1)


def test_group_advantages_centre_within_groups_and_scale_by_the_batch_std():
    from rlrobot.algorithms.flow_nft import group_advantages

    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(scores, group_size=4)
    centred = torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert torch.allclose(adv, centred / centred.square().mean().sqrt())
    valid = torch.tensor([True, True, True, False, True, True, True, True])
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.5, 99.0, 2.0, 2.0, 2.0, 2.0]), 4, valid)
    assert adv[3] == 0 and torch.isclose(adv[:3].sum(), torch.tensor(0.0), atol=1e-6)  # the invalid score is ignored


def test_group_mode_shares_start_states_and_scores_whole_episodes(tmp_path):
    cfg = train_config("flow-nft", task="so101-lift", num_envs=4, total_steps=4 * 8, out=str(tmp_path / "group"),
                       logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1, init="none",
                       max_episode_steps=8, flow=dataclasses.replace(SMALL_FLOW, chunk_size=4))
    cfg.flow_nft.optimality, cfg.flow_nft.group_size = "group", 2
    cfg.flow_nft.rollout_chunks, cfg.flow_nft.num_minibatches = 2, 2
    cfg.validate()
    runner = FlowNFTRunner(cfg)
    obs = runner.group_starts()
    cube = obs["state"]  # the state holds the cube's pose: equal inside a group, different across groups
    assert torch.equal(cube[0], cube[1]) and torch.equal(cube[2], cube[3]) and not torch.equal(cube[0], cube[2])
    stats = runner._rollout()
    assert stats["train/episodes_scored"] == 1.0  # every env finished exactly one episode in the rollout
    adv = runner.algo.storage.advantages
    assert adv.shape == (2, 4) and torch.equal(adv[0], adv[1])  # every chunk of an episode shares its outcome
    assert torch.allclose(adv[0].reshape(2, 2).sum(-1), torch.zeros(2), atol=1e-5)  # centred inside each group
    update = runner.algo.update(torch.Generator().manual_seed(0))
    assert "value_loss" not in update and "nft_loss" in update
    runner.env.close()
    bad = train_config("flow-nft", task="so101-lift", num_envs=4, init="none", max_episode_steps=8,
                       flow=dataclasses.replace(SMALL_FLOW, chunk_size=4))
    bad.flow_nft.optimality, bad.flow_nft.group_size, bad.flow_nft.rollout_chunks = "group", 2, 3
    with pytest.raises(ValueError, match="must equal the episode length 8"):
        bad.validate()
    bad.flow_nft.rollout_chunks, bad.flow_nft.group_size = 2, 3
    with pytest.raises(ValueError, match="group_size=3 must be >= 2 and divide num_envs=4"):
        bad.validate()


def test_max_drift_stops_the_gradient_beyond_the_clip():
    v_old = torch.zeros(4, 6)
    v_theta = torch.cat([torch.full((2, 6), 1.0), torch.full((2, 6), 0.05)]).requires_grad_(True)
    target = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    nft_loss(v_theta, v_old, target, torch.ones(4), beta=1.0, times=torch.full((4,), 0.5), weighting="none",
             max_drift=0.1).sum().backward()
    assert torch.all(v_theta.grad[:2] == 0) and torch.all(v_theta.grad[2:] != 0)


def test_mean_flow_policy_nft_with_r_one_and_beta_one_is_its_flow_matching_loss():
    """With the MeanFlow head NFT acts on the induced instantaneous velocity; at r = 1, beta = 1 its gradient is the
    MeanFlow SFT gradient on the same intervals (so fine-tuning and SFT train the same field)."""
    torch.manual_seed(0)
    policy = MLPFlowPolicy({"state": (6,)}, 2, dataclasses.replace(SMALL_FLOW, mean_flow=True, mean_flow_ratio=1.0))
    reference = copy.deepcopy(policy)
    obs, chunks, t, noise = batch()
    a, eps = chunks.reshape(len(chunks), -1), noise.reshape(len(noise), -1)
    x_t = t[:, None] * eps + (1 - t[:, None]) * a
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    r_start = policy.interval_starts(t, g1)
    assert (r_start < t).all()
    v_theta = policy.training_velocity(x_t, t, policy.encode(obs), r_start)
    with torch.no_grad():
        v_old = reference.training_velocity(x_t, t, reference.encode(obs), r_start)
    nft = nft_loss(v_theta, v_old, eps - a, torch.ones(len(t)), beta=1.0, times=t, weighting="none").mean()
    g_nft = grads(policy, nft)
    g_fm = grads(policy, policy.flow_matching_loss(obs, chunks, t, noise, None, g2))
    for x, y in zip(g_nft, g_fm, strict=True):
        assert torch.allclose(x, y, atol=1e-6, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in g_fm)


def test_step_efficiency_scores_reward_fast_success_only_where_the_group_reproduces_it():
    from rlrobot.algorithms.flow_nft import step_efficiency_scores

    success = torch.tensor([1.0, 1.0, 1.0, 0.0])  # group A: both succeed; group B: one of two
    first = torch.tensor([10, 50, 10, 0])
    scores = step_efficiency_scores(success, first, episode_steps=100, group_size=2, step_bonus=0.5, reproducible_rate=0.75)
    assert torch.allclose(scores, torch.tensor([1.45, 1.25, 1.0, 0.0]))  # B's fast success is not reproduced: no bonus
    relaxed = step_efficiency_scores(success, first, 100, 2, 0.5, 0.5)
    assert torch.allclose(relaxed, torch.tensor([1.45, 1.25, 1.45, 0.0]))


def test_success_steps_group_score_runs_through_the_runner(tmp_path):
    """Group mode with the success-steps score on so101-reach (8-step episodes, groups of 2): the scripted expert drives
    envs 0 and 2, a noisy expert env 1, the untrained policy env 3. Each episode scores 1 + 0.5 x (1 - first success
    step / 8) where its group succeeded at the reproducible rate 0.75 (group 0), 1 for group 1's lone success, 0 for a
    failure; the advantages are those scores centred per group over their batch RMS."""
    cfg = train_config("flow-nft", task="so101-reach", num_envs=4, total_steps=4 * 8, out=str(tmp_path / "steps"),
                       logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1, init="none",
                       max_episode_steps=8, flow=dataclasses.replace(SMALL_FLOW, chunk_size=4))
    cfg.flow_nft.optimality, cfg.flow_nft.group_size, cfg.flow_nft.group_score = "group", 2, "success-steps"
    cfg.flow_nft.rollout_chunks, cfg.flow_nft.num_minibatches, cfg.flow_nft.reproducible_rate = 2, 2, 0.75
    cfg.validate()
    runner = FlowNFTRunner(cfg)
    env, step = runner.env, runner.env.step
    noise, successes = torch.Generator().manual_seed(0), []

    def driven_step(action):
        expert = env.expert_action()
        action = action.clone()
        action[[0, 2]] = expert[[0, 2]]
        action[1] = (expert[1] + 0.5 * torch.randn(5, generator=noise)).clamp(-1, 1)
        out = step(action)
        successes.append(out[4]["success"].clone())
        return out

    env.step = driven_step
    stats = runner._rollout()
    assert stats["train/episodes_scored"] == 1.0 and len(successes) == 8  # one whole episode per env
    success = torch.stack(successes)  # [step, env]
    succeeded = success.any(0)
    assert succeeded.tolist() == [True, True, True, False]
    first = torch.where(succeeded, success.float().argmax(0) + 1, torch.zeros(4, dtype=torch.long))
    assert first[0] != first[1]  # the noisy expert reached at another step: group 0's advantages are not 0
    bonus = torch.tensor([1.0, 1.0, 0.0, 0.0])  # group 0: 2 of 2 successes >= 0.75; group 1: 1 of 2
    scores = succeeded.float() * (1.0 + 0.5 * (1.0 - first / 8.0) * bonus)
    assert stats["train/group_score_mean"] == pytest.approx(float(scores.mean()), rel=1e-6)
    centred = scores - scores.reshape(2, 2).mean(1).repeat_interleave(2)
    expected = centred / centred.square().mean().sqrt()
    assert torch.allclose(runner.algo.storage.advantages, expected.expand(2, 4), atol=1e-5)
    runner.env.close()
    cfg.flow_nft.step_bonus = -1.0
    with pytest.raises(ValueError, match="step_bonus must be >= 0"):
        cfg.validate()


def test_evaluation_reports_physical_steps_to_first_success():
    """steps_to_success_mean: the mean, over the successful episodes, of the env step at which each first succeeded,
    recomputed here by stepping the same seeded envs with the same expert."""
    import rlrobot
    from rlrobot.runners.evaluation import evaluate

    env = rlrobot.make("so101-reach", 4, seed=0, num_threads=1)

    class Expert:
        def act(self, obs, deterministic=True):
            return env.expert_action()

    result = evaluate(Expert(), env, episodes=4, seed=0)
    env.close()
    ref = rlrobot.make("so101-reach", 4, seed=0, num_threads=1)
    ref.reset(seed=0)
    first = torch.zeros(4, dtype=torch.long)
    for t in range(1, ref.max_episode_steps + 1):  # one episode per env, 50 steps
        _, _, terminated, truncated, info = ref.step(ref.expert_action())
        first[(first == 0) & info["success"]] = t
    ref.close()
    assert (terminated | truncated).all() and result["episodes"] == 4 and result["length_mean"] == 50
    assert result["success_rate"] == float(info["episode"]["success"].float().mean()) > 0.5
    hits = first[info["episode"]["success"]]
    assert 1 < hits.min() and hits.max() < 50  # the expert reaches before the time-out, not at the first step
    assert result["steps_to_success_mean"] == pytest.approx(float(hits.float().mean()))


def test_fused_adam_is_the_same_nft_update_up_to_rounding():
    from rlrobot.bench.flow_rl_bench import fill

    def updated(**nft):
        policy = small_policy(0)
        algo = FlowNFT(policy, FlowNFTConfig(rollout_chunks=4, num_minibatches=2, num_epochs=2, **nft), torch.device("cpu"),
                       8, {"state": ((6,), torch.float32)})
        g = torch.Generator().manual_seed(1)
        obs = torch.randn(4, 8, 6, generator=g)
        for _ in range(3):
            fill(algo, obs, g)
            stats = algo.update(g)
        return policy.state_dict(), stats

    plain, plain_stats = updated()
    fused, fused_stats = updated(fused_adam=True)
    assert any(not torch.equal(plain[k], fused[k]) for k in plain)
    assert all(torch.allclose(plain[k], fused[k], atol=1e-5) for k in plain)
    for key in ("nft_loss", "value_loss", "drift", "r_mean"):
        assert fused_stats[key] == pytest.approx(plain_stats[key], rel=1e-3, abs=1e-6), key
