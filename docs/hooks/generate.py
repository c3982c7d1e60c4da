"""MkDocs hook: the pages that must not drift from the code are written at build time from the code itself.

Directives (an HTML comment on a line of its own, replaced by generated Markdown):

- ``<!-- docs: cli-commands -->``: every ``rlrobot`` command (``rlrobot.cli.COMMANDS``) with its ``--help``;
- ``<!-- docs: cli-train -->``: ``rlrobot train --algo X --help`` for every registered algorithm;
- ``<!-- docs: algorithms -->``: the registered algorithms, their policy kind and page;
- ``<!-- docs: algo-header ALGO -->``: an algorithm's --algo, policy kind, config class, runner and options link;
- ``<!-- docs: presets ALGO -->``: the presets of an algorithm and the settings each changes from its defaults;
- ``<!-- docs: tasks ID ID ... -->``: observation / action spaces, modes and episode length of registered tasks;
- ``<!-- docs: layout -->``: the packages and modules of the source tree, each with its docstring's first sentence.

The results blocks (``<!-- generated: ... -->``) are not built here: ``rlrobot results table`` writes them into the
pages, and a test checks them. ``results/*.png`` (figures of the dated experiments pages) are served as
``assets/results/*.png`` and the scripts of ``examples/`` as ``examples/*.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pkgutil
import re
import shlex
from functools import cache
from pathlib import Path

from mkdocs.structure.files import File

DIRECTIVE = re.compile(r"^<!-- docs: (?P<kind>[a-z-]+)(?P<args>(?: [^ \n]+)*) -->$", re.M)
ROOT = Path(__file__).resolve().parents[2]
VLA_PAGE = {"vla-sft": "vla", "vla-flow-noise": "vla", "vla-flow-sde": "vla"}


def _help(call) -> str:
    """What a tyro / argparse entry point prints for --help, captured in this process (no subprocess per page)."""
    os.environ["COLUMNS"] = "96"  # the width of a code block on the page; the same page on every machine
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            call()
        except SystemExit:
            pass
    return re.sub(r"[ \t]+$", "", buf.getvalue(), flags=re.M).strip("\n")


def _fence(text: str) -> str:
    return f"```text\n{text}\n```"


@cache
def cli_commands() -> str:
    from rlrobot.cli import main
    from rlrobot.commands import COMMANDS

    out = ["Generated at build time from `rlrobot <command> --help`: what your installed version prints.", ""]
    for name, command in COMMANDS.items():
        what = command.help
        out += [f"## `rlrobot {name}`", "", what[0].upper() + what[1:] + ".", ""]
        if name == "train":
            out += ["Each algorithm adds its own options: [`rlrobot train --algo X --help`](cli-train.md).", ""]
        out += [_fence(_help(lambda n=name: main([n, "--help"]))), ""]
    return "\n".join(out)


@cache
def cli_train() -> str:
    from rlrobot.algorithms.registry import algorithm_names, algorithm_spec
    from rlrobot.commands.train import parse_train_args

    out = ["Generated at build time from `rlrobot train --algo X --help-all` for every registered algorithm (`--help` "
           "shows the common flags, grouped, and names the rest). The defaults "
           "shown are those of the algorithm's preset for the default task (`so101-reach`); `--task T` picks the preset "
           "of T (see [presets](../concepts/presets.md)).", ""]
    for name in algorithm_names():
        spec = algorithm_spec(name)
        out += [f"## `--algo {name}` {{ #{name} }}", "", f"{spec.summary}. Algorithm page: "
                f"[{name}](../algorithms/{VLA_PAGE.get(name, name)}.md).", ""]
        out += [_fence(_help(lambda n=name: parse_train_args(["--algo", n, "--help"]))), ""]
    return "\n".join(out)


@cache
def algorithms_table() -> str:
    from rlrobot.algorithms.registry import describe_algorithms

    rows = ["| `--algo` | policy kind | what it does |", "|---|---|---|"]
    for row in describe_algorithms():
        page = VLA_PAGE.get(row["algo"], row["algo"])
        rows.append(f"| [`{row['algo']}`]({page}.md) | {row['policy_kind']} | {row['summary']} |")
    return "\n".join(rows)


def algo_header(algo: str) -> str:
    """The line under an algorithm page's title: its --algo, policy kind, config class, runner and options, from the
    registry (so a module that moves does not leave a stale path behind)."""
    from rlrobot.algorithms.registry import algorithm_spec

    spec = algorithm_spec(algo)
    config = f"{spec.config.__module__}.{spec.config.__qualname__}"
    return (f"`--algo {algo}` · policy kind `{spec.policy_kind}` · config `{config}` · runner `{spec.runner}` · "
            f"[all options](../reference/cli-train.md#{algo})")


def _flatten(obj, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_flatten(value, key + "."))
        else:
            out[key] = value
    return out


def _flag(key: str, value: object) -> str:
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return name if value else f"--{'.'.join(key.split('.')[:-1] + ['no-' + key.split('.')[-1]]).replace('_', '-')}"
    if isinstance(value, tuple | list):
        return f"{name} {' '.join(shlex.quote(str(v)) for v in value)}" if value else f"{name} (empty)"
    if value is None:
        return f"{name} None"
    return f"{name} {shlex.quote(str(value))}"


@cache
def _presets() -> list[tuple[str, str, str]]:
    """(module, algo, task) of every preset module in rlrobot.configs."""
    import importlib

    import rlrobot.configs as configs

    found = []
    for mod in pkgutil.iter_modules(configs.__path__):
        cfg = getattr(importlib.import_module(f"rlrobot.configs.{mod.name}"), "CONFIG", None)
        if cfg is not None:
            found.append((mod.name, cfg.algo, cfg.task))
    return found


def presets_table(algo: str) -> str:
    from rlrobot.config import train_config
    from rlrobot.configs import preset

    rows = []
    for module, preset_algo, task in _presets():
        if preset_algo != algo:
            continue
        cfg, default = _flatten(preset(task, algo)), _flatten(train_config(algo, task=task))
        changed = [_flag(k, v) for k, v in cfg.items() if k not in ("task", "algo") and default.get(k) != v]
        flags = " ".join(changed) if changed else "(the algorithm's defaults)"
        rows.append(f"| `{task}` | `configs/{module}.py` | `{flags}` |")
    if not rows:
        return (f"No preset ships for `{algo}`: every task gets the algorithm's defaults "
                f"(`rlrobot train --algo {algo} --help`).")
    head = ["Generated at build time from `rlrobot.configs`: each preset as the flags it sets on top of the algorithm's "
            "defaults. `rlrobot train --algo ALGO --task TASK` starts from the preset; any flag overrides it.", "",
            "| task | preset | settings (as flags) |", "|---|---|---|"]
    return "\n".join(head + rows)


def tasks_table(task_ids: list[str]) -> str:
    from rlrobot.tasks.registry import describe_task, task_spec

    rows = ["| task | observation (state mode) | action | episode steps | obs modes | control modes | reward modes |",
            "|---|---|---|---|---|---|---|"]
    for task in task_ids:
        d, spec = describe_task(task), task_spec(task)
        obs = "<br>".join(f"`{k}` {list(v)}" for k, v in d["observation"].items())
        rows.append(f"| `{task}` | {obs} | {list(d['action'])} | {d['max_episode_steps']} | {', '.join(spec.obs_modes)} | "
                    f"{', '.join(spec.control_modes)} | {', '.join(spec.reward_modes)} |")
    return "\n".join(["Generated at build time from the task registry (`rlrobot list-tasks`).", "", *rows])


def _first_sentence(path: Path) -> str:
    import ast

    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except SyntaxError:
        return ""
    text = " ".join(doc.split())
    return text.split(". ")[0].rstrip(".") + "." if text else ""


@cache
def layout() -> str:
    """Every package and module of the installed tree, with the first sentence of its docstring (read, not imported)."""
    import rlrobot

    roots = {"rlrobot": Path(rlrobot.__file__).parent}
    for name in ("tasks", "policies", "real_robot", "configs"):
        try:
            mod = __import__(f"rlrobot.{name}", fromlist=["__name__"])
            roots[f"rlrobot.{name}"] = Path(mod.__file__).parent
        except ImportError:
            continue
    out = ["Generated at build time from the source tree: each package and module with the first sentence of its docstring.", ""]
    for pkg, root in roots.items():
        for init in sorted(root.rglob("__init__.py")):
            folder = init.parent
            rel = folder.relative_to(root).as_posix()
            name = pkg if rel == "." else f"{pkg}.{rel.replace('/', '.')}"
            if pkg == "rlrobot" and any(name.startswith(f"rlrobot.{n}") for n in ("tasks", "policies", "real_robot", "configs")):
                continue
            if "__pycache__" in rel or (pkg == "rlrobot.configs" and rel != "."):
                continue
            out += [f"## `{name}`", "", _first_sentence(init) or "", ""]
            if pkg == "rlrobot.configs":
                out += ["One preset module per algorithm x task (`<algo>_<task>.py`); see [presets](../concepts/presets.md).", ""]
                continue
            rows = [f"| `{m.stem}` | {_first_sentence(m)} |" for m in sorted(folder.glob("*.py")) if m.name != "__init__.py"]
            if rows:
                out += ["| module | what |", "|---|---|", *rows, ""]
    return "\n".join(out)


def render(kind: str, args: list[str]) -> str:
    if kind == "cli-commands":
        return cli_commands()
    if kind == "cli-train":
        return cli_train()
    if kind == "algorithms":
        return algorithms_table()
    if kind == "presets":
        return presets_table(args[0])
    if kind == "algo-header":
        return algo_header(args[0])
    if kind == "tasks":
        return tasks_table(args)
    if kind == "layout":
        return layout()
    raise ValueError(f"unknown docs directive {kind!r}")


def on_page_markdown(markdown: str, page, config, files) -> str:
    return DIRECTIVE.sub(lambda m: render(m.group("kind"), m.group("args").split()), markdown)


MAPPED = {"tasks": "tasks", "policies": "policies", "real_robot": "real_robot", "configs": "configs"}
"""the top-level folders that install as rlrobot.<name> (pyproject's package-dir)"""


def api_tree() -> None:
    """The API pages read the source statically (mkdocstrings / griffe). The folders that install under the rlrobot
    namespace live at the top of the repository, so build a tree of links that has them where Python sees them:
    build/api-src/rlrobot/{<rlrobot's own files>, tasks, policies, real_robot, configs}. Built when MkDocs loads this
    hook, before mkdocstrings looks up its search paths (it keeps only paths that exist then)."""
    import shutil

    tree = ROOT / "build" / "api-src" / "rlrobot"
    shutil.rmtree(tree.parent, ignore_errors=True)
    tree.mkdir(parents=True)
    for child in (ROOT / "rlrobot").iterdir():
        if child.name == "__init__.py":  # a copy: the package's folder is where its __init__ is, links resolved
            shutil.copy(child, tree / child.name)
        elif child.name != "__pycache__":
            (tree / child.name).symlink_to(child)
    for name, folder in MAPPED.items():
        (tree / name).symlink_to(ROOT / folder)


api_tree()


def on_files(files, config):
    """Serve the figures of results/ (learning curves, comparisons) that the experiments pages show, and the example
    scripts of examples/ that the pages link to."""
    for png in sorted((ROOT / "results").glob("*.png")):
        files.append(File.generated(config, f"assets/results/{png.name}", abs_src_path=str(png)))
    for script in sorted((ROOT / "examples").glob("*.py")):
        files.append(File.generated(config, f"examples/{script.name}", abs_src_path=str(script)))
    return files
