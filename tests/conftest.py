import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402

torch.set_num_threads(1)


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_between_modules():
    """Collect the previous modules' garbage before a module starts. A MuJoCo renderer left to the garbage collector
    closes its EGL context in __del__, which fails once the context is gone; when the cyclic collector happens to run
    that finalizer in the middle of ast.parse (tyro reads docstrings with it), CPython 3.11 raises 'SystemError: AST
    constructor recursion depth mismatch' in an unrelated test."""
    gc.collect()
    yield
