import glob

import pytest

from rlrobot.cli import main


def test_maniskill_without_a_vulkan_driver_is_one_line_naming_what_to_install(capsys):
    pytest.importorskip("mani_skill", reason="ManiSkill3 is not installed (pip install 'rlrobot[maniskill]')")
    if glob.glob("/usr/share/vulkan/icd.d/*.json") + glob.glob("/etc/vulkan/icd.d/*.json"):
        pytest.skip("this machine has a Vulkan driver: the refusal cannot happen here")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--task", "maniskill:PushCube-v1", "--total-steps", "1000", "--logger", "none", "--no-video"])
    out = capsys.readouterr().out
    assert exit_.value.code == 2 and "Traceback" not in out
    assert out.startswith("error: maniskill:PushCube-v1: SAPIEN found no Vulkan device") and "mesa-vulkan-drivers" in out
