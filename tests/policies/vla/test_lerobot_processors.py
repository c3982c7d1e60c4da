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
from rlrobot.policies.vla.tiny import build_tiny, offline_processor_tokenizer, write_processors  # noqa: E402

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
    checkpoint's), written beside it by ``write_processors`` and loaded back as lerobot-record would."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors

    write_processors(directory, {k: {n: v.tolist() for n, v in by.items()} for k, by in STATS.items()},
                     {"STATE": mode, "ACTION": mode} if mode else None)
    with offline_processor_tokenizer(directory):
        return make_pre_post_processors(PreTrainedConfig.from_pretrained(str(directory)), pretrained_path=str(directory))


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
def test_our_chunk_equals_lerobots_pipeline_in_the_checkpoints_units(variant, tiny, tmp_path):
    """The same observation through LeRobot's preprocessor -> predict_action_chunk (zero noise) -> postprocessor and
    through our adapter built from the directory (state in degrees, uint8 camera): the same chunk, in degrees. Each
    variant's own normalisation (SmolVLA, pi0: MEAN_STD; pi0.5: QUANTILES, its state discretised into the prompt)."""
    import shutil

    directory = tmp_path / "ckpt"
    shutil.copytree(tiny(variant), directory)
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


def test_tiny_builder_cli_writes_lerobots_processors_with_the_given_statistics(tmp_path):
    """python -m rlrobot.policies.vla.tiny ... --stats FILE: the checkpoint carries LeRobot's processor files with those
    statistics, which our loader reads back (SmolVLA: MEAN_STD)."""
    import json

    from rlrobot.policies.vla.tiny import main as tiny_main
    from rlrobot.tasks.registry import make

    env = make("so101-reach", 1, obs_mode="state+rgb", control_mode="joint_pos")
    state_dim = int(env.single_observation_space["state"].shape[0])
    env.close()
    stats = {"observation.state": {"mean": [0.5] * state_dim, "std": [2.0] * state_dim},
             "action": {"mean": [10.0, 20.0, 30.0, 40.0, 50.0, 60.0], "std": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}}
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    out = tmp_path / "smolvla"
    tiny_main(["--variant", "smolvla", "--task", "so101-reach", "--out", str(out), "--chunk-size", "4",
               "--stats", str(tmp_path / "stats.json")])
    assert (out / "policy_preprocessor.json").is_file() and (out / "policy_postprocessor.json").is_file()
    norm = read_normalisation(out)
    assert norm["observation.state"].mode == norm["action"].mode == "MEAN_STD"
    torch.testing.assert_close(norm["action"].unnormalise(torch.ones(6)), torch.tensor([11.0, 22.0, 33.0, 44.0, 55.0, 66.0]))
    torch.testing.assert_close(norm["observation.state"].normalise(torch.full((state_dim,), 2.5)), torch.ones(state_dim))
