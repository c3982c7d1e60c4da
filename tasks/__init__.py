"""Tasks that ship with rlrobot (native MuJoCo) and adapters to other simulators."""

import os

# Headless rendering by default: EGL works without a display (set MUJOCO_GL yourself to override).
os.environ.setdefault("MUJOCO_GL", "egl")

# native task modules register their tasks with rlrobot.tasks.registry on import
from . import locomotion, so101, so101_suite, so101_variants  # noqa: E402, F401
