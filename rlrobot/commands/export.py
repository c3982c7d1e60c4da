"""``rlrobot export RUN --format lerobot --out DIR``: a run's policy in another library's format. ``lerobot``: a VLA run
(``--algo vla-sft / vla-flow-noise / vla-flow-sde``) as a LeRobot pretrained directory (config.json, model.safetensors
with any LoRA merged, policy_preprocessor / postprocessor files with the run's statistics) that LeRobot's
``from_pretrained`` and ``make_pre_post_processors`` load, e.g. for ``lerobot-record --policy.path DIR``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro
from rich.console import Console

console = Console(soft_wrap=True)

FORMATS = {"lerobot": ("vla", "a LeRobot pretrained directory")}
"""format -> (the policy kind it exports, what it writes)"""


@dataclass
class ExportArgs:
    run: tyro.conf.Positional[str]
    """a run directory or checkpoint directory (its latest checkpoint is used)"""
    out: str = ""
    """the directory to write (new or empty)"""
    format: Literal["lerobot"] = "lerobot"
    """lerobot: a LeRobot pretrained directory (VLA runs: pi0 / pi0.5 / SmolVLA)"""
    lora_only: bool = False
    """lerobot: only the run's LoRA adapters (and the projections trained in full) as a PEFT adapter over its base
    checkpoint, which must stay where it is (LeRobot loads it with use_peft); default: the full weights, LoRA merged"""


def check_exportable(args: ExportArgs) -> dict:
    """The run's config.json, after the refusals that need no model: bad format, no --out, a policy kind the format
    does not hold."""
    from rlrobot.checkpoints import load_config
    from rlrobot.policies.registry import policy_kind_of

    if args.format not in FORMATS:
        raise ValueError(f"format={args.format!r} is not one of {sorted(FORMATS)}")
    if not args.out:
        raise ValueError("out is empty: pass --out DIR, the directory to write")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"out={args.out!r} exists and is not an empty directory; give a new one")
    saved = load_config(args.run)
    kind, (exported, what) = policy_kind_of(saved), FORMATS[args.format]
    if kind != exported:
        raise ValueError(f"run={args.run!r} holds a {kind!r} policy (algo={saved.get('train', {}).get('algo')!r}); "
                         f"--format {args.format} exports {exported!r} policies only (runs of --algo vla-sft, "
                         f"vla-flow-noise, vla-flow-sde) as {what}")
    return saved


def run_export(args: ExportArgs) -> Path:
    check_exportable(args)
    from rlrobot.policies.registry import policy_from_checkpoint
    from rlrobot.policies.vla.portable import export_lerobot

    policy, saved, ckpt = policy_from_checkpoint(args.run)
    out = export_lerobot(policy.eval(), saved["train"]["vla"]["path"], args.out, lora_only=args.lora_only)
    console.print(f"exported {ckpt} as a LeRobot pretrained directory: {out} (load it with LeRobot's from_pretrained; "
                  f"lerobot-record --policy.path {out})")
    return out
