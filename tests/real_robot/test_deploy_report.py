"""``rlrobot deploy``'s console: a line per episode, a table and a readable summary that explains holds; safety
interventions counted, not printed per step (``--verbose`` prints them); no raw JSON (``--json-out`` has it)."""

import json
import logging

import pytest

from rlrobot.cli import main


def deploy(capsys, tmp_path, checkpoint, *extra):
    out = tmp_path / "report.json"
    main(["deploy", "--robot", "twin", "--checkpoint", str(checkpoint), "--episodes", "3", "--executor.no-realtime",
          "--json-out", str(out), *extra])
    captured = capsys.readouterr()
    return captured.out + captured.err, json.loads(out.read_text())


def test_table_and_summary_instead_of_per_step_lines(expert_checkpoint, tmp_path, capsys, caplog):
    # slow limits: the supervisor clamps on most steps, which used to print one warning line each
    text, report = deploy(capsys, tmp_path, expert_checkpoint, "--safety.max-joint-velocity", "0.5")
    lines = text.splitlines()
    assert "safety intervention" not in text and not any(line.lstrip().startswith("{") for line in lines)
    assert not [r for r in caplog.records if "safety intervention" in r.getMessage() and r.levelno >= logging.INFO]
    assert len(lines) < 30, text
    assert [line.split(":")[0] for line in lines if line.startswith("episode ") and "/3" in line] == \
        ["episode 1/3", "episode 2/3", "episode 3/3"]
    header = next(line for line in lines if "episode" in line and "clamped" in line and "ended" in line)
    assert all(column in header for column in ("steps", "success", "return", "ended"))
    # holds are explained only when there were some
    assert ("a hold is a control tick on which the arm kept still" in text) == (report["holds"] > 0)
    assert report["holds"] > 0 or "holds: none" in text
    clamped, changed = report["clamped_steps"], report["changed"]
    acting = report["steps"] - report["holds"]
    assert clamped > 30 and f"the supervisor moved {changed['steps']} of {acting} commands" in text
    assert changed["steps"] > 30 and 0 < changed["mean_rad"] <= changed["max_rad"]
    assert f"{changed['max_rad']:.3f} rad" in text  # by how much, not only how often
    assert "velocity" in report["interventions"] and "--verbose" in text
    # the full JSON keeps every number, per episode too
    assert len(report["per_episode"]) == 3 and sum(e["clamped_steps"] for e in report["per_episode"]) == clamped
    assert report["episodes"] == 3 and report["mean_return"] is not None and report["limits"]["max_joint_velocity"] == 0.5


def test_verbose_logs_each_intervention(expert_checkpoint, tmp_path, capsys, caplog):
    text, report = deploy(capsys, tmp_path, expert_checkpoint, "--safety.max-joint-velocity", "0.5", "--verbose")
    logged = [r for r in caplog.records if r.getMessage().startswith("safety intervention")]
    assert len(logged) == sum(report["interventions"].values())
    assert logging.getLogger("rlrobot.safety").level == logging.NOTSET  # restored after the run


@pytest.mark.parametrize("flag", ["--help"])
def test_help_explains_holds_and_the_default_limits(flag, capsys):
    with pytest.raises(SystemExit):
        main(["deploy", flag])
    text = " ".join(capsys.readouterr().out.split())
    assert "STS3215" in text and "4.7" in text and "39" in text
    assert "--verbose" in text and "--json-out" in text


def test_ctrl_c_holds_disables_and_reports(expert_checkpoint, tmp_path, capsys, monkeypatch):
    """Ctrl-C in the second episode: the arm is held and disabled, the first episode is reported, exit code 130."""
    from rlrobot.real_robot.drivers.twin import TwinRobot
    from rlrobot.real_robot.executor import ChunkExecutor

    loop, calls, twins = ChunkExecutor._loop, [], []

    def interrupted_loop(self, *args):
        calls.append(1)
        twins.append(self.robot)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return loop(self, *args)

    monkeypatch.setattr(ChunkExecutor, "_loop", interrupted_loop)
    with pytest.raises(SystemExit) as exit_info:
        main(["deploy", "--robot", "twin", "--checkpoint", str(expert_checkpoint), "--episodes", "3",
              "--executor.no-realtime"])
    assert exit_info.value.code == 130
    text = capsys.readouterr().out
    assert "episode 1/3" in text and "episode 2/3" not in text and "INTERRUPTED (Ctrl-C)" in text
    assert "Traceback" not in text and isinstance(twins[-1], TwinRobot)
    assert [kind for _, kind, _ in list(twins[-1].commands)[-2:]] == ["hold", "disable"]


def test_a_robot_that_cannot_connect_is_a_one_line_error(expert_checkpoint, capsys, monkeypatch):
    from rlrobot.real_robot import deploy as deploy_module

    class Unplugged:
        def connect(self):
            raise OSError(2, "could not open port /dev/ttyACM9")

    monkeypatch.setattr(deploy_module, "make_robot", lambda *a, **k: Unplugged())
    with pytest.raises(SystemExit) as exit_info:
        main(["deploy", "--robot", "lerobot", "--lerobot-port", "/dev/ttyACM9", "--checkpoint", str(expert_checkpoint),
              "--target", "0.18", "0.05", "0.08"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to the lerobot robot at /dev/ttyACM9" in lines[0]
