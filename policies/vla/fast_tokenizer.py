"""A FAST action tokenizer fitted offline on our own action data (pi0-FAST's tokenizer, the recipe of Pertsch et al.,
"FAST: Efficient Action Tokenization for Vision-Language-Action Models").

encode: chunk [H, A] -> normalise each action dim to [-1, 1] (the fitted 1st / 99th percentiles, clipped) -> DCT-II
along time (orthonormal) -> round(scale * coefficients) -> flatten low frequencies first (row-major over [H, A]: all
dims' DC terms, then the first harmonic, ...) -> one character per integer -> byte-pair encoding (``tokenizers``' BPE,
trained here on our chunks) -> token ids. decode inverts every step; a token sequence that does not decode to exactly
H * A integers is padded with zeros / cut (as FAST does), so any sampled sequence gives a chunk.

Round-trip bound (chunks inside the fitted range): the rounding error of each coefficient is <= 0.5 / scale and the
orthonormal inverse DCT keeps the L2 norm, so per action dim ||x_hat - x||_2 <= sqrt(H) * 0.5 / scale in normalised
units; ``error_bound()`` gives that times each dim's half range in action units.

How it differs from the published tokenizer (``physical-intelligence/fast``, LeRobot's ``lerobot/fast-action-tokenizer``,
loaded from the hub by LeRobot's pi0-FAST): that BPE was trained on a large cross-embodiment corpus with a vocabulary of
1024 over integers clipped to a fixed range, and expects the policy's own quantile normalisation upstream; this one is
trained on the task's demonstrations only (vocabulary ``vocab_size``, default 256), carries its normalisation with it,
and its integer range is the exact bound of the orthonormal DCT of [-1, 1] inputs (|c| <= sqrt(H)), so no coefficient
is ever clipped. Token ids are ours: the adapter maps them into the VLM's vocabulary (policies/vla/pi0_fast.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

CHAR_OFFSET = 0x100  # integers become characters from U+0100 on (printable, no whitespace or control characters)


def dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix C [n, n]: coefficients = C @ x, x = C.T @ coefficients (scipy's dct(norm='ortho'))."""
    k, i = np.arange(n)[:, None], np.arange(n)[None, :]
    c = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    c[0] /= math.sqrt(2.0)
    return c


class FASTActionTokenizer:
    def __init__(self, chunk_size: int, action_dim: int, low: np.ndarray, high: np.ndarray, scale: float = 10.0,
                 tokenizer=None):
        if chunk_size < 1 or action_dim < 1:
            raise ValueError(f"chunk_size={chunk_size} and action_dim={action_dim} must be >= 1")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale={scale!r} must be a finite number > 0")
        self.chunk_size, self.action_dim, self.scale = chunk_size, action_dim, float(scale)
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        self.dct = dct_matrix(chunk_size)
        self.max_int = int(math.ceil(self.scale * math.sqrt(chunk_size)))  # |c| <= sqrt(H) for inputs in [-1, 1]
        self.tokenizer = tokenizer

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, chunks: np.ndarray, scale: float = 10.0, vocab_size: int = 256, quantile: float = 0.01
            ) -> FASTActionTokenizer:
        """Fit normalisation (per-dim quantiles) and the BPE on action chunks [N, H, A]."""
        from tokenizers import Tokenizer, models, trainers

        chunks = np.asarray(chunks, np.float64)
        if chunks.ndim != 3 or len(chunks) < 1:
            raise ValueError(f"chunks must be [N, chunk_size, action_dim], got shape {chunks.shape}")
        flat = chunks.reshape(-1, chunks.shape[-1])
        low, high = np.quantile(flat, quantile, axis=0), np.quantile(flat, 1 - quantile, axis=0)
        high = np.where(high - low < 1e-6, low + 1e-6, high)
        out = cls(chunks.shape[1], chunks.shape[2], low, high, scale)
        alphabet = [chr(CHAR_OFFSET + i) for i in range(2 * out.max_int + 1)]
        if vocab_size < len(alphabet):
            raise ValueError(f"vocab_size={vocab_size} must be >= the {len(alphabet)} integer symbols of scale={scale} and "
                             f"chunk_size={out.chunk_size}")
        bpe = Tokenizer(models.BPE())
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False,
                                      max_token_length=16)
        bpe.train_from_iterator([out._to_string(c) for c in chunks], trainer)
        for ch in alphabet:  # every integer must stay encodable, even one the data never produced
            if bpe.token_to_id(ch) is None:
                bpe.add_tokens([ch])
        out.tokenizer = bpe
        return out

    # ------------------------------------------------------------------ encode / decode
    def normalise(self, chunk: np.ndarray) -> np.ndarray:
        return np.clip(2.0 * (np.asarray(chunk, np.float64) - self.low) / (self.high - self.low) - 1.0, -1.0, 1.0)

    def denormalise(self, x: np.ndarray) -> np.ndarray:
        return (x + 1.0) / 2.0 * (self.high - self.low) + self.low

    def _integers(self, chunk: np.ndarray) -> np.ndarray:
        coeffs = self.dct @ self.normalise(chunk)  # [H, A]: DCT along time, per action dim
        return np.clip(np.rint(coeffs * self.scale), -self.max_int, self.max_int).astype(np.int64).reshape(-1)

    def _to_string(self, chunk: np.ndarray) -> str:
        return "".join(chr(CHAR_OFFSET + int(v) + self.max_int) for v in self._integers(chunk))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, chunk: np.ndarray) -> list[int]:
        """Token ids of one chunk [H, A] (variable length)."""
        chunk = np.asarray(chunk)
        if chunk.shape != (self.chunk_size, self.action_dim):
            raise ValueError(f"chunk shape {chunk.shape} is not [{self.chunk_size}, {self.action_dim}]")
        return self.tokenizer.encode(self._to_string(chunk)).ids

    def decode(self, ids) -> np.ndarray:
        """Chunk [H, A] (float32) from token ids; a sequence of the wrong integer count is zero-padded or cut."""
        text = "".join(self.tokenizer.id_to_token(int(i)) or "" for i in ids)
        ints = np.array([ord(ch) - CHAR_OFFSET - self.max_int for ch in text], np.float64)
        n = self.chunk_size * self.action_dim
        ints = np.concatenate([ints, np.zeros(max(0, n - len(ints)))])[:n]
        x = self.dct.T @ (np.clip(ints, -self.max_int, self.max_int).reshape(self.chunk_size, self.action_dim) / self.scale)
        return self.denormalise(np.clip(x, -1.0, 1.0)).astype(np.float32)

    def error_bound(self) -> np.ndarray:
        """Per action dim, the largest |decode(encode(x)) - x| for x inside the fitted range (action units)."""
        return math.sqrt(self.chunk_size) * 0.5 / self.scale * (self.high - self.low) / 2.0

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(path / "bpe.json"))
        (path / "fast.json").write_text(json.dumps({"chunk_size": self.chunk_size, "action_dim": self.action_dim,
                                                    "scale": self.scale, "low": self.low.tolist(),
                                                    "high": self.high.tolist()}))

    @classmethod
    def load(cls, path: str | Path) -> FASTActionTokenizer:
        from tokenizers import Tokenizer

        path = Path(path)
        if not (path / "fast.json").is_file():
            raise ValueError(f"{path} holds no fitted FAST tokenizer (fast.json + bpe.json)")
        meta = json.loads((path / "fast.json").read_text())
        return cls(meta["chunk_size"], meta["action_dim"], np.array(meta["low"]), np.array(meta["high"]), meta["scale"],
                   Tokenizer.from_file(str(path / "bpe.json")))
