"""The profile's tokenizer (monitor/aggregate/tokens.py): the same tokens whatever the steps or memory
after the last text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _garbage_after_end(strings: pa.Array) -> pa.Array:
    """The same texts in a buffer whose bytes past the last one are no UTF-8: what the uninitialized
    padding after an Arrow string buffer may hold."""
    encoded = [s.encode() for s in strings.to_pylist()]
    wide = np.int64 if pa.types.is_large_string(strings.type) else np.int32
    offsets = np.r_[0, np.cumsum([len(b) for b in encoded])].astype(wide)
    data = b"".join(encoded) + b"\xff" * 8
    return pa.Array.from_buffers(strings.type, len(encoded), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])


def test_tokens_do_not_read_past_the_last_text(monkeypatch):
    """Arrow's utf8_split_whitespace reads the byte after a text that ends in whitespace; after the last
    text that is uninitialized memory. Regression: a cut text ending in a word then a space (the last of
    its fold) lost that word, or kept it, run by run (`tokens:<field>` one off between engines)."""
    from monitor.aggregate import tokens as tokens_mod
    from monitor.aggregate.tokens import TOKEN_CHARS, tokens

    cut_after_space = "a" * (TOKEN_CHARS - 6) + " Word tail"  # the first TOKEN_CHARS characters end in "word "
    texts = np.array(["keep it", "no cut, ends in a space! ", cut_after_space, "the end "], dtype=object)
    want = [["keep", "it"], ["no", "cut", "ends", "in", "a", "space"], ["a" * (TOKEN_CHARS - 6), "word"],
            ["the", "end"]]

    def as_lists(flat: pa.Array, parent: np.ndarray) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in texts]
        for word, i in zip(flat.to_pylist(), parent.tolist(), strict=True):
            out[i].append(word)
        return out

    assert as_lists(*tokens(texts)) == want
    split = pc.utf8_split_whitespace
    monkeypatch.setattr(tokens_mod.pc, "utf8_split_whitespace", lambda strings: split(_garbage_after_end(strings)))
    for order in ([0, 1, 2, 3], [0, 3, 2, 1], [0, 3, 1, 2], [3, 2, 1, 0]):  # each text last once
        assert as_lists(*tokens(texts[order])) == [want[i] for i in order]


def test_tokens_in_steps_are_the_tokens_of_the_whole_column(monkeypatch):
    """Tokenizing a column a few texts at a time gives the tokens and parents of one pass over it, on
    random texts: Unicode, every ASCII whitespace and separator, punctuation, texts cut mid-word."""
    from monitor.aggregate import tokens as tokens_mod
    from monitor.aggregate.tokens import TOKEN_CHARS, tokens

    rng = np.random.default_rng(7)
    alphabet = list("abcXYZ09 .,!?'\"-") + [chr(c) for c in range(0x09, 0x0E)] + [chr(c) for c in range(0x1C, 0x21)]
    alphabet += list("éÄß\u00a0\u2003\u201c\u2019…—日本")
    texts = np.array(["".join(rng.choice(alphabet, int(rng.integers(0, TOKEN_CHARS + 40))))
                      for _ in range(300)], dtype=object)

    def pairs(flat: pa.ChunkedArray, parent: np.ndarray) -> list[tuple[int, str]]:
        return list(zip(parent.tolist(), flat.to_pylist(), strict=True))

    whole = pairs(*tokens(texts))
    assert len(whole) > 1000
    for step in (1, 7, 64):
        monkeypatch.setattr(tokens_mod, "TOKEN_STEP", step)
        assert pairs(*tokens(texts)) == whole
