"""The README as a user reads it: every python snippet runs as written, and every `rlrobot ...` command line in it
parses with today's flags (train lines also validate, without running). Lines that need hardware or files a fresh
clone does not have (a GPU, a run to resume) are only parsed."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tyro

README = Path(__file__).parent.parent / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def command_lines() -> list[list[str]]:
    lines = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;", line.split("  #")[0].split(" # ")[0]):
                if "rlrobot " not in part:
                    continue
                words = shlex.split(part.strip(), comments=True)
                if "rlrobot" in words and words[0] in ("rlrobot", "torchrun"):
                    words = words[words.index("rlrobot"):]
                    if len(words) > 1:
                        lines.append([_expand(w) for w in words[1:]])
    return lines


def _expand(word: str) -> str:
    return word.replace("$TOKEN", "0123456789abcdef0123456789abcdef").replace("[", "").replace("]", "")


@pytest.mark.parametrize("snippet", blocks("python"), ids=lambda s: s.strip().splitlines()[0][:60])
def test_python_snippets_run_as_written(snippet, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MUJOCO_GL": "egl"}
    p = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, f"README snippet failed:\n{snippet}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"


def test_there_are_commands_and_snippets_to_check():
    assert len(command_lines()) >= 20 and blocks("python")


@pytest.mark.parametrize("argv", command_lines(), ids=lambda a: " ".join(a)[:80])
def test_command_lines_parse(argv):
    from rlrobot.cli import COMMANDS, parse_train_args

    command, rest = argv[0], argv[1:]
    assert command in COMMANDS or command in ("--help", "-h", "--version"), command
    if command == "train":
        if "--help" in rest:
            return
        cfg = parse_train_args(rest)
        if cfg.resume or "cuda" in cfg.device or cfg.backend in ("mjwarp", "isaaclab") or cfg.task.startswith(
                ("maniskill:", "isaaclab:")):
            return  # needs a run to resume, a GPU or a simulator that is an optional extra: parsed only
        cfg.validate()
    elif command in ("eval", "collect", "bench", "serve", "deploy"):
        if "--help" in rest:
            return
        from rlrobot.bench.mujoco_bench import BenchArgs
        from rlrobot.cli import EvalArgs
        from rlrobot.commands.collect import CollectArgs
        from rlrobot.real_robot.deploy import DeployArgs
        from rlrobot.real_robot.server import ServeArgs

        kind = {"eval": EvalArgs, "collect": CollectArgs, "bench": BenchArgs, "serve": ServeArgs, "deploy": DeployArgs}
        tyro.cli(kind[command], args=rest)
