"""Tokens of texts: what the reference vocabulary counts and the fold's out-of-vocabulary share reads.

A text's tokens are its first TOKEN_CHARS characters lowercased, split at whitespace, punctuation trimmed
from both ends of each word (a word left empty is no token), the last word dropped when the text was cut
there. No regular expression: Arrow compiles one on every call, which costs more than tokenizing a
tick's texts.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

TOKEN_CHARS = 256  # tokens are read from the first this many characters of a text (a cut word is dropped)
TOKEN_STEP = 65536  # texts tokenized at a time
ROWS_MIN = 65536  # rows of a text column from which its texts may be read row by row (text_rows)
ROWS_HEAD = 4096  # first rows text_rows looks at
ROWS_DISTINCT = 0.9  # share of them distinct from which it does
_PUNCTUATION = string.punctuation + "\u201c\u201d\u2018\u2019\u00ab\u00bb\u2026\u2013\u2014\u00b7\u00bf\u00a1"


@dataclass(frozen=True)
class Words:
    """One step of `texts` texts as words: `words` the step's words, each once or a few times (ASCII
    words are hashed as written, then lowercased: "The" and "the" are two entries reading "the"; ""
    for a word that was all punctuation), and per word occurrence its `code` in `words`, whether it
    counts (`valid`: not empty, not cut) and, when asked for, the index of its text (`parent`,
    within the step)."""

    texts: int
    words: pa.Array
    code: np.ndarray
    valid: np.ndarray
    parent: np.ndarray | None


def steps(texts: np.ndarray, parents: bool = True) -> Iterator[tuple[int, Words]]:
    """The Words of `texts` (an object array of str), TOKEN_STEP texts at a time, with the index of
    each step's first text. Each kernel's output then stays in cache for the next kernel, about twice as
    fast as whole-column passes when every text is distinct. Punctuation is trimmed once per distinct
    word of a step, not once per occurrence."""
    for first in range(0, len(texts), TOKEN_STEP):
        yield first, _words(texts[first:first + TOKEN_STEP], parents)


def tokens(texts: np.ndarray) -> tuple[pa.ChunkedArray, np.ndarray]:
    """The tokens of each text (an object array of str), in order, with the index of the text each
    token came from."""
    flat, parent = [], []
    for first, w in steps(texts):
        flat.append(w.words.take(pa.array(w.code[w.valid])))
        parent.append(w.parent[w.valid] + first)
    return (pa.chunked_array(flat, type=pa.large_string()),
            np.concatenate(parent) if parent else np.zeros(0, dtype="int64"))


def token_counts(texts: np.ndarray, times: np.ndarray | None) -> tuple[pa.Array, np.ndarray]:
    """Each distinct token of `texts` (an object array of str) and how often it occurs, text k counted
    `times[k]` times (once each when None); in no particular order."""
    words, counts = [], []
    for first, w in steps(texts, parents=times is not None):
        words.append(w.words)
        if times is None:
            counts.append(np.bincount(w.code[w.valid], minlength=len(w.words)))
        else:
            counts.append(np.bincount(w.code[w.valid], weights=times[first:][w.parent[w.valid]], minlength=len(w.words)))
    if not words:
        return pa.array([], type=pa.large_string()), np.zeros(0, dtype="int64")
    # The steps' words merged: a word seen in several steps is summed into one.
    encoded = pc.dictionary_encode(pa.concat_arrays(words))
    total = np.bincount(encoded.indices.to_numpy(zero_copy_only=False), weights=np.concatenate(counts),
                        minlength=len(encoded.dictionary)).round().astype("int64")
    seen = total > 0
    return encoded.dictionary.filter(pa.array(seen)), total[seen]


def most_frequent(words: pa.Array, counts: np.ndarray, k: int) -> tuple[list[str], np.ndarray]:
    """The `k` most frequent of distinct `words` with their `counts`: most frequent first, ties by word
    (in code point order). Only the words that can make the cut are turned into Python strings."""
    pick = np.arange(len(counts))
    if len(counts) > k:
        kth = np.partition(counts, len(counts) - k)[len(counts) - k]  # the k-th largest count
        above = np.flatnonzero(counts > kth)
        ties = np.flatnonzero(counts == kth)
        room = k - len(above)
        if len(ties) > room:
            # The first 8 bytes of a word order it whenever they differ (UTF-8 sorts in code point
            # order): only the ties whose prefix is at most the room-th smallest can be among the first.
            prefix = _prefix(words.take(pa.array(ties)))
            ties = ties[prefix <= np.partition(prefix, room - 1)[room - 1]]
        pick = np.concatenate([above, ties])
    text = words.take(pa.array(pick)).to_numpy(zero_copy_only=False)
    order = np.lexsort((text.astype(str), -counts[pick]))[:k]
    return [str(w) for w in text[order]], counts[pick][order]


def _prefix(words: pa.Array) -> np.ndarray:
    """The first 8 bytes of each word as a big-endian uint64, zero-padded: a smaller prefix is a
    smaller word."""
    _, offsets_buf, data_buf = words.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=len(words) + 1, offset=words.offset * 8)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data[: offsets[-1]], np.zeros(8, np.uint8)])
    cols = np.arange(8)
    block = data[offsets[:-1, None] + cols]
    block[cols >= np.diff(offsets)[:, None]] = 0
    return block.view(">u8").ravel()


_HASH_BYTES = 16  # bytes of a text its hash reads (with its length)
_HASH_CHUNK = 65536  # texts converted to Arrow at a time
_HASH_MULT = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F], dtype=np.uint64)
# _MASKS[k] keeps the first k bytes (in memory order) of an 8-byte word.
_MASKS = np.where(np.arange(8) < np.arange(9)[:, None], 0xFF, 0).astype(np.uint8).view(np.uint64).ravel()


def text_hash(texts: np.ndarray | list[pa.Array]) -> np.ndarray:
    """A 64-bit hash of each text (object array of str, or Arrow string chunks; a missing text hashes
    as "") from its UTF-8 length and first 16 bytes: the same in every process (Python's hash is not),
    vectorized (pandas' hash_array encodes one by one)."""
    if isinstance(texts, np.ndarray):
        # Converted to Arrow a chunk at a time: one buffer for a million texts costs several times more
        # (it grows by copying, page by page).
        texts = [pa.array(texts[a:a + _HASH_CHUNK], type=pa.large_string()) for a in range(0, len(texts), _HASH_CHUNK)]
    h = np.concatenate([_hash_chunk(arr) for arr in texts]) if texts else np.zeros(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        # splitmix64's finalizer: every input bit reaches the low bits that the sample reads
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


def _hash_chunk(arr: pa.Array) -> np.ndarray:
    """text_hash before its finalizer, of Arrow strings (large_string)."""
    starts, data = _bytes(arr)
    first, end = int(starts[0]), int(starts[-1])
    size = np.diff(starts)
    if arr.null_count:
        size[arr.is_null().to_numpy(zero_copy_only=False)] = 0
    # The texts' bytes and _HASH_BYTES zeros after them, read as 8-byte words at every byte (a view with
    # a stride of one byte): each text's two words are two lookups, the bytes past its end masked off.
    padded = np.zeros(end - first + _HASH_BYTES, dtype=np.uint8)
    padded[: end - first] = data[first:end]
    window = np.ndarray(shape=(len(padded) - 7,), dtype=np.uint64, buffer=padded, strides=(1,))
    start = starts[:-1] - first
    low, high = window[start], window[start + 8]
    low &= _MASKS[np.minimum(size, 8)]
    high &= _MASKS[np.clip(size - 8, 0, 8)]
    with np.errstate(over="ignore"):
        low *= _HASH_MULT[0]
        high *= _HASH_MULT[1]
        low += high
        low += size.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
    return low


def _words(texts: np.ndarray, parents: bool) -> Words:
    arr = pa.array(texts, type=pa.large_string())
    starts, data = _bytes(arr)
    ascii = data[starts[0]:starts[-1]].max(initial=0) < 0x80
    segments, parent, cut = _ascii_segments(arr, parents) if ascii else _unicode_segments(arr)
    encoded = pc.dictionary_encode(segments)
    # An ASCII segment is a word with the whitespace byte before it: whitespace and punctuation are
    # trimmed together (a word holds no whitespace, so that is the word trimmed of punctuation), and
    # letters lowercased, once per distinct segment rather than once per byte of text.
    words = pc.utf8_trim(encoded.dictionary, characters=_PUNCTUATION + _ASCII_SPACE)
    if ascii:
        words = pc.ascii_lower(words)
    code = encoded.indices.to_numpy(zero_copy_only=False)
    valid = pc.not_equal(words, "").to_numpy(zero_copy_only=False)[code]
    valid[cut] = False
    return Words(len(texts), words.cast(pa.large_string()), code, valid, parent if parents else None)


def _unicode_segments(arr: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Words split by Arrow's Unicode kernels, the index of each one's text, and the positions of the
    words dropped because their text was cut in them."""
    sliced = pc.utf8_lower(pc.utf8_slice_codeunits(arr, 0, TOKEN_CHARS))
    # Trailing whitespace goes before the split: Arrow's utf8_split_whitespace reads the byte past a
    # text that ends in whitespace (past the last text: uninitialized memory) and, when that byte is no
    # UTF-8, leaves the whitespace on the last word ("word " instead of "word", ""): tokens changed
    # from run to run.
    trimmed = pc.utf8_rtrim_whitespace(sliced)
    lists = pc.utf8_split_whitespace(trimmed)
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    cut = pc.greater(pc.utf8_length(arr), TOKEN_CHARS).to_numpy(zero_copy_only=False)
    offsets = lists.offsets.to_numpy()
    cut &= offsets[1:] > offsets[:-1]  # texts cut that have a word
    # A text cut right after whitespace ends in a whole word: it stays.
    cut &= pc.equal(pc.binary_length(trimmed), pc.binary_length(sliced)).to_numpy(zero_copy_only=False)
    return pc.list_flatten(lists), parent, offsets[1:][cut] - 1


def _ascii_segments(arr: pa.Array, parents: bool) -> tuple[pa.Array, np.ndarray | None, np.ndarray]:
    """ASCII texts cut into segments at whitespace bytes, without a split or a copy: each segment a
    whitespace byte and the word after it (or a text's first word, or a lone whitespace byte), the same
    words as the Unicode kernels at a fraction of their cost. With the index of each segment's text
    (when `parents`) and the positions of the segments dropped because their text was cut in them."""
    starts, data = _bytes(arr)
    cut = np.diff(starts) > TOKEN_CHARS  # a byte per character
    if cut.any():
        starts, data = _bytes(pc.binary_slice(arr.cast(pa.large_binary()), 0, TOKEN_CHARS))
    end = int(starts[-1])
    text = data[:end]
    bound = np.zeros(end + 1, dtype=bool)
    np.less_equal(text, 0x20, out=bound[:end])
    if text[starts[0]:].min(initial=0x20) < 0x20:  # control bytes: only some are whitespace
        low = np.flatnonzero(text < 0x20)
        bound[low] = _IS_SPACE[text[low]]
    ends = starts[1:][cut]
    last_is_word = ~bound[ends - 1]
    bound[starts] = True  # a text's start, and the end of the last text
    bound[: starts[0]] = False
    cuts = np.flatnonzero(bound)
    segments = pa.Array.from_buffers(pa.large_string(), len(cuts) - 1,
                                     [None, pa.py_buffer(cuts), pa.py_buffer(text) if end else pa.py_buffer(b"")])
    parent = None
    if parents:
        # Each text's start is a cut: a segment's text is the number of starts at or before it, less one
        # (a cumulative count over the cuts: one search per text, not one per segment).
        firsts = np.bincount(np.searchsorted(cuts, starts[:-1], side="left"), minlength=len(cuts))
        parent = np.cumsum(firsts[:-1]) - 1
    # A text longer than TOKEN_CHARS whose kept part ends in a word loses that word: its last segment.
    return segments, parent, np.searchsorted(cuts, ends[last_is_word], side="left") - 1


def _bytes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (int64) and data bytes of a large_string or large_binary array, without copying."""
    _, offsets, data = arr.buffers()
    starts = np.frombuffer(offsets, dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)
    return starts, np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)


# The ASCII characters Arrow's (and Python's) Unicode whitespace test accepts: tab to carriage return,
# the four separators 0x1c-0x1f, and space.
_ASCII_SPACE = "".join(map(chr, [*range(0x09, 0x0E), *range(0x1C, 0x21)]))
_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[[ord(c) for c in _ASCII_SPACE]] = True


def text_rows(values: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """The length in characters (NaN for missing) and text_hash of each row's text, read row by row a
    chunk at a time, when most of the column's first rows are distinct texts: hashing every text to find
    the distinct ones then costs more than it saves. None otherwise, or when a value is neither text
    nor missing."""
    if len(values) < ROWS_MIN or values.dtype != object:
        return None
    head = values.iloc[:ROWS_HEAD].dropna()
    if not len(head) or len(pd.unique(head)) < ROWS_DISTINCT * len(head):
        return None
    column = values.to_numpy(dtype=object)
    size, hashes = np.empty(len(column)), np.empty(len(column), dtype=np.uint64)
    for a in range(0, len(column), TOKEN_STEP):
        try:
            # The type inferred, not asked for: bytes would be taken for text.
            chunk = pa.array(column[a:a + TOKEN_STEP], from_pandas=True)
        except (ValueError, TypeError):  # not text (ArrowTypeError), or a lone surrogate (UnicodeEncodeError)
            return None
        if not (pa.types.is_string(chunk.type) or pa.types.is_null(chunk.type)):
            return None
        chunk = chunk.cast(pa.large_string())
        size[a:a + len(chunk)] = pc.utf8_length(chunk).to_numpy(zero_copy_only=False)
        hashes[a:a + len(chunk)] = text_hash([chunk])
    return size, hashes
