"""``rlrobot export``: the refusals that come before any model is built (no LeRobot needed). The export itself is tested
in the LeRobot venv: tests/policies/vla/test_portable_runs.py."""

import json

import pytest

from rlrobot.cli import main
from rlrobot.commands import COMMANDS


def _run(tmp_path, policy_kind: str, algo: str):
    ckpt = tmp_path / "run" / "checkpoints" / "iter_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps({"train": {"algo": algo, "config_version": 3}, "policy_kind": policy_kind}))
    (ckpt / "model.safetensors").write_bytes(b"not read: the refusal comes before any weight loads")
    (ckpt.parent / "latest").write_text(ckpt.name)
    return tmp_path / "run"


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_export_is_a_command():
    assert "export" in COMMANDS


def test_a_run_that_is_not_a_vla_is_refused_in_one_line_naming_what_can_be_exported(tmp_path, capsys):
    run = _run(tmp_path, "actor-critic", "ppo")
    with pytest.raises(SystemExit) as e:
        main(["export", str(run), "--format", "lerobot", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    line = _one_line_error(capsys)
    assert "'actor-critic'" in line and "algo='ppo'" in line and "'vla'" in line and "vla-sft" in line
    assert not (tmp_path / "out").exists()


def test_out_is_required_and_must_be_new_or_empty(tmp_path, capsys):
    run = _run(tmp_path, "vla", "vla-sft")
    with pytest.raises(SystemExit) as e:
        main(["export", str(run)])
    assert e.value.code == 2 and "--out DIR" in _one_line_error(capsys)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "model.safetensors").write_text("someone's")
    with pytest.raises(SystemExit) as e:
        main(["export", str(run), "--out", str(taken)])
    assert e.value.code == 2 and "not an empty directory" in _one_line_error(capsys)
    assert (taken / "model.safetensors").read_text() == "someone's"


def test_an_unknown_format_and_a_missing_run_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["export", str(tmp_path), "--format", "onnx", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and "no checkpoint" in _one_line_error(capsys)
