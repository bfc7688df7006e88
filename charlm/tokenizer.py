"""Char-level and byte-level BPE tokenizers behind one interface.

Both turn str -> ids -> str, expose the UTF-8 bytes of each token (for streaming decode)
and serialise to a small JSON envelope {"kind": ..., ...}; nothing is ever pickled.
"""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Callable, Iterable
from itertools import chain

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from charlm.config import UNKNOWN as UNKNOWN_POLICIES
from charlm.errors import UserError


class UnknownCharactersError(UserError, ValueError):
    """Text contains characters outside a char tokenizer's vocabulary."""

    def __init__(self, chars: list[str]):
        self.chars = chars
        n = len(chars)
        shown = ", ".join(repr(c) for c in chars[:10]) + (", ..." if n > 10 else "")
        super().__init__(
            f"prompt has {n} character{'s' if n != 1 else ''} the model never saw: {shown} "
            "(use --unknown drop or --unknown replace)"
        )


def _as_list(ids) -> list[int]:
    # accepts lists, numpy arrays and torch tensors alike
    return ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]


def _code_points(text: str) -> np.ndarray:
    """The code point of each character, as uint8 for ASCII text (a quarter of the memory traffic)."""
    if text.isascii():  # O(1) in CPython: a flag of the str object
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    # surrogatepass: a lone surrogate (e.g. from a badly decoded argv) becomes an unknown char, not a crash
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _writable(c: str) -> bool:
    """Not a lone surrogate, which no UTF-8 text decodes to and no terminal takes (but those of undecodable bytes,
    as surrogateescape writes them: U+DC80 to U+DCFF)."""
    return not "\ud800" <= c <= "\udfff" or "\udc80" <= c <= "\udcff"


