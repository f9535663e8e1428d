"""Per-record signatures: normalise, hash exactly, MinHash, cut into LSH band keys.

A signature depends only on the record's text and the settings, never on the
rest of the batch, so partitions of a distributed run compute them
independently and shuffle records by ``(scope, band index, band key)``.

Everything after normalisation is vectorised with numpy over a whole batch:
the messages are joined into one array of code points, tokens are found with
masks, hashed with a polynomial rolling hash over prefix sums, combined into
n-gram shingles and min-hashed with multiply-shift hash functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
import xxhash
from numpy.typing import NDArray

from feedback.dedup.text import message_forms
from flywheel.settings.cleaning import DedupSettings

U64 = NDArray[np.uint64]

_SPACE = ord(" ")
_ZERO = ord("0")
# Scripts written without spaces between words: Thai, kana, CJK ideographs.
_UNSPACED_RANGES = (
    (0x0E00, 0x0E7F),
    (0x3040, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x3134F),
)
_POLY = 0x9E3779B97F4A7C15
_POLY_INVERSE = pow(_POLY, -1, 2**64)
_DIGIT_TOKEN = np.uint64(0x6A09E667F3BCC908)
_NGRAM_SALT = 0xC2B2AE3D27D4EB4F
_BAND_SALT = 0x165667B19E3779F9
_MISSING = np.uint32(0xFFFFFFFF)
# Shingles min-hashed at once; bounds the (num_perm x shingles) work array to ~32 MiB.
_SHINGLE_CHUNK = 32_768
# Characters signed at once; bounds the code point and power tables.
_CHARACTERS_PER_SLICE = 1 << 20
FINGERPRINT_BITS = 8


def mix_hash(values: U64) -> U64:
    """splitmix64's finaliser: a bijection of 64-bit values that spreads every input bit."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


@cache
def _permutations(seed: int, num_perm: int) -> tuple[U64, U64]:
    rng = np.random.default_rng(seed)
    top = np.uint64(2**64 - 1)
    multipliers = rng.integers(0, top, size=num_perm, dtype=np.uint64, endpoint=True)
    multipliers |= np.uint64(1)
    offsets = rng.integers(0, top, size=num_perm, dtype=np.uint64, endpoint=True)
    multipliers.setflags(write=False)
    offsets.setflags(write=False)
    return multipliers, offsets


@lru_cache(maxsize=2)
def _powers(length: int) -> tuple[U64, U64]:
    powers = np.full(length, _POLY, dtype=np.uint64)
    powers[0] = 1
    np.multiply.accumulate(powers, out=powers)
    inverse = np.full(length, _POLY_INVERSE, dtype=np.uint64)
    inverse[0] = 1
    np.multiply.accumulate(inverse, out=inverse)
    powers.setflags(write=False)
    inverse.setflags(write=False)
    return powers, inverse


def _power_tables(length: int) -> tuple[U64, U64]:
    size = 1 << max(16, (length - 1).bit_length())
    powers, inverse = _powers(size)
    return powers[:length], inverse[:length]


@dataclass(frozen=True, slots=True)
class TextSignature:
    """The signature of one record's text.

    ``band_keys`` is empty when the text has no shingles (blank or punctuation
    only), so the record can only be an exact duplicate. ``fingerprint`` holds
    the low bits of every min-hash, enough to estimate the similarity of two
    records that share a band.
    """

    exact_hash: int
    band_keys: tuple[int, ...]
    fingerprint: bytes


@dataclass(frozen=True, slots=True)
class TextSignatures:
    """Signatures of a batch of texts, one row per record.

    ``has_text`` is false for a record with no text (missing or null field);
    ``has_shingles`` is false when the text leaves nothing to min-hash.
    """

    exact_hash: NDArray[np.uint64]
    has_text: NDArray[np.bool_]
    has_shingles: NDArray[np.bool_]
    band_keys: NDArray[np.uint64]
    fingerprints: NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.exact_hash.shape[0])

    def row(self, index: int) -> TextSignature:
        """The signature of one record of the batch."""
        band_keys = (
            tuple(int(key) for key in self.band_keys[index]) if self.has_shingles[index] else ()
        )
        return TextSignature(
            exact_hash=int(self.exact_hash[index]),
            band_keys=band_keys,
            fingerprint=self.fingerprints[index].tobytes(),
        )

    @classmethod
    def concatenate(
        cls, parts: Sequence[TextSignatures], settings: DedupSettings
    ) -> TextSignatures:
        """Join batches signed with the same settings, in order."""
        if not parts:
            return _sign_slice([], settings)
        return cls(
            exact_hash=np.concatenate([part.exact_hash for part in parts]),
            has_text=np.concatenate([part.has_text for part in parts]),
            has_shingles=np.concatenate([part.has_shingles for part in parts]),
            band_keys=np.concatenate([part.band_keys for part in parts]),
            fingerprints=np.concatenate([part.fingerprints for part in parts]),
        )


