"""Image encoders of the MLP actor-critic (Nature / IMPALA CNNs, DrQ's random shift) and the asymmetric critic."""

import pytest
import torch
from safetensors.torch import load_file

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.checkpoints import resolve_checkpoint
from rlrobot.config import train_config
from rlrobot.policies import ActorCritic, ActorCriticConfig
from rlrobot.policies.encoders import CameraEncoder, ImageObservationEncoder, RandomShift
from rlrobot.policies.sac_policy import SACPolicyConfig
from rlrobot.runners.on_policy import OnPolicyRunner

CAMERAS = ("image_front", "image_wrist")
SHAPES = {k: (3, 64, 64) for k in CAMERAS}


def frames(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def profile_obs(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """What --obs-mode lerobot gives: 6 joint readings, two uint8 cameras, the privileged task state."""
    g = torch.Generator().manual_seed(seed)
    return {"state": torch.randn(batch, 6, generator=g), "privileged_state": torch.randn(batch, 27, generator=g),
            **{k: frames(batch, seed + i + 1) for i, k in enumerate(CAMERAS)}}


def asymmetric_policy(**kw) -> ActorCritic:
    torch.manual_seed(0)
    cfg = ActorCriticConfig(image_keys=CAMERAS, critic_obs_key="privileged_state", image_features=16, actor_hidden=(32,),
                            critic_hidden=(32,), **kw)
    return ActorCritic(6, 6, cfg, image_shapes=SHAPES, critic_obs_dim=27)


@pytest.mark.parametrize("arch", ["nature", "impala"])
@pytest.mark.parametrize("shared", [True, False])
def test_encoder_maps_uint8_frames_of_each_camera_to_bounded_features(arch, shared):
    torch.manual_seed(0)
    enc = ImageObservationEncoder(CAMERAS, SHAPES, arch, features=24, shared=shared)
    obs = profile_obs(5)
    out = enc(obs)
    assert out.shape == (5, 48) and enc.out_dim == 48
    assert out.dtype == torch.float32 and out.abs().max() <= 1.0  # LayerNorm + tanh head
    # camera k's features are its own frames through its CNN, in image_keys order
    cnn = {k: enc.cnn if shared else enc.cnns[k] for k in CAMERAS}
    for i, k in enumerate(CAMERAS):
        assert torch.allclose(out[:, 24 * i:24 * (i + 1)], cnn[k](obs[k]), atol=1e-6)


def test_a_shared_encoder_has_one_cnn_and_per_camera_encoders_have_one_each():
    shared = ImageObservationEncoder(CAMERAS, SHAPES, "nature", features=16, shared=True)
    separate = ImageObservationEncoder(CAMERAS, SHAPES, "nature", features=16, shared=False)
    one = sum(p.numel() for p in CameraEncoder("nature", (3, 64, 64), 16).parameters())
    assert sum(p.numel() for p in shared.parameters()) == one
    assert sum(p.numel() for p in separate.parameters()) == 2 * one


def test_random_shift_crops_each_uint8_frame_of_its_edge_padded_copy_at_its_own_offset():
    x = frames(16)
    out = RandomShift(4)(x, torch.Generator().manual_seed(1))
    assert out.dtype == torch.uint8 and out.shape == x.shape
    padded = torch.nn.functional.pad(x.float(), (4, 4, 4, 4), mode="replicate").to(torch.uint8)
    offsets = []
    for b in range(16):
        found = [(r, c) for r in range(9) for c in range(9) if torch.equal(out[b], padded[b, :, r:r + 64, c:c + 64])]
        assert found, f"frame {b} is not a crop of its padded frame"
        offsets.append(found[0])
    assert len(set(offsets)) > 4  # independent per frame
    assert torch.equal(RandomShift(0)(x), x)


def test_frames_are_shifted_only_when_the_update_asks_for_augmentation():
    policy = asymmetric_policy(random_shift=4)
    obs = profile_obs(8)
    torch.manual_seed(1)
    plain = policy.features(obs)
    assert torch.equal(plain, policy.features(obs, augment=False))
    assert torch.equal(policy.act(obs, deterministic=True), policy.act(obs, deterministic=True))
    assert not torch.allclose(policy.features(obs, augment=True), plain)
    # random_shift=0: augmenting changes nothing
    unshifted = asymmetric_policy(random_shift=0)
    assert torch.equal(unshifted.features(obs, augment=True), unshifted.features(obs))


def test_the_asymmetric_critic_reads_the_privileged_state_and_the_actor_never_does():
    policy = asymmetric_policy()
    obs = profile_obs(4)
    obs["privileged_state"].requires_grad_(True)
    obs["state"].requires_grad_(True)
    action = policy.act(obs, deterministic=True)
    action.sum().backward()
    assert obs["privileged_state"].grad is None  # the actor's graph never touches it
    assert obs["state"].grad.abs().sum() > 0
    obs["state"].grad = None
    policy.zero_grad()
    policy.value(obs).sum().backward()
    assert obs["privileged_state"].grad.abs().sum() > 0
    assert obs["state"].grad is None  # nor does the critic read the actor's inputs
    assert all(p.grad is None for p in policy.images.parameters())
    # perturbing the privileged state moves the value, never the action; perturbing the cameras the reverse
    moved = dict(obs, privileged_state=obs["privileged_state"].detach() + 1.0)
    assert torch.equal(policy.act(moved, deterministic=True), policy.act(obs, deterministic=True))
    assert not torch.allclose(policy.value(moved), policy.value(obs))
    recoloured = dict(obs, image_front=255 - obs["image_front"])
    assert torch.equal(policy.value(recoloured), policy.value(obs))
    assert not torch.allclose(policy.act(recoloured, deterministic=True), policy.act(obs, deterministic=True))


def test_the_asymmetric_critic_keeps_its_own_normaliser():
    policy = asymmetric_policy()
    obs = profile_obs(64)
    policy.update_normalizer(obs)
    assert torch.allclose(policy.critic_normalizer.mean, obs["privileged_state"].mean(0), atol=1e-5)
    assert torch.allclose(policy.normalizer.mean, obs["state"].mean(0), atol=1e-5)


def test_without_image_keys_the_policy_has_exactly_its_state_parameters():
    torch.manual_seed(0)
    policy = ActorCritic(27, 6, ActorCriticConfig(actor_hidden=(32,), critic_hidden=(32,)))
    assert policy.images is None and not policy.asymmetric
    # the checkpoint's tensors, in the order older versions wrote them (old checkpoints load unchanged)
    assert list(policy.state_dict()) == ["log_std", "normalizer.mean", "normalizer.var", "normalizer.count",
                                         "actor.0.weight", "actor.0.bias", "actor.2.weight", "actor.2.bias",
                                         "critic.0.weight", "critic.0.bias", "critic.2.weight", "critic.2.bias"]
    obs = {"state": torch.randn(3, 27)}
    x = policy.features(obs)
    assert policy.critic_input(obs, x) is x  # the symmetric critic reads the actor's features, no second pass


def _pixels_cfg(out, iterations: int, policy: ActorCriticConfig | None = None, **kw):
    policy = policy or ActorCriticConfig(image_keys=CAMERAS, critic_obs_key="privileged_state", image_features=8,
                                         actor_hidden=(16,), critic_hidden=(16,))
    return train_config("ppo", task="so101-reach", obs_mode=kw.pop("obs_mode", "lerobot"), num_envs=4, seed=5,
                        total_steps=4 * 4 * iterations, out=str(out), logger="none",
                        ppo=PPOConfig(rollout_steps=4, num_minibatches=2, num_epochs=1), policy=policy, checkpoint_every=2,
                        eval_every=0, eval_episodes=2, eval_envs=2, video=False, max_episode_steps=8, **kw)


def test_ppo_from_pixels_with_an_asymmetric_critic_stores_uint8_frames_and_augments_only_its_update(tmp_path, monkeypatch):
    runner = OnPolicyRunner(_pixels_cfg(tmp_path / "run", 1))
    assert set(runner.algo.storage.obs) == {"state", *CAMERAS, "privileged_state"}
    assert runner.algo.storage.obs["image_front"].dtype == torch.uint8
    calls = []
    shift = RandomShift.forward
    monkeypatch.setattr(RandomShift, "forward", lambda self, x, generator=None: calls.append(x.shape) or shift(self, x))
    runner.obs, _ = runner.env.reset(seed=0)
    runner._rollout()
    assert calls == []  # acting reads the frames as they are
    cnn_before = [p.detach().clone() for p in runner.policy.images.parameters()]
    stats = runner.update()
    assert len(calls) == 2 * 2  # one shift per camera per minibatch
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert any(not torch.equal(a, b) for a, b in zip(cnn_before, runner.policy.images.parameters(), strict=True))
    calls.clear()
    runner.evaluate(video=False)
    assert calls == []


def test_ppo_from_pixels_resumes_exactly(tmp_path):
    # --obs-mode state+rgb: the plain env's state (physics, visual randomisation) is saved whole; the critic reads
    # the state vector through its own normaliser, the actor the same vector and the cameras
    policy = ActorCriticConfig(image_keys=CAMERAS, critic_obs_key="state", image_features=8, actor_hidden=(16,),
                               critic_hidden=(16,))
    for out, iterations, resume in (("a", 4, False), ("b", 2, False), ("b", 4, True)):
        OnPolicyRunner(_pixels_cfg(tmp_path / out, iterations, policy, obs_mode="state+rgb", resume=resume)).learn()
    a = load_file(resolve_checkpoint(tmp_path / "a") / "model.safetensors")
    b = load_file(resolve_checkpoint(tmp_path / "b") / "model.safetensors")
    assert a.keys() == b.keys() and any(k.startswith("images.") for k in a) and "critic_normalizer.mean" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("kw, obs_mode, match", [
    ({"image_keys": CAMERAS}, "state", "renders none"),
    ({"image_keys": ("state",)}, "lerobot", "not camera observations"),
    ({"image_keys": ("image_front", "image_front")}, "lerobot", "names a camera twice"),
    ({"critic_obs_key": "image_front"}, "lerobot", "vector observation"),
])
def test_bad_image_options_are_refused_before_anything_runs(kw, obs_mode, match):
    with pytest.raises(ValueError, match=match):
        train_config("ppo", task="so101-reach", obs_mode=obs_mode, policy=ActorCriticConfig(**kw)).validate()


def test_a_missing_camera_or_critic_key_is_named(tmp_path):
    with pytest.raises(ValueError, match="image_top"):
        OnPolicyRunner(_pixels_cfg(tmp_path / "x", 1, policy=ActorCriticConfig(image_keys=("image_top",))))
    with pytest.raises(ValueError, match="policy.critic_obs_key='privileged'"):
        OnPolicyRunner(_pixels_cfg(tmp_path / "y", 1, policy=ActorCriticConfig(critic_obs_key="privileged")))


def test_sac_refuses_image_and_critic_keys():
    with pytest.raises(ValueError, match="SAC policy reads vector observations only"):
        train_config("sac", task="so101-reach", obs_mode="lerobot", policy=SACPolicyConfig(image_keys=CAMERAS)).validate()
    with pytest.raises(ValueError, match="asymmetric critic"):
        train_config("sac", task="so101-reach", obs_mode="lerobot",
                     policy=SACPolicyConfig(critic_obs_key="privileged_state")).validate()
