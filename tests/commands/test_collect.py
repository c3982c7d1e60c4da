import json

from rlrobot.commands.collect import CollectArgs, collect_demonstrations


def test_collect_keeps_each_envs_first_episodes_and_says_why_more_ran(tmp_path, capsys):
    summary = collect_demonstrations(CollectArgs(task="so101-reach", episodes=4, num_envs=8, out=str(tmp_path / "d")))
    out = " ".join(capsys.readouterr().out.split())
    meta = json.loads((tmp_path / "d" / "meta" / "rlrobot.json").read_text())
    assert summary["episodes"] == 4 and meta["episodes_attempted"] == 8  # every env ends its first episode together
    assert "kept each env's first 0-1, not the first to finish (8 ran on 8 envs at once, 4 dropped" in out