def exact_text_hash(text: str, settings: DedupSettings) -> int:
    """The exact hash of one text alone, as in its signature, without the MinHash work."""
    return _exact_form_hash(message_forms(text, mask_digits=False)[0], settings)


def _exact_form_hash(exact: str, settings: DedupSettings) -> int:
    return xxhash.xxh3_64_intdigest(exact.encode("utf-8", "surrogatepass"), seed=settings.seed)


def sign_text(text: str, settings: DedupSettings) -> TextSignature:
    """Normalise one text, hash it exactly and cut its MinHash into LSH band keys."""
    return sign_texts([text], settings).row(0)


def sign_texts(texts: Sequence[str | None], settings: DedupSettings) -> TextSignatures:
    """Sign a batch of texts; ``None`` marks a record with no text.

    Each row equals what :func:`sign_text` gives for that text alone. Work
    memory stays bounded: the batch is signed a slice at a time.
    """
    parts: list[TextSignatures] = []
    start = 0
    while start < len(texts):
        end, characters = start, 0
        while end < len(texts) and (end == start or characters < _CHARACTERS_PER_SLICE):
            text = texts[end]
            characters += len(text) + 1 if text is not None else 1
            end += 1
        parts.append(_sign_slice(texts[start:end], settings))
        start = end
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return _sign_slice([], settings)
    return TextSignatures.concatenate(parts, settings)


def _sign_slice(texts: Sequence[str | None], settings: DedupSettings) -> TextSignatures:
    count = len(texts)
    exact_hash = np.zeros(count, dtype=np.uint64)
    has_text = np.zeros(count, dtype=np.bool_)
    shingle_texts: list[str] = []
    for index, text in enumerate(texts):
        if text is None:
            shingle_texts.append("")
            continue
        exact, shingle_text = message_forms(text, mask_digits=settings.mask_digits)
        exact_hash[index] = _exact_form_hash(exact, settings)
        has_text[index] = True
        shingle_texts.append(shingle_text if settings.near_duplicates else "")

    minhashes = _minhash_texts(shingle_texts, settings)
    has_shingles = (minhashes != _MISSING).any(axis=1)
    used = minhashes[:, : settings.bands * settings.rows]
    band_keys = _band_keys(used.reshape(count, settings.bands, settings.rows))
    fingerprints = (minhashes & np.uint32((1 << FINGERPRINT_BITS) - 1)).astype(np.uint8)
    return TextSignatures(
        exact_hash=exact_hash,
        has_text=has_text,
        has_shingles=has_shingles,
        band_keys=band_keys,
        fingerprints=fingerprints,
    )


def _band_keys(bands: NDArray[np.uint32]) -> U64:
    count, band_count, rows = bands.shape
    band_index = np.arange(band_count, dtype=np.uint64)
    keys = np.broadcast_to(mix_hash(band_index ^ np.uint64(_BAND_SALT)), (count, band_count))
    for row in range(rows):
        keys = mix_hash(keys ^ bands[:, :, row].astype(np.uint64))
    return np.ascontiguousarray(keys)


def _minhash_texts(shingle_texts: Sequence[str], settings: DedupSettings) -> NDArray[np.uint32]:
    count = len(shingle_texts)
    minhashes = np.full((count, settings.num_perm), _MISSING, dtype=np.uint32)
    tokens, owners = _token_hashes(shingle_texts, settings)
    if tokens.size == 0:
        return minhashes
    for size in settings.shingle_sizes:
        shingles, shingle_owners = _ngram_hashes(tokens, owners, size)
        if shingles.size:
            np.minimum(
                minhashes,
                _minhash(shingles, shingle_owners, count, settings),
                out=minhashes,
            )
    return minhashes


