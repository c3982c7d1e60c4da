"""Image encoders of the MLP actor-critic (what PPO trains from pixels): a small CNN per camera (or one
shared by all cameras) whose features are concatenated with the normalised joint readings.

Frames stay uint8 ``[B, 3, H, W]`` (what the envs and rollout storage hold) until the encoder, on the policy's device;
the CNN scales them to [-0.5, 0.5]. Two architectures, both without downloaded weights:

* ``nature``: the DQN "Nature" CNN (Mnih et al. 2015; CleanRL's and SB3's ``NatureCNN``): 8x8 stride 4 (32), 4x4
  stride 2 (64), 3x3 stride 1 (64), then a linear layer. Cheap: what a CPU can afford per env step;
* ``impala``: the IMPALA ResNet (Espeholt et al. 2018): three stages of conv 3x3, max-pool 3x3 stride 2 and two
  residual blocks (16, 32, 32 channels), then a linear layer. About 5x the multiply-adds of ``nature`` at 64x64.

The projection ends in LayerNorm and tanh (DrQ-v2's and SAC-AE's encoder head), which keeps the features bounded
whatever the frames look like under the randomisation.

``RandomShift`` is DrQ's augmentation (Kostrikov et al. 2020, "Image Augmentation Is All You Need"): pad each frame
by ``pad`` pixels (edge replicated) and crop it back at a random integer offset, independently per frame. It runs
only when a learner's update asks for it (``augment=True``): rollouts, evaluation, serving and deploy call the encoder
without it and see the frames as they are, whatever the module's train / eval mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ENCODERS = ("nature", "impala")


class RandomShift(nn.Module):
    """DrQ's random shift of uint8 (or float) frames ``[B, C, H, W]``: each frame padded by ``pad`` pixels and cropped
    back at its own random offset (uint8 in, uint8 out)."""

    def __init__(self, pad: int):
        super().__init__()
        if pad < 0:
            raise ValueError(f"random shift pad must be >= 0 pixels, got {pad}")
        self.pad = pad

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.pad == 0:
            return x
        b, _, h, w = x.shape
        p = self.pad
        # replicate padding needs a float tensor; integer offsets keep the pixel values exact (uint8 in, uint8 out)
        padded = F.pad(x.float(), (p, p, p, p), mode="replicate").to(x.dtype)
        shift = torch.randint(0, 2 * p + 1, (b, 2), generator=generator, device=x.device)
        rows = torch.arange(h, device=x.device)[None, :] + shift[:, :1]  # [B, H]
        cols = torch.arange(w, device=x.device)[None, :] + shift[:, 1:]  # [B, W]
        batch = torch.arange(b, device=x.device)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
        return out.permute(0, 3, 1, 2).contiguous()


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


def _trunk(arch: str) -> nn.Sequential:
    if arch == "nature":
        return nn.Sequential(nn.Conv2d(3, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                             nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
    if arch == "impala":
        layers: list[nn.Module] = []
        c_in = 3
        for c in (16, 32, 32):
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1), _Residual(c), _Residual(c)]
            c_in = c
        return nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
    raise ValueError(f"image encoder {arch!r} is not one of {ENCODERS}")


class CameraEncoder(nn.Module):
    """One camera's frames ``[B, 3, H, W]`` uint8 -> ``[B, features]`` (LayerNorm + tanh)."""

    def __init__(self, arch: str, image_shape: tuple[int, ...], features: int):
        super().__init__()
        if len(image_shape) != 3 or image_shape[0] != 3:
            raise ValueError(f"an image encoder reads [3, H, W] frames, got shape {tuple(image_shape)}")
        self.trunk = _trunk(arch)
        with torch.no_grad():
            flat = self.trunk(torch.zeros(1, *image_shape)).shape[1]
        self.head = nn.Sequential(nn.Linear(flat, features), nn.LayerNorm(features), nn.Tanh())

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(frames.float() / 255.0 - 0.5))


class ImageObservationEncoder(nn.Module):
    """The frames of ``keys`` (cameras) -> their features concatenated ``[B, len(keys) * features]``: one CNN shared by
    every camera (``shared``; the cameras' frames go through it as one batch) or one CNN per camera. ``shift_pad``:
    DrQ's random shift in pixels, applied when ``forward`` is asked to ``augment`` (a learner's update)."""

    def __init__(self, keys: tuple[str, ...], shapes: dict[str, tuple[int, ...]], arch: str = "nature",
                 features: int = 256, shared: bool = True, shift_pad: int = 4):
        super().__init__()
        if not keys:
            raise ValueError("an image encoder needs at least one camera key")
        missing = [k for k in keys if k not in shapes]
        if missing:
            raise ValueError(f"image keys {missing} are not observations of this task; it has {sorted(shapes)}")
        if shared and len({tuple(shapes[k]) for k in keys}) > 1:
            raise ValueError(f"a shared image encoder needs frames of one size; got {[tuple(shapes[k]) for k in keys]}")
        self.keys = tuple(keys)
        self.shared = shared
        self.shift = RandomShift(shift_pad)
        if shared:
            self.cnn = CameraEncoder(arch, tuple(shapes[keys[0]]), features)
        else:
            self.cnns = nn.ModuleDict({k: CameraEncoder(arch, tuple(shapes[k]), features) for k in keys})
        self.out_dim = features * len(keys)

    def forward(self, obs: dict[str, torch.Tensor], augment: bool = False) -> torch.Tensor:
        frames = [self.shift(obs[k]) if augment else obs[k] for k in self.keys]
        if self.shared:
            b = frames[0].shape[0]
            out = self.cnn(torch.cat(frames, 0))  # [C * B, F]: one pass for all cameras
            return out.reshape(len(self.keys), b, -1).permute(1, 0, 2).reshape(b, -1)
        return torch.cat([self.cnns[k](f) for k, f in zip(self.keys, frames, strict=True)], dim=-1)
