"""The package-level import graph of rlrobot, for docs/concepts/architecture.md and tests/test_architecture.py.

grimp parses every source file (function-local imports included, ``if TYPE_CHECKING:`` imports left out); the
installed package maps ``rlrobot.tasks``, ``rlrobot.policies``, ``rlrobot.real_robot`` and ``rlrobot.configs`` to
top-level folders, so the graph is built over a temporary tree of links that puts them where the imports name them.

    python docs/hooks/import_graph.py            # print the Mermaid block
    python docs/hooks/import_graph.py --write    # rewrite it in docs/concepts/architecture.md
    python docs/hooks/import_graph.py --json     # the edges as JSON (what the tests read)

grimp finds the package through the import system, so the graph is built in a fresh interpreter: in a process that
has imported rlrobot already, it would find the installed package (without the mounted folders) instead.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "concepts" / "architecture.md"
MOUNTED = ("tasks", "policies", "real_robot", "configs")
BEGIN, END = "<!-- import-graph:begin -->", "<!-- import-graph:end -->"


def package_edges() -> dict[tuple[str, str], list[str]]:
    """{(importing package, imported package): [module -> module, ...]} between rlrobot's subpackages."""
    import grimp

    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "rlrobot"
        pkg.mkdir()
        for entry in (ROOT / "rlrobot").iterdir():
            (pkg / entry.name).symlink_to(entry)
        for name in MOUNTED:
            (pkg / name).symlink_to(ROOT / name)
        sys.path.insert(0, tmp)
        try:
            graph = grimp.build_graph("rlrobot", exclude_type_checking_imports=True, cache_dir=None)
        finally:
            sys.path.remove(tmp)
    edges: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = (".".join(m.split(".")[:2]) for m in (module, imported))
            if a != b and b != "rlrobot" and a != "rlrobot":
                edges[(a, b)].append(f"{module} -> {imported}")
    return dict(edges)


def cycles(edges) -> list[list[str]]:
    """The package sets that import each other in a circle (strongly connected components of more than one)."""
    graph = collections.defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    nodes = sorted({n for e in edges for n in e})
    reach = {n: _reachable(graph, n) for n in nodes}
    seen, out = set(), []
    for n in nodes:
        if n in seen:
            continue
        component = sorted(m for m in nodes if m in reach[n] and n in reach[m])
        seen.update(component)
        if len(component) > 1:
            out.append(component)
    return out


def _reachable(graph, start: str) -> set[str]:
    stack, seen = [start], {start}
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def mermaid(edges) -> str:
    short = {n: n.removeprefix("rlrobot.") for e in edges for n in e}
    lines = ["```mermaid", "graph TD"]
    lines += [f"  {short[a]} --> {short[b]}" for a, b in sorted(edges)]
    return "\n".join([*lines, "```"])


def write_page(block: str) -> None:
    text = PAGE.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    PAGE.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def package_edges_fresh() -> dict[tuple[str, str], list[str]]:
    """``package_edges`` computed in a new interpreter (see the module's docstring)."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--json"], capture_output=True, text=True, check=True).stdout
    return {tuple(pair.split(" -> ")): why for pair, why in json.loads(out).items()}


if __name__ == "__main__":
    edges = package_edges()
    if "--json" in sys.argv:
        import json

        print(json.dumps({f"{a} -> {b}": why for (a, b), why in edges.items()}))
    elif "--write" in sys.argv:
        write_page(mermaid(edges))
    else:
        print(mermaid(edges))
