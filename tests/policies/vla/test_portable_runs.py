"""A VLA run that outlives its base directory, and its export back to LeRobot: a tiny SmolVLA with the real structure
(LeRobot's classes, processor files with degree-like statistics) fine-tuned with LoRA by vla-flow-noise; the base
directory is then moved away and the run is evaluated and exported; LeRobot's own ``from_pretrained`` +
processors on the export give our chunk. Needs the ``vla`` extra (lerobot 0.6.1, peft)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12; .ci/run runs these in .venv-vla)")
pytest.importorskip("peft", reason="peft is not installed (LoRA)")

from rlrobot.cli import main  # noqa: E402
from rlrobot.policies.registry import policy_from_checkpoint  # noqa: E402
from rlrobot.policies.vla.tiny import main as tiny_main  # noqa: E402

STATE_MEAN = [0.1 * i for i in range(27)]
STATE_STD = [0.5 + 0.05 * i for i in range(27)]
STATS = {"observation.state": {"mean": STATE_MEAN, "std": STATE_STD},
         "action": {"mean": [-4.0, -61.0, 63.0, 71.0, 6.5, 18.0], "std": [21.0, 24.0, 23.0, 16.0, 31.0, 13.0]}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run directory, where the base directory was) after a LoRA vla-flow-noise run whose base was then moved away."""
    root = tmp_path_factory.mktemp("portable")
    base, run, stats = root / "smolvla", root / "run", root / "stats.json"
    stats.write_text(json.dumps(STATS))
    tiny_main(["--variant", "smolvla", "--task", "so101-reach", "--out", str(base), "--chunk-size", "5",
               "--stats", str(stats)])
    main(["train", "--algo", "vla-flow-noise", "--task", "so101-reach", "--obs-mode", "state+rgb", "--control-mode",
          "joint_pos", "--vla.path", str(base), "--vla.lora-rank", "4", "--out", str(run), "--num-envs", "2",
          "--max-episode-steps", "10", "--flow-ppo.rollout-chunks", "2", "--flow-ppo.num-minibatches", "2",
          "--flow-ppo.num-epochs", "1", "--flow-ppo.critic-warmup-iterations", "0", "--flow-ppo.lr", "0.01",
          "--total-steps", "20", "--logger", "none", "--no-video", "--eval-episodes", "2", "--eval-envs", "2",
          "--eval-every", "0", "--num-threads", "1"])
    main(["eval", "--checkpoint", str(run), "--no-video", "--out", str(root / "eval_before")])
    shutil.move(base, root / "moved_away")
    return run, base, root


def test_a_vla_run_evaluates_the_same_after_its_base_directory_moved(trained):
    run, base, root = trained
    assert not base.exists()
    assert not (run / "lerobot_base" / "model.safetensors").exists()  # the weights are the run's, not copied
    main(["eval", "--checkpoint", str(run), "--no-video", "--out", str(root / "eval_after")])
    before = json.loads((root / "eval_before" / "eval.json").read_text())
    after = json.loads((root / "eval_after" / "eval.json").read_text())
    print(f"return before the move {before['return_mean']:.6f}, after {after['return_mean']:.6f}")
    assert after["return_mean"] == before["return_mean"] and after["success_rate"] == before["success_rate"]
    # deploy (and serve: the same loader) on the twin with the cameras, the base still away
    report = root / "deploy.json"
    main(["deploy", "--robot", "twin", "--checkpoint", str(run), "--episodes", "1", "--max-steps", "5",
          "--executor.no-realtime", "--json-out", str(report)])
    summary = json.loads(report.read_text())
    assert summary["steps"] == 5 and summary["inference_failures"] == 0 and summary["first_failure"] is None
    # --init RUN fine-tunes it further without the base: the architecture from the run's copy, the weights from the run
    again = root / "again"
    main(["train", "--algo", "vla-flow-noise", "--task", "so101-reach", "--obs-mode", "state+rgb", "--control-mode",
          "joint_pos", "--init", str(run), "--out", str(again), "--num-envs", "2", "--max-episode-steps", "10",
          "--flow-ppo.rollout-chunks", "2", "--flow-ppo.num-minibatches", "2", "--flow-ppo.num-epochs", "1",
          "--total-steps", "20", "--logger", "none", "--no-video", "--eval-episodes", "2", "--eval-envs", "2",
          "--eval-every", "0", "--num-threads", "1"])
    assert json.loads((again / "config.json").read_text())["train"]["vla"]["path"] == str(run / "lerobot_base")
    assert (again / "lerobot_base" / "config.json").is_file()
    # a copy of the base holds no weights: starting a run from it alone is refused, --init RUN is the way
    with pytest.raises(SystemExit) as e:
        main(["train", "--algo", "vla-flow-noise", "--task", "so101-reach", "--obs-mode", "state+rgb",
              "--control-mode", "joint_pos", "--vla.path", str(run / "lerobot_base"), "--out", str(root / "bad")])
    assert e.value.code == 2