def _token_hashes(shingle_texts: Sequence[str], settings: DedupSettings) -> tuple[U64, U64]:
    """Hash every token of every text; return the hashes and the owning record of each."""
    joined = " ".join(shingle_texts)
    if not joined.strip():
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty
    code_points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    lengths = np.fromiter((len(text) + 1 for text in shingle_texts), np.int64, len(shingle_texts))
    record_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))

    unspaced = np.zeros(code_points.shape, dtype=np.bool_)
    for low, high in _UNSPACED_RANGES:
        unspaced |= (code_points >= low) & (code_points <= high)
    spaced_word = (code_points != _SPACE) & ~unspaced

    def starts_run(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
        return mask & ~np.concatenate(([False], mask[:-1]))

    def ends_run(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
        return mask & ~np.concatenate((mask[1:], [False]))

    # Words of spaced scripts are tokens; unspaced text is cut into
    # overlapping character bigrams (a lone character is its own token).
    word_start = starts_run(spaced_word)
    unspaced_next = np.concatenate((unspaced[1:], [False]))
    bigram_start = unspaced & unspaced_next
    single = starts_run(unspaced) & ends_run(unspaced)
    starts = np.flatnonzero(word_start | bigram_start | single)
    ends = np.empty_like(starts)
    is_word = word_start[starts]
    ends[is_word] = np.flatnonzero(ends_run(spaced_word)) + 1
    is_bigram = bigram_start[starts]
    ends[is_bigram] = starts[is_bigram] + 2
    is_single = single[starts]
    ends[is_single] = starts[is_single] + 1

    powers, inverse = _power_tables(code_points.size)
    prefix = np.zeros(code_points.size + 1, dtype=np.uint64)
    np.cumsum(code_points.astype(np.uint64) * powers, out=prefix[1:])
    tokens = (prefix[ends] - prefix[starts]) * inverse[starts]
    tokens = mix_hash(
        tokens ^ mix_hash((ends - starts).astype(np.uint64) + np.uint64(settings.seed))
    )
    if settings.mask_digits:
        zeros = np.zeros(code_points.size + 1, dtype=np.int64)
        np.cumsum(code_points == _ZERO, out=zeros[1:])
        tokens[(zeros[ends] - zeros[starts]) > 0] = _DIGIT_TOKEN
    owners = (np.searchsorted(record_starts, starts, side="right") - 1).astype(np.uint64)
    return tokens, owners


def _ngram_hashes(tokens: U64, owners: U64, size: int) -> tuple[U64, U64]:
    windows = tokens.size - size + 1
    if windows <= 0:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty
    same_record = owners[:windows] == owners[size - 1 :]
    shingles = np.full(
        windows, mix_hash(np.array([_NGRAM_SALT + size], dtype=np.uint64))[0], dtype=np.uint64
    )
    for offset in range(size):
        shingles = mix_hash(shingles ^ tokens[offset : offset + windows])
    return shingles[same_record], owners[:windows][same_record]


def _minhash(shingles: U64, owners: U64, count: int, settings: DedupSettings) -> NDArray[np.uint32]:
    """Min over each record's shingles of ``(a * x + b) >> 32``, one (a, b) per permutation.

    ``owners`` must be sorted; records without shingles get the missing marker.
    Shingles are taken a fixed-size chunk at a time, so even one huge record
    never needs more than a chunk of work memory.
    """
    multipliers, offsets = _permutations(settings.seed, settings.num_perm)
    result = np.full((count, settings.num_perm), _MISSING, dtype=np.uint32)
    for chunk_start in range(0, shingles.size, _SHINGLE_CHUNK):
        segment = shingles[chunk_start : chunk_start + _SHINGLE_CHUNK]
        segment_owners = owners[chunk_start : chunk_start + _SHINGLE_CHUNK]
        starts = np.flatnonzero(np.concatenate(([True], segment_owners[1:] != segment_owners[:-1])))
        records = segment_owners[starts].astype(np.intp)
        # Permutations along rows keep each reduction contiguous in memory
        # (about 4x faster than reducing down columns).
        work = np.multiply.outer(multipliers, segment)
        work += offsets[:, None]
        lowest = np.minimum.reduceat(work, starts, axis=1)
        # Shifting after the min is the same as before it: x >> 32 is monotone.
        lowest >>= np.uint64(32)
        # A record cut by a chunk boundary is min-combined across both chunks.
        result[records] = np.minimum(result[records], lowest.T)
    return result


def estimated_similarity(left: NDArray[np.uint8], right: NDArray[np.uint8]) -> NDArray[np.float64]:
    """Jaccard similarity estimated from fingerprints, row by row.

    Two different min-hashes still agree on their low bits with probability
    ``2 ** -FINGERPRINT_BITS``; the estimate removes that bias.
    """
    agreement = (left == right).mean(axis=1)
    chance = 1.0 / (1 << FINGERPRINT_BITS)
    estimate: NDArray[np.float64] = np.clip((agreement - chance) / (1.0 - chance), 0.0, 1.0)
    return estimate
