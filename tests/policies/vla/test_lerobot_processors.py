"""A LeRobot checkpoint's normaliser / unnormaliser statistics (its ``policy_preprocessor*`` / ``policy_postprocessor*``
files, written by LeRobot's own ``make_pre_post_processors`` + ``save_pretrained``) through our adapter:

* every normalisation mode read from the files equals LeRobot's own processor steps on the same tensors;
* the whole pipeline: for the same observation (state in degrees, a camera), our deterministic chunk equals what LeRobot's
  preprocessor -> ``predict_action_chunk`` -> postprocessor returns, in the checkpoint's units.

Tiny random SmolVLA / pi0 / pi0.5 with the ``lerobot/smolvla_base`` structure (state [6], action [6]), built by the test.
Needs the ``vla`` extra (Python >= 3.12, lerobot 0.6.1).
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
from rlrobot.policies.vla.processors import read_normalisation  # noqa: E402
from rlrobot.policies.vla.tiny import build_tiny  # noqa: E402

INSTRUCTION = "pick up the cube"
SPACE = {"state": [6], "image_up": [3, 32, 32]}
CHUNK = 4
# degree-like statistics of an SO-101 (five joints in degrees, the gripper 0..100)
STATS = {key: {"mean": torch.tensor(mean), "std": torch.tensor(std), "min": torch.tensor(mean) - 3 * torch.tensor(std),
               "max": torch.tensor(mean) + 2 * torch.tensor(std), "q01": torch.tensor(mean) - 2 * torch.tensor(std),
               "q99": torch.tensor(mean) + 2.5 * torch.tensor(std), "q10": torch.tensor(mean) - torch.tensor(std),
               "q90": torch.tensor(mean) + torch.tensor(std)}
         for key, mean, std in (("observation.state", [-5.0, -60.0, 62.0, 70.0, 6.0, 17.0], [20.0, 25.0, 22.0, 15.0, 30.0, 12.0]),
                                ("action", [-4.0, -61.0, 63.0, 71.0, 6.5, 18.0], [21.0, 24.0, 23.0, 16.0, 31.0, 13.0]))}


def _save_processors(directory, mode: str | None = None):
    """LeRobot's own processors for the checkpoint in ``directory`` (``mode`` for STATE and ACTION, else the
    checkpoint's), written beside it with save_pretrained and loaded back as lerobot-record would."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.configs.types import NormalizationMode
    from lerobot.policies.factory import make_pre_post_processors

    cfg = PreTrainedConfig.from_pretrained(str(directory))
    if mode is not None:
        cfg.normalization_mapping = {**cfg.normalization_mapping, "STATE": NormalizationMode(mode),
                                     "ACTION": NormalizationMode(mode)}
    pre, post = make_pre_post_processors(cfg, dataset_stats=STATS)
    pre.save_pretrained(str(directory))
    post.save_pretrained(str(directory))
    return make_pre_post_processors(cfg, pretrained_path=str(directory))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root, built = tmp_path_factory.mktemp("proc"), {}

    def get(variant: str):
        if variant not in built:
            built[variant] = build_tiny(variant, root / variant, SPACE, 6, [INSTRUCTION], chunk_size=CHUNK,
                                        denoising_steps=3, seed=3)
        return built[variant]

    return get


@pytest.fixture(scope="module")
def smolvla(tiny):
    return tiny("smolvla")


@pytest.fixture
def offline_paligemma_tokenizer(monkeypatch):
    """pi0 / pi0.5's processors load the tokenizer google/paligemma-3b-pt-224 from the hub: hand them the tiny
    checkpoint's own (the one our adapter uses) instead."""
    from lerobot.processor import tokenizer_processor

    original = tokenizer_processor.AutoTokenizer.from_pretrained
    directory = {}

    def load(name, *args, **kwargs):
        if name == "google/paligemma-3b-pt-224":
            return original(str(directory["path"] / "tokenizer"), local_files_only=True)
        return original(name, *args, **kwargs)

    monkeypatch.setattr(tokenizer_processor.AutoTokenizer, "from_pretrained", load)
    return directory


