"""A LeRobot pretrained directory (config.json with its policy type, model.safetensors) given where an rlrobot run is
expected is refused in one line that says what it is and how to start a run from it, before any weight loads."""

import json

import pytest

from rlrobot.checkpoints import CheckpointError, load_checkpoint, load_config
from rlrobot.cli import main


@pytest.fixture
def lerobot_dir(tmp_path):
    d = tmp_path / "smolvla_base"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "type": "smolvla", "chunk_size": 50,
        "input_features": {"observation.state": {"type": "STATE", "shape": [6]},
                           "observation.images.camera1": {"type": "VISUAL", "shape": [3, 256, 256]}},
        "output_features": {"action": {"type": "ACTION", "shape": [6]}}}))
    (d / "model.safetensors").write_bytes(b"not read: the refusal comes before any weight loads")
    return d


def test_loading_it_names_the_directory_and_the_command_that_uses_it(lerobot_dir):
    for load in (load_checkpoint, load_config):
        with pytest.raises(CheckpointError) as e:
            load(lerobot_dir)
        text = str(e.value)
        assert "\n" not in text and "LeRobot pretrained directory" in text and "'smolvla'" in text
        assert f"rlrobot train --algo vla-sft --vla.path {lerobot_dir}" in text


@pytest.mark.parametrize("command", [["eval"], ["serve", "--insecure"], ["deploy", "--robot", "twin"]])
def test_eval_serve_and_deploy_refuse_it_in_one_line(command, lerobot_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command, "--checkpoint", str(lerobot_dir)])
    assert e.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "LeRobot pretrained directory (policy type 'smolvla')" in lines[0] and "--vla.path" in lines[0]