def test_the_lerobot_export_gives_our_actions_through_lerobots_own_pipeline(trained, capsys):
    """LeRobot's from_pretrained + make_pre_post_processors on the export: preprocessor -> predict_action_chunk ->
    postprocessor equals our policy's chunk (same observation, same noise: zero and random), within 1e-5 normalised."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    run, _, root = trained
    out = root / "export"
    main(["export", str(run), "--format", "lerobot", "--out", str(out)])
    weights = json.loads((run / "config.json").read_text())
    assert weights["train"]["vla"]["lora_rank"] == 4
    ours, _, ckpt = policy_from_checkpoint(str(run))
    ours.eval()
    from safetensors.torch import load_file

    lora_b = [v for k, v in load_file(ckpt / "model.safetensors").items() if "lora_B" in k]
    assert lora_b and max(float(v.abs().max()) for v in lora_b) > 0  # the LoRA delta is not zero: merging matters
    assert not any("lora" in k for k in load_file(out / "model.safetensors"))

    theirs = SmolVLAPolicy.from_pretrained(str(out), local_files_only=True).eval()
    pre, post = make_pre_post_processors(PreTrainedConfig.from_pretrained(str(out)), pretrained_path=str(out))
    space = json.loads((run / "config.json").read_text())["observation_space"]
    gap = _largest_gap(ours, theirs, pre, post, {k: v for k, v in space.items() if k.startswith("image_")},
                       torch.tensor(STATE_MEAN), torch.tensor(STATE_STD), select_action=True)
    assert gap < 1e-5


def _largest_gap(ours, theirs, pre, post, cameras: dict, state_mean: torch.Tensor, state_std: torch.Tensor,
                 select_action: bool = False) -> float:
    """The largest normalised gap between our chunk and LeRobot's preprocessor -> predict_action_chunk ->
    postprocessor for one observation (state around ``state_mean``), at zero and at random noise; with
    ``select_action``, LeRobot's select_action's first action against ours too."""
    g = torch.Generator().manual_seed(5)
    state = state_mean + torch.randn(len(state_mean), generator=g) * state_std
    images = {k: torch.randint(0, 256, tuple(shape), generator=g, dtype=torch.uint8) for k, shape in cameras.items()}
    obs = {"state": state[None], **{k: v[None] for k, v in images.items()}}
    batch_in = {"observation.state": state.clone(), "task": ours.instruction,
                **{"observation.images." + k.removeprefix("image_"): v.float() / 255.0 for k, v in images.items()}}
    gaps = []
    for noise in (torch.zeros(1, ours.chunk_size, ours.max_action_dim),
                  torch.randn(1, ours.chunk_size, ours.max_action_dim, generator=g)):
        with torch.no_grad():
            lerobot_chunk = post(theirs.predict_action_chunk(pre(dict(batch_in)), noise=noise.clone()))
            chain, _ = ours.sample_chain(obs, x_init=noise[:, :, :ours.action_dim].reshape(1, -1),
                                         padded_init=noise[:, :, ours.action_dim:])
            our_chunk = ours.chain_actions(chain[:, -1])
        assert our_chunk.shape == lerobot_chunk.shape == (1, ours.chunk_size, ours.action_dim)
        gaps.append(float(((our_chunk - lerobot_chunk) / ours.action_scale).abs().max()))
        print(f"max |ours - LeRobot(export)| {float((our_chunk - lerobot_chunk).abs().max()):.2e} in the checkpoint's "
              f"units (chunk spans {float(lerobot_chunk.min()):.1f}..{float(lerobot_chunk.max()):.1f}), "
              f"{gaps[-1]:.2e} normalised")
        if select_action and not noise.any():  # LeRobot's queue over the same chunk starts with its first action
            theirs.reset()
            with torch.no_grad():
                first = post(theirs.select_action(pre(dict(batch_in)), noise=noise.clone()))
            gaps.append(float(((first - our_chunk[:, 0]) / ours.action_scale).abs().max()))
            print(f"select_action's first action: {gaps[-1]:.2e} normalised")
    return max(gaps)


@pytest.mark.parametrize("variant", ("smolvla", "pi0", "pi05"))
def test_an_export_carries_merged_lora_and_the_runs_own_state_statistics(variant, tmp_path):
    """Each variant (pi0.5: QUANTILES, its state in the prompt) with a non-zero LoRA delta and state statistics of its
    own (as vla-sft fits on its dataset): LeRobot's classes and processors on the export give our chunk."""
    from contextlib import nullcontext

    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors

    from rlrobot.policies.vla.config import VLAConfig
    from rlrobot.policies.vla.load import TINY_MARKER, build_vla, policy_class
    from rlrobot.policies.vla.portable import export_lerobot
    from rlrobot.policies.vla.tiny import build_tiny, offline_processor_tokenizer, tiny_patches, write_processors

    space, instruction = {"state": [6], "image_up": [3, 32, 32]}, "pick up the cube"
    base = build_tiny(variant, tmp_path / "base", space, 6, [instruction], chunk_size=4, denoising_steps=3, seed=3)
    mean, std = torch.tensor(STATS["action"]["mean"]), torch.tensor(STATS["action"]["std"])
    degrees = {"mean": mean.tolist(), "std": std.tolist(), "q01": (mean - 2 * std).tolist(), "q99": (mean + 2 * std).tolist()}
    write_processors(base, {"observation.state": degrees, "action": degrees})
    torch.manual_seed(0)
    ours = build_vla({"observation_space": space, "action_dim": 6},
                     VLAConfig(path=str(base), instruction=instruction, bf16=False, lora_rank=4))
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
        ours.state_mean.copy_(torch.tensor([3.0, -50.0, 55.0, 60.0, 0.0, 30.0]))
        ours.state_std.copy_(torch.tensor([10.0, 20.0, 30.0, 12.0, 25.0, 9.0]))
    ours.eval()
    out = export_lerobot(ours, base, tmp_path / "export")
    sizes = json.loads((out / TINY_MARKER).read_text())
    patches = lambda: tiny_patches(variant, sizes) if variant != "smolvla" else nullcontext()  # noqa: E731
    with patches():
        theirs = policy_class(variant).from_pretrained(str(out), local_files_only=True).eval()
    with offline_processor_tokenizer(out):
        pre, post = make_pre_post_processors(PreTrainedConfig.from_pretrained(str(out)), pretrained_path=str(out))
    gap = _largest_gap(ours, theirs, pre, post, {"image_up": space["image_up"]}, ours.state_mean.clone(),
                       ours.state_std.clone())
    assert gap < 1e-5
    # the LoRA delta and the statistics matter: the base directory through the same pipeline is far off
    with patches():
        plain = policy_class(variant).from_pretrained(str(base), local_files_only=True).eval()
    with offline_processor_tokenizer(base):
        base_pre, base_post = make_pre_post_processors(PreTrainedConfig.from_pretrained(str(base)),
                                                       pretrained_path=str(base))
    assert _largest_gap(ours, plain, base_pre, base_post, {"image_up": space["image_up"]}, ours.state_mean.clone(),
                        ours.state_std.clone()) > 1e-3


