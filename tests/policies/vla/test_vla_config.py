"""Bad input to the VLA policy kind is refused with one line before any model is built, and without LeRobot: a hub id
instead of a path, a directory that is not a LeRobot pi0 / pi05 / smolvla policy, features that do not fit the task,
a chunk length or variant that disagrees with the checkpoint; and the missing extra is named."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rlrobot.cli import main
from rlrobot.config import config_class
from rlrobot.policies.registry import build_policy, policy_kinds
from rlrobot.policies.vla.config import VLAConfig, check_features, read_pretrained_config

SPACE = {"state": [33], "image_front": [3, 64, 64], "image_wrist": [3, 64, 64]}
META = {"observation_space": SPACE, "action_dim": 6}


def lerobot_dir(tmp_path, kind="pi0", state=33, action=6, cameras=("front",), chunk=5):
    """A directory shaped like LeRobot's save_pretrained output (config.json + model.safetensors)."""
    d = tmp_path / f"{kind}_dir"
    d.mkdir()
    features = {"observation.state": {"type": "STATE", "shape": [state]}}
    features.update({f"observation.images.{c}": {"type": "VISUAL", "shape": [3, 32, 32]} for c in cameras})
    (d / "config.json").write_text(json.dumps({"type": kind, "chunk_size": chunk, "num_inference_steps": 3,
                                               "input_features": features,
                                               "output_features": {"action": {"type": "ACTION", "shape": [action]}}}))
    (d / "model.safetensors").write_bytes(b"")
    return d


def test_vla_kind_and_algorithms_are_registered():
    assert "vla" in policy_kinds()
    cfg = config_class("vla-flow-sde")(task="so101-lift")
    assert cfg.flow is cfg.vla  # the flow runners read the --vla section as run.flow


@pytest.mark.parametrize("path, message", [
    ("lerobot/pi0_base", "looks like a Hugging Face hub id: rlrobot loads VLAs from local disk only"),
    ("", "vla.path is empty"),
    ("/nonexistent/dir/x", "is not a directory"),
])
def test_paths_that_are_not_local_directories_are_refused(path, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        read_pretrained_config(path)


def test_directories_that_are_not_lerobot_vlas_are_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="is not a LeRobot pretrained policy: no config.json"):
        read_pretrained_config(str(empty))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": {"algo": "sft"}, "policy_kind": "flow"}))
    with pytest.raises(ValueError, match="no 'type' field"):
        read_pretrained_config(str(run))
    act = lerobot_dir(tmp_path, kind="act")
    with pytest.raises(ValueError, match="is not a LeRobot pi0 / pi05 / smolvla policy: its config.json has type 'act'"):
        read_pretrained_config(str(act))
    (run / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not JSON"):
        read_pretrained_config(str(run))
    no_weights = lerobot_dir(tmp_path, kind="smolvla")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="has no model.safetensors"):
        read_pretrained_config(str(no_weights))


@pytest.mark.parametrize("kw, message", [
    ({"state": 6}, r"'observation.state' has shape \[6\], the task's 'state' \[33\]"),
    ({"action": 7}, "'action' has 7 dims, the task's action space 6"),
    ({"cameras": ("top",)}, "'observation.images.top' needs observation 'image_top'"),
])
def test_feature_mismatch_is_refused_naming_the_feature(tmp_path, kw, message):
    d = lerobot_dir(tmp_path, **kw)
    with pytest.raises(ValueError, match=message):
        check_features(read_pretrained_config(str(d)), SPACE, 6)
    with pytest.raises(ValueError, match=message):  # the registry's builder checks before importing LeRobot
        build_policy({"policy_kind": "vla", **META}, config_class("vla-flow-noise")(vla=VLAConfig(path=str(d))))


def test_state_only_task_refuses_a_camera_checkpoint(tmp_path):
    d = lerobot_dir(tmp_path)
    with pytest.raises(ValueError, match="cameras need obs_mode='state\\+rgb'"):
        check_features(read_pretrained_config(str(d)), {"state": [33]}, 6)


def test_chunk_and_variant_disagreeing_with_the_checkpoint_are_refused(tmp_path):
    d = lerobot_dir(tmp_path)
    meta = {"policy_kind": "vla", **META}
    with pytest.raises(ValueError, match="vla.chunk_size=8 but the checkpoint's chunks have 5 actions"):
        build_policy(meta, config_class("vla-flow-noise")(vla=VLAConfig(path=str(d), chunk_size=8)))
    with pytest.raises(ValueError, match="vla.variant='smolvla' but .* holds a 'pi0' policy"):
        build_policy(meta, config_class("vla-flow-noise")(vla=VLAConfig(path=str(d), variant="smolvla")))


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="lerobot is installed here: "
                    "test_vla_adapters.py checks the message with lerobot hidden")
