"""The package floors (docs/concepts/architecture.md): no import circle between packages, policies below the learning
code, and the docs' picture of the graph generated from the source as it is."""

import importlib.util
import sys
from pathlib import Path

import pytest

HOOKS = Path(__file__).resolve().parents[1] / "docs" / "hooks"
sys.path.insert(0, str(HOOKS))
import import_graph  # noqa: E402  (docs/hooks is not a package)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("grimp") is None, reason="grimp is not installed (the dev extra)")


@pytest.fixture(scope="module")
def edges():
    return import_graph.package_edges_fresh()


def test_no_two_packages_import_each_other_in_a_circle(edges):
    assert import_graph.cycles(edges) == [], {pair: why[:3] for pair, why in edges.items()
                                              if (pair[1], pair[0]) in edges}


def test_policies_never_import_the_algorithms_or_the_runners(edges):
    assert not {pair: why for pair, why in edges.items()
                if pair[0] == "rlrobot.policies" and pair[1] in ("rlrobot.algorithms", "rlrobot.runners")}


def test_the_cycle_finder_sees_a_circle_through_three_packages():
    assert import_graph.cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}) == [["a", "b", "c"]]


def test_the_docs_picture_is_the_graph_of_the_source(edges):
    page = import_graph.PAGE.read_text()
    assert import_graph.mermaid(edges) in page, "stale: run python docs/hooks/import_graph.py --write"
