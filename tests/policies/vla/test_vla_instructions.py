"""Per-env instructions for the LeRobot VLAs on the language suite: each env's own instruction (read from its
``instruction_tokens`` observation) is tokenised with the VLA's tokenizer as that text alone would be, carried in the
rollout storage so that the PPO update scores each chunk with the instruction it was sampled under, and taken from a
serve request's observation; a fixed instruction takes the single-prompt path, whose chunks the per-env path equals bit for bit.

These need the ``vla`` extra (Python >= 3.12, lerobot 0.6.1): ``.ci/run`` runs them in ``.venv-vla``.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12; .ci/run runs these in .venv-vla)")

from rlrobot.algorithms.flow_ppo import FlowPPO, FlowPPOConfig  # noqa: E402
from rlrobot.envs.language import TOKENS_KEY  # noqa: E402
from rlrobot.policies.vla.config import VLAConfig, resolve  # noqa: E402
from rlrobot.policies.vla.load import build_vla  # noqa: E402
from rlrobot.policies.vla.tiny import build_tiny  # noqa: E402
from rlrobot.tasks.registry import make  # noqa: E402
from rlrobot.tasks.so101_suite import all_instructions  # noqa: E402

VARIANTS = ("pi0", "pi05", "smolvla")
TASK = dict(obs_mode="state+rgb", control_mode="joint_pos")
CAMERAS = ("state", "image_front", "image_wrist")
NUM_ENVS = 4


@pytest.fixture(scope="module")
def suite():
    env = make("so101-suite", NUM_ENVS, **TASK)
    obs, _ = env.reset(seed=0)
    texts = list(env.instruction)
    meta = {"observation_space": {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()},
            "action_dim": int(env.single_action_space.shape[0])}
    env.close()
    assert len(set(texts)) >= 2, texts  # the seed draws different tasks for the envs
    return meta, obs, texts


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, suite):
    meta, _, _ = suite
    root = tmp_path_factory.mktemp("vla")
    return {v: build_tiny(v, root / v, meta["observation_space"], meta["action_dim"], all_instructions(), chunk_size=5,
                          denoising_steps=3, seed=1) for v in VARIANTS}


def _policy(tiny_dirs, suite, variant: str, instruction: str = ""):
    meta, _, _ = suite
    keys = CAMERAS if instruction else (*CAMERAS, TOKENS_KEY)
    torch.manual_seed(0)
    return build_vla(meta, VLAConfig(path=str(tiny_dirs[variant]), instruction=instruction, obs_keys=keys))


def _row(obs, i: int) -> dict[str, torch.Tensor]:
    return {k: v[i:i + 1] for k, v in obs.items()}


def test_resolve_reads_each_envs_instruction_on_the_suite_and_keeps_a_fixed_one_elsewhere(tiny_dirs):
    run = SimpleNamespace(task="so101-suite", vla=VLAConfig(path=str(tiny_dirs["smolvla"])))
    resolve(run)
    assert run.vla.instruction == "" and TOKENS_KEY in run.vla.obs_keys
    given = SimpleNamespace(task="so101-suite", vla=VLAConfig(path=str(tiny_dirs["smolvla"]), instruction=all_instructions()[0]))
    resolve(given)
    assert TOKENS_KEY not in given.vla.obs_keys
    lift = SimpleNamespace(task="so101-lift", vla=VLAConfig(path=str(tiny_dirs["smolvla"])))
    resolve(lift)
    assert lift.vla.instruction and TOKENS_KEY not in lift.vla.obs_keys


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_env_is_prompted_with_its_own_instruction_tokenised_alone(variant, tiny_dirs, suite):
    """The batch's texts are the envs' instructions; each row's tokens / prompt equal that text tokenised alone (pi0 /
    SmolVLA: LeRobot's task + newline; pi0.5: its state prompt), and two different instructions give different ids."""
    policy = _policy(tiny_dirs, suite, variant)
    _, obs, texts = suite
    batch = policy.lerobot_batch(obs)
    assert batch["task"] == texts
    if variant == "pi05":
        seen: list[list[str]] = []
        tokens_fn = policy.tokens
        policy.tokens = lambda prompts, *a, **kw: (seen.append(list(prompts)), tokens_fn(prompts, *a, **kw))[1]
        with torch.no_grad():
            policy.encode(obs)
        assert [p.split(", State: ")[0] for p in seen[0]] == [f"Task: {t}" for t in texts]
        return
    tokens, masks = policy._instruction_tokens(batch, NUM_ENVS)
    suffix, max_length, padding = policy._language
    for i, text in enumerate(texts):
        alone, alone_mask = policy.tokens([text + suffix], max_length, torch.device("cpu"), padding)
        n = int(alone_mask.sum())
        assert torch.equal(tokens[i, :n], alone[0, :n]) and bool(masks[i, :n].all()) and not bool(masks[i, n:].any())
    a, b = texts.index(texts[0]), next(i for i, t in enumerate(texts) if t != texts[0])
    assert not torch.equal(tokens[a][masks[a]], tokens[b][masks[b]])


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_envs_chunk_equals_the_chunk_of_a_policy_given_that_instruction(variant, tiny_dirs, suite):
    """Per-env prompting on a mixed batch: row i's deterministic chunk equals a fixed-instruction policy's (the old
    path, one instruction for the run) on row i, for row i's instruction (the padding to the batch's longest text may
    change float rounding only); a wrong instruction gives another chunk."""
    policy = _policy(tiny_dirs, suite, variant)
    _, obs, texts = suite
    noise = torch.randn(NUM_ENVS, policy.flat_dim, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, _ = policy.sample_chain(obs, "ode", x_init=noise)
        for i, text in enumerate(texts):
            fixed = _policy(tiny_dirs, suite, variant, instruction=text)
            theirs, _ = fixed.sample_chain({k: v[i:i + 1] for k, v in obs.items() if k in CAMERAS}, "ode",
                                           x_init=noise[i:i + 1])
            torch.testing.assert_close(ours[i:i + 1, -1], theirs[:, -1], atol=1e-5, rtol=1e-5)
            other = next(t for t in texts if t != text)
            wrong = _policy(tiny_dirs, suite, variant, instruction=other)
            theirs_wrong, _ = wrong.sample_chain({k: v[i:i + 1] for k, v in obs.items() if k in CAMERAS}, "ode",
                                                 x_init=noise[i:i + 1])
            assert (ours[i, -1] - theirs_wrong[0, -1]).abs().max() > 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_fixed_instruction_gives_bit_identical_chunks_per_env_or_fixed(variant, tiny_dirs, suite):
    """All envs on one task: the per-env path (instruction_tokens) and the fixed-instruction path give the same chunks
    bit for bit (single-task runs are unchanged)."""
    _, _, texts = suite
    env = make("so101-suite", 2, instruction=texts[0], **TASK)
    obs, _ = env.reset(seed=1)
    assert list(env.instruction) == [texts[0]] * 2
    env.close()
    per_env, fixed = _policy(tiny_dirs, suite, variant), _policy(tiny_dirs, suite, variant, instruction=texts[0])
    cameras = {k: obs[k] for k in CAMERAS}
    with torch.no_grad():
        assert torch.equal(per_env.sample_actions(obs), fixed.sample_actions(cameras))
        a = per_env.sample_chain(obs, "noise", generator=torch.Generator().manual_seed(5))
        b = fixed.sample_chain(cameras, "noise", generator=torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("variant", ("pi05", "smolvla"))
def test_the_update_scores_each_chunk_with_the_instruction_it_was_sampled_under(variant, tiny_dirs, suite):
    """A Flow-Noise PPO rollout on the suite stores each env's instruction tokens with its chunk; the stored chunks'
    recomputed log-probs (weights unchanged) equal the rollout's, and with the instructions swapped between envs they
    do not; the first minibatch's ratios are 1."""
    policy = _policy(tiny_dirs, suite, variant)
    env = make("so101-suite", NUM_ENVS, **TASK)
    obs, _ = env.reset(seed=0)
    keys = policy.obs_keys
    specs = {k: (tuple(env.single_observation_space[k].shape), obs[k].dtype) for k in keys}
    learner = FlowPPO(policy, FlowPPOConfig(rollout_chunks=2, num_epochs=1, num_minibatches=2, lr=1e-3), "noise",
                      torch.device("cpu"), NUM_ENVS, specs)
    g = torch.Generator().manual_seed(0)
    sampled_under = []
    with torch.inference_mode():
        for _ in range(2):
            sampled_under.append(list(env.instruction))
            actions, fields, value = learner.rollout_act(obs, g)
            chunk_obs = {k: obs[k] for k in keys}
            reward = torch.zeros(NUM_ENVS)
            for j in range(policy.execute_steps):
                obs, r, _, _, _ = env.step(actions[:, j].clamp(-1, 1))
                reward += r
            learner.storage.add(chunk_obs, **fields, values=value, rewards=reward, dones=torch.zeros(NUM_ENVS))
        learner.storage.compute_returns(policy.value(obs), 0.99, 0.95)
    env.close()
    storage = learner.storage
    assert [policy.instruction_texts({TOKENS_KEY: storage.obs[TOKENS_KEY][s]}) for s in range(2)] == sampled_under
    stored = {k: v[0] for k, v in storage.obs.items()}
    chains, steps = storage.data["chains"][0], storage.data["steps"][0]
    with torch.no_grad():
        lp, _, _ = learner.evaluate_chain(stored, chains, steps)
        swapped, _, _ = learner.evaluate_chain({**stored, TOKENS_KEY: stored[TOKENS_KEY].roll(1, 0)}, chains, steps)
    torch.testing.assert_close(lp, storage.data["log_probs"][0], atol=1e-4, rtol=1e-4)
    differs = [i for i in range(NUM_ENVS) if sampled_under[0][i] != sampled_under[0][(i - 1) % NUM_ENVS]]
    assert differs and (lp[differs] - swapped[differs]).abs().max() > 1e-4
    stats = learner.update(g)
    assert stats["first_ratio_max_deviation"] < 1e-4, stats


def test_a_suite_run_serves_each_requests_instruction(tiny_dirs, suite, tmp_path):
    """`rlrobot train --algo vla-flow-noise --task so101-suite --vla.path DIR`: the run reads each env's instruction
    (ratio-1 first minibatches); `rlrobot serve`'s runtime takes the instruction from the request's instruction_tokens
    (what the profile bridge encodes from the operator's words): its chunk equals the run's weights given that
    instruction as a fixed one, and another instruction gives another chunk."""
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.cli import main
    from rlrobot.config import config_from_checkpoint
    from rlrobot.policies.registry import build_policy
    from rlrobot.real_robot.policy_runtime import LoadedPolicy
    from rlrobot.tasks.so101_suite import SO101Suite

    out = tmp_path / "run"
    main(["train", "--algo", "vla-flow-noise", "--task", "so101-suite", "--obs-mode", "state+rgb", "--control-mode",
          "joint_pos", "--vla.path", str(tiny_dirs["smolvla"]), "--out", str(out), "--num-envs", "2",
          "--max-episode-steps", "10", "--flow-ppo.rollout-chunks", "2", "--flow-ppo.num-minibatches", "2",
          "--flow-ppo.num-epochs", "1", "--flow-ppo.lr", "1e-3", "--flow-ppo.critic-warmup-iterations", "0",
          "--total-steps", "20", "--logger", "none", "--no-video", "--eval-episodes", "2", "--eval-envs", "2",
          "--eval-every", "0", "--num-threads", "1"])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(x["loss/first_ratio_max_deviation"] for x in lines if "loss/first_ratio_max_deviation" in x) < 1e-4
    served = LoadedPolicy(str(out))
    assert TOKENS_KEY in served.obs_keys
    _, obs, texts = suite
    other = next(t for t in texts if t != texts[0])
    weights, meta, _ = load_checkpoint(out)
    chunks = []
    for text in (texts[0], other):
        request = {k: obs[k][0].numpy() for k in served.obs_keys if k != TOKENS_KEY}
        request[TOKENS_KEY] = SO101Suite.instruction_observation([text])[TOKENS_KEY][0]
        chunks.append(served.infer(request))
        cfg = config_from_checkpoint(meta)
        cfg.vla.instruction, cfg.vla.obs_keys = text, CAMERAS
        fixed = build_policy(meta, cfg)
        fixed.load_state_dict(weights)
        with torch.no_grad():
            expected = fixed.sample_actions({k: obs[k][:1] for k in CAMERAS})[0]
        torch.testing.assert_close(torch.from_numpy(chunks[-1]), expected, rtol=1e-5, atol=1e-5)
    assert abs(chunks[0] - chunks[1]).max() > 1e-4
