"""``rlrobot train --help``: the flags a run usually sets, grouped (run, environment, the algorithm's own section,
evaluation and logging, compute), one line each with the preset's value; the other sections by name and count.
``--help-all`` prints tyro's full help (every flag, its type and default)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import cache
from typing import Any, Literal, get_args, get_origin

# presentation only: the order in which a user meets the common fields
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run", ("task", "algo", "num_envs", "total_steps", "seed", "out", "resume", "init", "dataset")),
    ("environment", ("obs_mode", "reward_mode", "control_mode", "max_episode_steps", "servo_limits", "instruction",
                     "setup", "backend")),
    ("evaluation, checkpoints and logging", ("eval_every", "eval_episodes", "eval_envs", "video", "checkpoint_every",
                                             "logger")),
    ("compute", ("device", "distributed", "num_threads", "torch_threads", "update_threads")),
)


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass and its bases (what tyro shows as help), by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # built-ins, classes made at run time
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _flag(prefix: str, name: str, annotation: Any) -> str:
    flag = f"--{prefix}{name.replace('_', '-')}"
    if annotation is bool:
        return f"{flag} / --{prefix}no-{name.replace('_', '-')}"
    return f"{flag} {_metavar(annotation)}"


def _metavar(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _metavar(get_args(annotation)[0])
    if origin is Literal:
        return "{" + ",".join(map(str, get_args(annotation))) + "}"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return "|".join(_metavar(a) for a in get_args(annotation) if a is not type(None)) + "|None"
    if origin is tuple:
        return f"{_metavar(get_args(annotation)[0])}..." if get_args(annotation) else "..."
    return {int: "INT", float: "FLOAT", str: "STR"}.get(annotation, getattr(annotation, "__name__", "VALUE").upper())


def _shown(value: Any) -> str:
    return "''" if value == "" else str(value)


def _lines(obj: Any, names: list[str], prefix: str = "") -> list[str]:
    cls = type(obj)
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    out = []
    for name in names:
        flag = _flag(prefix, name, hints[name])
        doc = docs.get(name, "")
        text = f"{doc} [{_shown(getattr(obj, name))}]" if doc else f"[{_shown(getattr(obj, name))}]"
        out += [f"  {flag}", *textwrap.wrap(text, 116, initial_indent="      ", subsequent_indent="      ")]
    return out


def short_help(cfg: Any) -> str:
    """The grouped help of a run config (``cfg``: the preset of the command line's --task / --algo)."""
    spec = cfg.spec
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    sections = [n for n in fields if dataclasses.is_dataclass(getattr(cfg, n))]
    flat = [n for n in fields if n not in sections]
    out = [f"usage: rlrobot train --algo {spec.name} [--task TASK] [FLAGS]", "",
           f"Train with {spec.name}: {spec.summary}.",
           f"Defaults in [brackets] are the preset of --task {cfg.task} --algo {spec.name} (rlrobot.configs).", ""]
    shown: set[str] = set()
    for title, names in GROUPS:
        present = [n for n in names if n in flat]
        if present:
            out += [f"{title}:", *_lines(cfg, present), ""]
            shown.update(present)
        if title == "environment" and spec.config_field in sections:  # the algorithm's own section next
            section = getattr(cfg, spec.config_field)
            names_ = [f.name for f in dataclasses.fields(section)]
            out += [f"{spec.name} (--{spec.config_field.replace('_', '-')}.*):",
                    *_lines(section, names_, f"{spec.config_field.replace('_', '-')}."), ""]
    rest = [n for n in flat if n not in shown]
    others = [f"--{n.replace('_', '-')}.* ({len(dataclasses.fields(getattr(cfg, n)))} flags)"
              for n in sections if n != spec.config_field]
    if rest or others:
        out += [f"more (rlrobot train --algo {spec.name} --help-all describes every flag):",
                *textwrap.wrap(", ".join([*(f"--{n.replace('_', '-')}" for n in rest), *others]), 116,
                               initial_indent="  ", subsequent_indent="  "), ""]
    return "\n".join(out)
