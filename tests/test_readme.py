"""The README as a newcomer meets it: short, its test command is the one CI runs, and every page it links exists.
Its code blocks and command lines are checked with every documentation page's in tests/docs/test_docs.py."""

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def test_readme_is_short_and_links_the_guides():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\(((?:docs|examples)/[^)#]+)", text):
        assert (ROOT / target).is_file(), f"README links {target}, which does not exist"
    for guide in ("flow-policies", "offline-rl", "real-robot", "vla", "warm-starts", "reward-models", "extending"):
        assert f"(docs/guides/{guide}.md)" in text


def test_the_readme_test_command_is_what_ci_runs_verbatim():
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README.read_text())
    assert len(commands) == 2, "the README's two commands: set-up + train, set-up + the tests"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci, "the README's test command must appear verbatim in .ci/run"
    assert "mkdocs build --strict" in ci, ".ci/run builds the documentation site"
