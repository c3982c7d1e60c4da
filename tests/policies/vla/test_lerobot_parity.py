"""Parity with LeRobot's own sampler: our adapter's deterministic chunk equals LeRobot 0.6.1's
``predict_action_chunk`` for the same observation, the same language tokens and the same initial noise (all
``max_action_dim`` dims, the padded ones included), for pi0, pi0.5 and SmolVLA, at 2 and 10 denoising steps.

Tiny random checkpoints with LeRobot's real classes (``policies.vla.tiny``), built by the test. They need the ``vla``
extra (Python >= 3.12, lerobot 0.6.1).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12; .ci/run runs these in .venv-vla)")

from rlrobot.policies.vla.config import VLAConfig  # noqa: E402
from rlrobot.policies.vla.load import build_vla  # noqa: E402
from rlrobot.policies.vla.pi05 import state_prompts  # noqa: E402
from rlrobot.policies.vla.tiny import build_tiny  # noqa: E402

VARIANTS = ("pi0", "pi05", "smolvla")
INSTRUCTION = "pick up the red cube"
SPACE = {"state": [6], "image_front": [3, 32, 32]}
CHUNK, ACTION_DIM, BATCH = 4, 6, 2


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    return {v: build_tiny(v, root / v, SPACE, ACTION_DIM, [INSTRUCTION], chunk_size=CHUNK, denoising_steps=10, seed=2)
            for v in VARIANTS}


def _observation() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"state": torch.randn(BATCH, 6, generator=g) * 0.7,
            "image_front": torch.randint(0, 256, (BATCH, 3, 32, 32), generator=g, dtype=torch.uint8)}


def _lerobot_batch(policy, variant: str, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What LeRobot's processors hand the policy: our adapter's feature mapping plus the tokenised instruction."""
    batch = policy.lerobot_batch(obs)
    if variant == "pi05":
        tokens, masks = policy.tokens(state_prompts(INSTRUCTION, batch["observation.state"]),
                                      policy.lerobot.config.tokenizer_max_length, torch.device("cpu"))
    else:
        tokens, masks = policy.lang_tokens.expand(BATCH, -1), policy.lang_masks.expand(BATCH, -1)
    batch["observation.language.tokens"], batch["observation.language.attention_mask"] = tokens, masks
    return batch


def _set_steps(policy, steps: int) -> None:
    policy.denoising_steps = steps
    config = policy.lerobot.config
    config.num_steps = steps  # SmolVLA
    if hasattr(config, "num_inference_steps"):
        config.num_inference_steps = steps  # pi0 / pi0.5


@pytest.mark.parametrize("steps", (2, 10))
@pytest.mark.parametrize("variant", VARIANTS)
def test_our_chunk_equals_lerobots_predict_action_chunk_for_the_same_noise(variant, steps, tiny_dirs):
    """Random noise on every dim (padded ones too) through our sample_chain (x_init + padded_init) and LeRobot's
    predict_action_chunk(noise=...); zero noise through our deterministic sample_actions and LeRobot's; both within
    1e-5. The padded dims matter: holding them at 0 (our old sampler) moves the chunk by far more than that."""
    torch.manual_seed(0)
    policy = build_vla({"observation_space": SPACE, "action_dim": ACTION_DIM},
                       VLAConfig(path=str(tiny_dirs[variant]), instruction=INSTRUCTION, bf16=False))
    policy.eval()
    _set_steps(policy, steps)
    obs = _observation()
    max_dim = policy.max_action_dim
    noise = torch.randn(BATCH, CHUNK, max_dim, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        theirs = policy.lerobot.predict_action_chunk(_lerobot_batch(policy, variant, obs), noise=noise.clone())
        chain, _ = policy.sample_chain(obs, "ode", x_init=noise[..., :ACTION_DIM].reshape(BATCH, -1),
                                       padded_init=noise[..., ACTION_DIM:])
        ours = chain[:, -1].reshape(BATCH, CHUNK, ACTION_DIM)
        theirs_zero = policy.lerobot.predict_action_chunk(_lerobot_batch(policy, variant, obs),
                                                          noise=torch.zeros(BATCH, CHUNK, max_dim))
        ours_zero = policy.sample_actions(obs)
        # the padded dims held at 0 over the chain: LeRobot's loop with their velocity zeroed
        denoise = policy.model.denoise_step

        def held(*args, **kwargs):
            v = denoise(*args, **kwargs)
            return torch.cat([v[..., :ACTION_DIM], torch.zeros_like(v[..., ACTION_DIM:])], dim=-1)

        policy.model.denoise_step = held
        try:
            theirs_held = policy.lerobot.predict_action_chunk(_lerobot_batch(policy, variant, obs),
                                                              noise=torch.zeros(BATCH, CHUNK, max_dim))
        finally:
            del policy.model.denoise_step
    assert theirs.shape == ours.shape == (BATCH, CHUNK, ACTION_DIM)
    diff, diff_zero = float((ours - theirs).abs().max()), float((ours_zero - theirs_zero).abs().max())
    print(f"{variant} K={steps}: max |ours - LeRobot| {diff:.2e} (noise), {diff_zero:.2e} (zero noise); "
          f"padded dims held at 0: {float((theirs_held - theirs_zero).abs().max()):.2e}")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_zero, theirs_zero, rtol=0, atol=1e-5)
    assert float((theirs_held - theirs_zero).abs().max()) > 1e-3


@pytest.mark.parametrize("variant", VARIANTS)
def test_our_flow_matching_loss_equals_lerobots_forward_for_the_same_noise_and_time(variant, tiny_dirs):
    """SFT's objective: our flow_matching_loss and LeRobot's own training forward (its noise and time fixed to ours,
    the padded dims' noise included) on the same batch of chunks give the same loss within 1e-5."""
    torch.manual_seed(0)
    policy = build_vla({"observation_space": SPACE, "action_dim": ACTION_DIM},
                       VLAConfig(path=str(tiny_dirs[variant]), instruction=INSTRUCTION, bf16=False))
    policy.eval()
    obs = _observation()
    g = torch.Generator().manual_seed(11)
    actions = torch.randn(BATCH, CHUNK, ACTION_DIM, generator=g) * 0.5
    noise = torch.randn(BATCH, CHUNK, policy.max_action_dim, generator=g)
    t = torch.tensor([0.3, 0.85])
    policy.model.sample_noise = lambda shape, device: noise.clone()
    policy.model.sample_time = lambda bsize, device: t.clone()
    with torch.no_grad():
        batch = {**_lerobot_batch(policy, variant, obs), "action": actions}
        theirs, _ = policy.lerobot.forward(batch)
        ours = policy.flow_matching_loss(obs, actions, t, noise[..., :ACTION_DIM], padded_noise=noise[..., ACTION_DIM:])
        held = policy.flow_matching_loss(obs, actions, t, noise[..., :ACTION_DIM],
                                         padded_noise=torch.zeros_like(noise[..., ACTION_DIM:]))
    print(f"{variant}: loss ours {float(ours):.6f}, LeRobot {float(theirs):.6f}; padded x_t held at 0: {float(held):.6f}")
    assert abs(float(ours) - float(theirs)) < 1e-5
    assert abs(float(held) - float(theirs)) > 1e-4
