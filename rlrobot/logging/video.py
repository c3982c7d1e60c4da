"""Write evaluation videos as mp4 (imageio-ffmpeg ships its own ffmpeg) or GIF."""

from __future__ import annotations

from pathlib import Path

import imageio.v2 as imageio
import numpy as np


def write_video(frames: list[np.ndarray], path: Path, fps: int = 25) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gif":
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    return path
