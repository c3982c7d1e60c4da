"""A LeRobot VLA that reads cameras (a tiny SmolVLA with the real structure, built offline with LeRobot's classes)
through ``rlrobot deploy --robot twin``: a run fine-tuned from the pretrained directory acts on every tick with the
twin's camera frames, and the pretrained directory itself is refused in one line. Needs the ``vla`` extra (Python
>= 3.12, lerobot 0.6.1): ``.ci/run`` runs this file in the LeRobot venv."""

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("lerobot", reason="lerobot is not installed (the vla extra, Python >= 3.12; .ci/run runs this file)")

from rlrobot.cli import main  # noqa: E402
from rlrobot.policies.vla.tiny import main as tiny_main  # noqa: E402


@pytest.mark.slow
def test_a_vla_that_reads_cameras_deploys_on_the_twin(tmp_path, capsys):
    pretrained, run, report = tmp_path / "smolvla", tmp_path / "run", tmp_path / "report.json"
    tiny_main(["--variant", "smolvla", "--task", "so101-reach", "--out", str(pretrained), "--chunk-size", "5"])
    main(["train", "--algo", "vla-flow-noise", "--task", "so101-reach", "--obs-mode", "state+rgb", "--control-mode",
          "joint_pos", "--vla.path", str(pretrained), "--out", str(run), "--num-envs", "2", "--max-episode-steps", "10",
          "--flow-ppo.rollout-chunks", "2", "--flow-ppo.num-minibatches", "2", "--flow-ppo.num-epochs", "1",
          "--flow-ppo.critic-warmup-iterations", "0", "--total-steps", "20", "--logger", "none", "--no-video",
          "--eval-episodes", "2", "--eval-envs", "2", "--eval-every", "0", "--num-threads", "1"])
    meta = json.loads((run / "config.json").read_text())
    assert {"image_front", "image_wrist"} <= set(meta["train"]["vla"]["obs_keys"])
    capsys.readouterr()
    main(["deploy", "--robot", "twin", "--checkpoint", str(run), "--episodes", "1", "--max-steps", "15",
          "--executor.no-realtime", "--json-out", str(report)])
    summary = json.loads(report.read_text())
    assert summary["steps"] == 15 and summary["holds"] == 0 and summary["inference_failures"] == 0
    assert summary["latched"] is None and summary["first_failure"] is None
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # the pretrained directory is not a run
        main(["deploy", "--robot", "twin", "--checkpoint", str(pretrained)])
    assert e.value.code == 2 and "LeRobot pretrained directory" in capsys.readouterr().out