class CharTokenizer:
    """One token per Unicode code point; id = index in `chars`."""

    kind = "char"

    def __init__(self, chars: list[str]):
        if (
            not isinstance(chars, list)
            or not all(isinstance(c, str) and len(c) == 1 and _writable(c) for c in chars)
            or not chars
            or len(set(chars)) != len(chars)
        ):
            raise ValueError("a char vocabulary must be a non-empty list of distinct single characters")
        self.chars = list(chars)
        cps = [ord(c) for c in self.chars]
        # code point -> id, -1 for characters outside the vocabulary; the last slot catches every code point
        # above the largest known one (np.take clips to it). At most 0x110001 entries: 4.4 MB.
        self._lut = np.full(max(cps) + 2, -1, dtype=np.int32)
        self._lut[cps] = np.arange(len(cps), dtype=np.int32)

    @classmethod
    def train(cls, chunks: Iterable[str]) -> CharTokenizer:
        seen: set[int] = set()  # code points; set.update(str) would make a Python object per character
        for chunk in chunks:
            if chunk.isascii():  # delete the characters already seen and look at what is left: memory speed
                seen.update(chunk.encode("ascii").translate(None, bytes(c for c in seen if c < 128)))
            else:
                seen.update(np.flatnonzero(np.bincount(_code_points(chunk))).tolist())
        if not seen:
            raise ValueError("cannot build a vocabulary from empty text")
        return cls([chr(c) for c in sorted(seen)])  # sorted by code point, so the vocabulary is stable

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def _lookup(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids, known) per character, vectorised: no Python object per character."""
        ids = self._lut.take(_code_points(text), mode="clip")
        return ids, ids >= 0

    def _unknown(self, text: str, known: np.ndarray) -> list[str]:
        return list(dict.fromkeys(text[i] for i in np.flatnonzero(~known)))

    def encode(self, text: str, unknown: str = "error") -> list[int]:
        if unknown not in UNKNOWN_POLICIES:
            raise ValueError(f"unknown must be one of {UNKNOWN_POLICIES}, got {unknown!r}")
        ids, known = self._lookup(text)
        if not known.all():
            if unknown == "error":
                raise UnknownCharactersError(self._unknown(text, known))
            if unknown == "drop":
                ids = ids[known]
            else:
                ids = np.where(known, ids, self._replacement_id())
        return ids.tolist()

    def _replacement_id(self) -> int:
        for c in (" ", "?"):
            if c in self.chars:
                return self.chars.index(c)
        return 0

    def encode_array(self, text: str) -> np.ndarray:
        ids, known = self._lookup(text)
        if not known.all():
            raise UnknownCharactersError(self._unknown(text, known))
        return ids

    def decode(self, ids) -> str:
        return "".join([self.chars[i] for i in _as_list(ids)])

    def token_bytes(self, id: int) -> bytes:
        return self.chars[id].encode("utf-8", "surrogateescape")  # an undecodable byte's surrogate: the byte

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "chars": self.chars})


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable char table, the one the ByteLevel pre-tokenizer uses."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:  # whitespace and control bytes are shifted to 256+ so every token is printable
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}

# A boundary between "X\n" and "Y" (X, Y not whitespace) is always a boundary of the GPT-2 pre-tokenizer
# regex, so encoding the pieces separately gives exactly the ids of encoding the whole text.
# (Python's \s is a superset of Unicode White_Space, so \S here never claims too much.)
_SAFE_BOUNDARY = re.compile(r"\S\n(?=\S)")  # the boundary is the end of the match
PIECE_CHARS = (
    1 << 14
)  # a line per piece costs ~25% more time in per-Encoding overhead; 64 pieces per MB still parallelise


def _pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """Cut text at safe boundaries into pieces of at least `size` characters (the last one may be shorter)."""
    pieces, start = [], 0
    while len(text) - start > size and (m := _SAFE_BOUNDARY.search(text, start + size)):
        pieces.append(text[start : m.end()])
        start = m.end()
    pieces.append(text[start:])
    return pieces


_SURROGATE = re.compile("[\ud800-\udfff]")


class BPETokenizer:
    """Byte-level BPE (Hugging Face `tokenizers`): every str encodes, and decode(encode(s)) == s."""

    kind = "bpe"

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        try:  # id_to_token is None for an id the vocabulary skips
            self._bytes = [bytes(BYTE_DECODER[c] for c in tok.id_to_token(i)) for i in range(tok.get_vocab_size())]
        except (KeyError, TypeError):
            raise ValueError("a BPE vocabulary must be byte-level tokens numbered from 0, without gaps") from None

    @classmethod
    def train(cls, chunks: Iterable[str], vocab_size: int) -> BPETokenizer:
        if vocab_size < 257:
            raise ValueError(f"a BPE vocab size must be at least 257 (256 bytes + 1 merge), got {vocab_size}")
        tok = Tokenizer(models.BPE())
        # no normalizer: any normalisation would break exact round trips
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,  # a pair seen once is memorisation, not compression
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so nothing is ever unknown
            show_progress=False,  # it draws its own progress bar on stderr otherwise
        )
        tok.train_from_iterator(chunks, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return len(self._bytes)

    def encode(self, text: str, unknown: str = "error") -> list[int]:
        # `unknown` is accepted for a uniform interface: byte-level BPE has no unknown characters.
        # Lone surrogates are not encodable as UTF-8; show them as U+FFFD rather than crash.
        return self.tok.encode(_SURROGATE.sub("\ufffd", text)).ids

    def encode_array(self, text: str) -> np.ndarray:
        # one big encode() is single-threaded and slow; a batch of line-ish pieces runs in parallel
        encs = self.tok.encode_batch_fast(_pieces(text))
        return np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int32)

    def decode(self, ids) -> str:
        # invalid UTF-8 (e.g. half an emoji) becomes U+FFFD, like bytes.decode(errors="replace")
        return self.tok.decode(_as_list(ids))

    def token_bytes(self, id: int) -> bytes:
        return self._bytes[id]

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "tokenizer": json.loads(self.tok.to_str())})


def tokenizer_from_json(s: str) -> CharTokenizer | BPETokenizer:
    """The tokenizer that to_json() wrote; for any other text, a ValueError that says in one line what is wrong."""
    try:
        d = json.loads(s)
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
        raise ValueError(f"a tokenizer is JSON, and this is not ({type(e).__name__})") from None
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "char":
        return CharTokenizer(d.get("chars"))
    if kind == "bpe":
        if not isinstance(d.get("tokenizer"), dict):
            raise ValueError("a BPE tokenizer holds a Hugging Face tokenizer (a JSON object)")
        try:
            tok = Tokenizer.from_str(json.dumps(d["tokenizer"]))
        except Exception as e:  # the Rust library's errors are plain Exceptions
            raise ValueError(
                f"not a Hugging Face tokenizer ({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})"
            ) from None
        return _gives_back(BPETokenizer(tok))
    raise ValueError(f"unknown tokenizer kind {reprlib.repr(kind)} (expected 'char' or 'bpe')")


# every ASCII character, and characters of 2, 3 and 4 UTF-8 bytes, among words, spaces and newlines
_PROBE = "".join(map(chr, range(128))) + " héllo wörld  ß\n\n中文 😀x\t 1234 "


def _gives_back(tok: BPETokenizer) -> BPETokenizer:
    """A BPE tokenizer from JSON is charlm's byte-level one: every byte a token, and decode(encode(text)) == text
    (a JSON without its decoder or pre-tokenizer loads, and garbles every text)."""
    if len({b for b in tok._bytes if len(b) == 1}) < 256:
        raise ValueError("a byte-level BPE vocabulary holds all 256 bytes, and this one does not")
    if tok.decode(tok.encode(_PROBE)) != _PROBE:
        raise ValueError("not a byte-level BPE tokenizer: it does not give back the text it encodes")
    return tok


def train_tokenizer(
    kind: str, chunks_factory: Callable[[], Iterable[str]], vocab_size: int | None
) -> CharTokenizer | BPETokenizer:
    """Train a tokenizer of `kind` on the text from chunks_factory() (called once)."""
    if kind == "char":
        return CharTokenizer.train(chunks_factory())
    if kind == "bpe":
        if vocab_size is None:
            raise ValueError("a BPE tokenizer needs a vocab size")
        return BPETokenizer.train(chunks_factory(), vocab_size)
    raise ValueError(f"unknown tokenizer kind {kind!r} (expected 'char' or 'bpe')")