def test_export_refuses_an_existing_non_empty_directory(trained):
    run, _, root = trained
    taken = root / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["export", str(run), "--format", "lerobot", "--out", str(taken)])
    assert e.value.code == 2
    # a LoRA-only export names its base checkpoint, which was moved away: refused, nothing written
    with pytest.raises(SystemExit) as e:
        main(["export", str(run), "--lora-only", "--out", str(root / "adapter")])
    assert e.value.code == 2 and not (root / "adapter").exists()


def test_a_vlm_folder_outside_the_base_directory_is_copied_with_it(tmp_path):
    """SmolVLA's ``vlm_model_name`` naming a local folder elsewhere: the run's copy gets that folder (and LeRobot's
    tokenizer step follows it), so the copy builds after both the base and the VLM folder are gone."""
    from rlrobot.policies.vla.config import VLAConfig
    from rlrobot.policies.vla.load import build_vla
    from rlrobot.policies.vla.portable import VLM_FOLDER, copy_base, set_tokenizer_name
    from rlrobot.policies.vla.tiny import build_tiny

    space = {"state": [6], "image_up": [3, 32, 32]}
    base = build_tiny("smolvla", tmp_path / "base", space, 6, ["pick up the cube"], chunk_size=4, denoising_steps=3)
    elsewhere = shutil.move(base / "vlm", tmp_path / "smolvlm")
    config = json.loads((base / "config.json").read_text())
    config["vlm_model_name"] = str(elsewhere)
    (base / "config.json").write_text(json.dumps(config))
    set_tokenizer_name(base, str(elsewhere))
    torch.manual_seed(0)
    policy = build_vla({"observation_space": space, "action_dim": 6}, VLAConfig(path=str(base), bf16=False))
    copy = copy_base(base, tmp_path / "run" / "lerobot_base", policy.tokenizer)
    shutil.rmtree(base)
    shutil.rmtree(elsewhere)
    assert json.loads((copy / "config.json").read_text())["vlm_model_name"] == VLM_FOLDER
    assert (copy / VLM_FOLDER / "config.json").is_file()
    rebuilt = build_vla({"observation_space": space, "action_dim": 6}, VLAConfig(path=str(copy), bf16=False))
    rebuilt.load_state_dict(policy.state_dict())
    obs = {"state": torch.randn(1, 6), "image_up": torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)}
    with torch.no_grad():
        assert torch.equal(rebuilt.sample_actions(obs), policy.sample_actions(obs))