@pytest.mark.parametrize("mode", ("MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10"))
def test_statistics_read_from_the_files_normalise_as_lerobots_processor_steps(mode, smolvla, tmp_path):
    import shutil

    from lerobot.processor import NormalizerProcessorStep, UnnormalizerProcessorStep

    directory = tmp_path / "ckpt"
    shutil.copytree(smolvla, directory)
    pre, post = _save_processors(directory, mode)
    norm = read_normalisation(directory)
    assert {k: a.mode for k, a in norm.items()} == {"observation.state": mode, "action": mode}
    normaliser = next(s for s in pre.steps if isinstance(s, NormalizerProcessorStep))
    unnormaliser = next(s for s in post.steps if isinstance(s, UnnormalizerProcessorStep))
    g = torch.Generator().manual_seed(0)
    state = torch.randn(5, 6, generator=g) * 30 + 20
    action = torch.randn(5, 6, generator=g)
    theirs_state = normaliser._normalize_observation({"observation.state": state}, inverse=False)["observation.state"]
    theirs_action = unnormaliser._normalize_action(action, inverse=True)
    torch.testing.assert_close(norm["observation.state"].normalise(state), theirs_state, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm["action"].unnormalise(action), theirs_action, rtol=1e-6, atol=1e-5)
    assert float((theirs_action - action).abs().max()) > 1.0  # the statistics are not the identity


def test_without_processor_files_the_statistics_are_the_identity(smolvla):
    assert read_normalisation(smolvla) == {}


def test_relative_actions_are_refused_in_one_line_before_loading(smolvla, tmp_path):
    import json
    import shutil

    directory = tmp_path / "rel"
    shutil.copytree(smolvla, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "use_relative_actions": True}))
    with pytest.raises(ValueError, match="use_relative_actions"):
        read_normalisation(directory)


@pytest.mark.parametrize("variant", ("smolvla", "pi0", "pi05"))
def test_our_chunk_equals_lerobots_pipeline_in_the_checkpoints_units(variant, tiny, offline_paligemma_tokenizer, tmp_path):
    """The same observation through LeRobot's preprocessor -> predict_action_chunk (zero noise) -> postprocessor and
    through our adapter built from the directory (state in degrees, uint8 camera): the same chunk, in degrees. Each
    variant's own normalisation (SmolVLA, pi0: MEAN_STD; pi0.5: QUANTILES, its state discretised into the prompt)."""
    import shutil

    directory = tmp_path / "ckpt"
    shutil.copytree(tiny(variant), directory)
    offline_paligemma_tokenizer["path"] = directory
    pre, post = _save_processors(directory)
    torch.manual_seed(0)
    policy = build_vla({"observation_space": SPACE, "action_dim": 6},
                       VLAConfig(path=str(directory), instruction=INSTRUCTION, bf16=False))
    policy.eval()
    g = torch.Generator().manual_seed(4)
    state = STATS["observation.state"]["mean"] + torch.randn(6, generator=g) * 20
    image = torch.randint(0, 256, (3, 32, 32), generator=g, dtype=torch.uint8)
    with torch.no_grad():
        batch = pre({"observation.state": state.clone(), "observation.images.up": image.float() / 255.0,
                     "task": INSTRUCTION})
        chunk = policy.lerobot.predict_action_chunk(batch, noise=torch.zeros(1, CHUNK, policy.max_action_dim))
        theirs = post(chunk)
        ours = policy.sample_actions({"state": state[None], "image_up": image[None]})
    assert ours.shape == theirs.shape == (1, CHUNK, 6)
    normalised_gap = float(((ours - theirs) / policy.action_scale).abs().max())
    print(f"{variant}: max |ours - LeRobot| {float((ours - theirs).abs().max()):.2e} in the checkpoint's units (chunk spans "
          f"{float(theirs.min()):.1f}..{float(theirs.max()):.1f}), {normalised_gap:.2e} normalised")
    assert normalised_gap < 1e-5
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=2e-4)
    # without the statistics the chunk would be the normalised output: far from LeRobot's
    assert float((chunk - theirs).abs().max()) > 10.0
    # real-time chunking's sampler without a leftover is the same chunk (units and padded dims as sample_actions)
    from rlrobot.policies.rtc import RTCConfig, rtc_sample

    plain = rtc_sample(policy, {"state": state[None], "image_up": image[None]}, None, 0, RTCConfig())
    torch.testing.assert_close(plain, ours, rtol=0, atol=1e-5)
    # a leftover given in the checkpoint's units is what the guided chunk is pulled to: its first, frozen-by-guidance
    # action ends nearer the leftover than the plain chunk's (in units), not at the normalised values
    leftover = theirs[:, :2] + torch.tensor([5.0, -5.0, 5.0, -5.0, 5.0, -5.0])
    guided = rtc_sample(policy, {"state": state[None], "image_up": image[None]}, leftover, 1,
                        RTCConfig(max_guidance_weight=5.0, jacobian="identity"))
    assert float((guided[:, 0] - leftover[:, 0]).abs().max()) < float((ours[:, 0] - leftover[:, 0]).abs().max())
