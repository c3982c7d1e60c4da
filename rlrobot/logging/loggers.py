"""Metric sinks: a metrics.jsonl that is always written (plots read it), plus tensorboard or wandb."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LOGGERS = ("tensorboard", "wandb", "none")


class Logger:
    def __init__(self, out_dir: Path, kind: str, config: dict[str, Any], project: str = "rlrobot",
                 wandb_mode: str = "offline", run_name: str | None = None):
        if kind not in LOGGERS:
            raise ValueError(f"logger={kind!r} is not one of {LOGGERS}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.kind = kind
        self._jsonl = open(self.out_dir / "metrics.jsonl", "a")
        self._tb = None
        self._wandb = None
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))
        elif kind == "wandb":
            try:
                import wandb
            except ImportError as e:
                raise ImportError("logger='wandb' needs the wandb package: pip install 'rlrobot[wandb]'") from e
            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(project=project, name=run_name, config=config, dir=str(self.out_dir),
                                     mode=wandb_mode, resume="allow", reinit=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._jsonl.write(json.dumps({"env_steps": step, **metrics}) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def log_video(self, path: Path, step: int) -> None:
        if self._wandb is not None:
            import wandb

            self._wandb.log({"eval/video": wandb.Video(str(path))}, step=step)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