def test_a_lora_only_export_loads_in_lerobot_over_its_base_with_our_actions(tmp_path):
    """``lora_only``: the adapters and the projections trained in full as a PEFT adapter over the base checkpoint; LeRobot's
    own use_peft loading (``_load_pretrained_policy``: the base's from_pretrained, then PeftModel) and its processors
    give our chunk. A run without LoRA, or whose other weights moved, is refused."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.rollout.context import _load_pretrained_policy

    from rlrobot.policies.vla.config import VLAConfig
    from rlrobot.policies.vla.load import build_vla
    from rlrobot.policies.vla.portable import export_lerobot
    from rlrobot.policies.vla.tiny import build_tiny, write_processors

    space, instruction = {"state": [6], "image_up": [3, 32, 32]}, "pick up the cube"
    base = build_tiny("smolvla", tmp_path / "base", space, 6, [instruction], chunk_size=4, denoising_steps=3, seed=3)
    degrees = dict(STATS["action"])
    write_processors(base, {"observation.state": degrees, "action": degrees})
    torch.manual_seed(0)
    ours = build_vla({"observation_space": space, "action_dim": 6},
                     VLAConfig(path=str(base), instruction=instruction, bf16=False, lora_rank=4))
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "lora_B" in name or "action_out_proj" in name:
                p.add_(torch.randn_like(p) * 0.05)
        ours.state_mean.copy_(torch.tensor([3.0, -50.0, 55.0, 60.0, 0.0, 30.0]))
        ours.state_std.copy_(torch.tensor([10.0, 20.0, 30.0, 12.0, 25.0, 9.0]))
    ours.eval()
    out = export_lerobot(ours, base, tmp_path / "adapter", lora_only=True)
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    config = PreTrainedConfig.from_pretrained(str(out))
    assert config.use_peft
    config.pretrained_path = out
    theirs = _load_pretrained_policy(config).eval()
    pre, post = make_pre_post_processors(config, pretrained_path=str(out))
    gap = _largest_gap(ours, theirs, pre, post, {"image_up": space["image_up"]}, ours.state_mean.clone(),
                       ours.state_std.clone())
    assert gap < 1e-5
    # the adapter matters: the base alone through the same processors is far off
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    plain = SmolVLAPolicy.from_pretrained(str(base), local_files_only=True).eval()
    assert _largest_gap(ours, plain, pre, post, {"image_up": space["image_up"]}, ours.state_mean.clone(),
                        ours.state_std.clone()) > 1e-3
    # weights outside the adapters that moved would be lost: refused
    with torch.no_grad():
        next(p for n, p in ours.named_parameters() if "base_layer" in n).add_(0.1)
    with pytest.raises(ValueError, match="outside its LoRA adapters"):
        export_lerobot(ours, base, tmp_path / "refused", lora_only=True)
    full = build_vla({"observation_space": space, "action_dim": 6}, VLAConfig(path=str(base), instruction=instruction))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        export_lerobot(full, base, tmp_path / "refused", lora_only=True)