def test_missing_extra_is_named_when_lerobot_is_absent(tmp_path, capsys):
    d = lerobot_dir(tmp_path)
    with pytest.raises(ImportError, match=r"VLA policies need LeRobot: pip install -e '\.\[vla\]'"):
        build_policy({"policy_kind": "vla", **META}, config_class("vla-flow-noise")(vla=VLAConfig(path=str(d))))
    with pytest.raises(SystemExit):  # the CLI's one line keeps the brackets (not read as markup)
        main(["train", "--algo", "vla-flow-noise", "--task", "so101-lift", "--control-mode", "joint_pos", "--obs-mode",
              "state+rgb", "--vla.path", str(d), "--out", str(tmp_path / "x"), "--num-envs", "2"])
    assert "pip install -e '.[vla]'" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--vla.path", "lerobot/smolvla_base"], "looks like a Hugging Face hub id"),
    ([], "vla.path is empty"),
    (["--vla.path", "{d}", "--vla.chunk-size", "9"], "vla.chunk_size=9 but the checkpoint's action expert was trained on"),
    (["--vla.path", "{d}", "--obs-mode", "state"], "obs_mode='state+rgb'"),
])
def test_cli_refuses_bad_vla_input_before_compute(tmp_path, capsys, args, message):
    d = lerobot_dir(tmp_path)
    args = [a.replace("{d}", str(d)) for a in args]
    with pytest.raises(SystemExit) as exc:
        main(["train", "--algo", "vla-flow-noise", "--task", "so101-lift", "--control-mode", "joint_pos",
              "--obs-mode", "state+rgb", "--out", str(tmp_path / "x"), *args])
    assert exc.value.code != 0
    assert message in capsys.readouterr().out.replace("\n", " ")
    assert not (tmp_path / "x").exists()


def _init_run(tmp_path, **vla):
    """An rlrobot vla-sft run's config.json (what --init reads) over a LeRobot-shaped directory."""
    from rlrobot.algorithms.vla import prepare_vla

    sft = config_class("vla-sft")(task="so101-lift", obs_mode="state+rgb", control_mode="joint_pos")
    sft.vla = VLAConfig(path=str(lerobot_dir(tmp_path, cameras=("front", "wrist"))), **vla)
    prepare_vla(sft)
    run = tmp_path / "sft_run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": sft.to_dict(), "policy_kind": "vla"}))
    (run / "model.safetensors").write_bytes(b"")  # a checkpoint directory; prepare reads only its config
    return run, sft.vla


def test_init_keeps_this_runs_noise_bounds_and_refuses_another_architecture(tmp_path):
    """--init adopts the SFT run's --vla section; run settings given on the RL run (noise bounds, execute steps)
    win, fields that shape the weights must agree (the noise bounds were silently replaced before)."""
    from rlrobot.algorithms.vla import prepare_vla

    init, init_vla = _init_run(tmp_path)

    def rl(**vla):
        run = config_class("vla-flow-noise")(task="so101-lift", obs_mode="state+rgb", control_mode="joint_pos",
                                             init=str(init))
        for name, value in vla.items():
            setattr(run.vla, name, value)
        prepare_vla(run)
        return run.vla

    plain = rl()
    assert (plain.noise_std_min, plain.noise_std_max, plain.path) == (0.08, 0.16, init_vla.path)
    tuned = rl(noise_std_min=0.02, noise_std_max=0.05, execute_steps=3, detach_critic=False)
    assert (tuned.noise_std_min, tuned.noise_std_max, tuned.execute_steps, tuned.detach_critic) == (0.02, 0.05, 3, False)
    assert tuned.chunk_size == init_vla.chunk_size == 5
    assert rl(path=init_vla.path).path == init_vla.path  # the same directory again is fine
    with pytest.raises(ValueError, match=r"vla.lora_rank=8 differs from the --init run's 0"):
        rl(lora_rank=8)
    with pytest.raises(ValueError, match=r"vla.value_hidden=\(64,\) differs from the --init run's"):
        rl(value_hidden=(64,))


def test_an_init_run_stands_in_for_the_path_at_validation():
    """`--init RUN` without --vla.path validates (prepare() adopts the run's path); without either it is refused."""
    from rlrobot.commands.train import parse_train_args

    base = ["--algo", "vla-flow-noise", "--task", "so101-reach", "--obs-mode", "state+rgb", "--control-mode", "joint_pos"]
    parse_train_args([*base, "--init", "runs/reach_sft"]).validate()
    with pytest.raises(ValueError, match="vla.path is empty"):
        parse_train_args(base).validate()
