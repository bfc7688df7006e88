"""Corpus -> token ids (encoded once, cached as .npy, memory-mapped) -> random train/val batches.

Over ~450 lines on purpose: the one path from a text file to batches (read once, streamed, hashed, encoded,
cached, split), and the conversions every measurement uses (bits_per_char, a lab run's trained positions)."""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from charlm import files
from charlm.errors import ConfigError, UserError
from charlm.settings import shown
from charlm.tokenizer import BPETokenizer, CharTokenizer, UnknownCharactersError, tokenizer_from_json, train_tokenizer

if TYPE_CHECKING:
    import torch

Tokenizer = CharTokenizer | BPETokenizer
Progress = Callable[[int, int], None]


class CorpusError(UserError):
    """A one-line, user-facing problem with the corpus (or with --context for it)."""


# ----------------------------------------------------------------------------- reading text


def _check_file(path: Path) -> None:
    if not path.exists():
        raise CorpusError(f"no such file: {path}")
    if path.is_dir():
        raise CorpusError(f"{path} is a directory; give the path of a text file")
    if not path.is_file():  # a FIFO, pipe or device: no size to check, and reading it may never end
        raise CorpusError(f"{path} is not a regular file; give the path of a text file")
    if path.stat().st_size == 0:
        raise CorpusError(f"{path} is empty; give a file with some text in it")


def _open_text(path: Path):
    """The corpus file opened through files.open_read: never waits on a FIFO swapped in after the checks."""
    try:
        return files.open_read(path, "corpus")
    except files.ReadError as e:
        raise CorpusError(str(e)) from None


def _looks_binary(head: bytes) -> bool:
    # NULs never occur in real text; lots of other control bytes means an image, archive, etc.
    controls = sum(head.count(bytes([b])) for b in (*range(0, 8), *range(14, 27), *range(28, 32)))
    return b"\x00" in head or controls > len(head) // 10


def _normalise(text: str) -> str:
    if "\r" not in text:  # the common case, at memchr speed instead of two copies of the text
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def iter_corpus(path: str | os.PathLike, chunk_chars: int = 1 << 20, digest=None) -> Iterator[str]:
    """Stream a UTF-8 text file as ~chunk_chars-character chunks with '\\n' newlines, cut after a newline if possible.
    digest (a hashlib object), if given, is updated with every byte read, in the same pass."""
    path = Path(path)
    _check_file(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    buf, carry, offset, first, any_text = "", "", 0, True, False
    with _open_text(path) as f:
        head = f.read(8192)
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            raise CorpusError(f"{path} is UTF-16 text, not UTF-8; convert it, e.g. iconv -f utf-16 -t utf-8")
        if _looks_binary(head):
            raise CorpusError(f"{path} looks like a binary file, not text")
        f.seek(0)
        while True:
            block = f.read(chunk_chars)
            if digest is not None:
                digest.update(block)
            final = not block
            if b"\x00" in block:
                at = offset + block.index(b"\x00")
                raise CorpusError(f"{path} looks like a binary file, not text (NUL byte at offset {at})")
            pending = len(decoder.getstate()[0])  # bytes of a split character held over from the last block
            try:
                text = decoder.decode(block, final=final)
            except UnicodeDecodeError as e:
                at = offset - pending + e.start
                raise CorpusError(
                    f"{path} is not UTF-8 text (invalid byte 0x{e.object[e.start]:02x} at offset {at}); "
                    "convert it, e.g. iconv -f latin1 -t utf-8"
                ) from None
            offset += len(block)
            if first and text:
                text = text.removeprefix("\ufeff")  # a BOM is an encoding marker, not text
                first = False
            text, carry = carry + text, ""
            if text.endswith("\r") and not final:  # its \n may start the next block
                text, carry = text[:-1], "\r"
            buf += _normalise(text)
            while len(buf) >= chunk_chars or (final and buf):
                cut = len(buf) if final else buf.rfind("\n", 0, chunk_chars) + 1 or chunk_chars
                yield buf[:cut]
                any_text = True
                buf = buf[cut:]
            if final:
                break
    if not any_text:
        raise CorpusError(f"{path} is empty; give a file with some text in it")


def corpus_sha256(path: str | os.PathLike) -> str:
    path = Path(path)
    _check_file(path)
    try:
        return files.sha256(path, "corpus")
    except files.ReadError as e:
        raise CorpusError(str(e)) from None


BPE_SAMPLE_BYTES = 16 << 20  # BPE merges are learnt from at most this much text (see sample_corpus)


def sample_corpus(path: str | os.PathLike, max_bytes: int = BPE_SAMPLE_BYTES, windows: int = 64) -> Iterator[str]:
    """The whole text if the file is at most max_bytes; else `windows` evenly spaced stretches of it, max_bytes
    in all, each trimmed to whole lines: a deterministic sample of a huge corpus to learn BPE merges from.

    Learning merges from all of a 110 MB file took a third of its first run, for merges that barely change
    (benchmarks/notes-corpus.md). Errors in the file are left to the encoding pass, which reads all of it.
    """
    path = Path(path)
    _check_file(path)
    size = path.stat().st_size
    if size <= max_bytes:
        yield from iter_corpus(path)
        return
    window = max(1, max_bytes // windows)
    with _open_text(path) as f:
        for i in range(windows):
            f.seek(i * (size - window) // max(windows - 1, 1))  # the first window at the start, the last at the end
            block = f.read(window)
            # whole lines only, so no character or word is cut; a window inside one huge line is kept whole
            start, end = (block.find(b"\n") + 1 if i else 0), block.rfind(b"\n") + 1
            if end <= start:
                start, end = 0, len(block)
            text = block[start:end].decode("utf-8", errors="ignore")  # drops characters cut at the edges
            yield _normalise(text.removeprefix("\ufeff") if i == 0 else text)


# ----------------------------------------------------------------------------- the token cache


def cache_dir() -> Path:
    """$CHARLM_CACHE (a leading ~ expanded, as a shell would have), else $XDG_CACHE_HOME/charlm or
    ~/.cache/charlm. A relative CHARLM_CACHE is refused: it would be a different cache in every directory
    (and a quoted '~/x' a directory named '~')."""
    if given := os.environ.get("CHARLM_CACHE"):
        path = Path(os.path.expanduser(given))  # (Path.expanduser raises for an unknown ~user)
        if not path.is_absolute():
            raise ConfigError(
                f"CHARLM_CACHE must be an absolute path, got {shown(given)}: set it to one, e.g. ~/.cache/charlm"
            )
        return path
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "charlm"


def _npy_header(n: int, dtype: np.dtype) -> bytes:
    # numpy pads the header to a fixed length for any 1-D shape below 10**21 elements (so that it can be
    # rewritten in place when an array grows), which lets us write it again once the length is known
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (n,)}
    )
    return buf.getvalue()


def _write_npy(f, arrays: Iterable[np.ndarray], dtype: np.dtype, digest=None) -> int:
    """Stream 1-D arrays into one .npy file: memory holds one array at a time, never all of them. Returns
    how many elements were written; digest (a hashlib object), if given, gets the bytes of the elements."""
    f.write(_npy_header(0, dtype))  # a placeholder of the same length
    n = 0
    for a in arrays:
        data = np.ascontiguousarray(a, dtype=dtype).data
        f.write(data)
        if digest is not None:
            digest.update(data)
        n += len(a)
    f.seek(0)
    f.write(_npy_header(n, dtype))
    return n


def _write_cache(path: Path, write: Callable) -> None:
    """An atomic write into the cache (a crash never leaves a half-written entry); a full disk says where the
    cache is and how to move it."""
    try:
        files.atomic_write(path, write, parents=True)
    except files.WriteError as e:
        hint = (
            "free some space, or set CHARLM_CACHE to a disk with room"
            if e.full
            else "remove it, or set CHARLM_CACHE elsewhere"  # a FIFO, a link, a directory: never replaced
            if files.not_regular(path)
            else "set CHARLM_CACHE elsewhere"
        )
        raise files.WriteError(f"{e} (the token cache): {hint}", e.path, e.full) from None


class UnknownCharacters(CorpusError):
    """The tokenizer cannot encode the corpus: it has characters the tokenizer never saw."""


def token_cache(sha256: str, tokenizer: Tokenizer) -> Path:
    """Where the token ids of the corpus with this sha256, encoded by this tokenizer, are cached. Beside it,
    <same name>.json records what a reader checks the entry against (see cached_tokens)."""
    tok_sha = hashlib.sha256(tokenizer.to_json().encode()).hexdigest()
    return cache_dir() / "tokens" / f"{sha256[:16]}-{tok_sha[:16]}.npy"


def _token_dtype(tokenizer: Tokenizer) -> np.dtype:
    return np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)  # ids go up to vocab_size - 1


CACHE_RECORD_BYTES = 4096  # a cache entry's .json record is a line of ~150 bytes


def cached_tokens(path: Path, tokenizer: Tokenizer, sha256: str) -> np.ndarray | None:
    """The cache entry at path (memory-mapped) if it is what its name says: written whole by encode_corpus
    (its record is there and names this corpus), a 1-D array of the tokenizer's dtype, as many ids as the
    record says, whose bytes have the sha256 the record says, every id below the vocabulary size. None
    otherwise (absent, cut short, replaced, damaged): the caller encodes the corpus again. (Reading it all
    once costs ~0.1 s for 100 MB of text.)"""
    try:
        record = json.loads(
            files.read_bounded(path.with_suffix(".json"), CACHE_RECORD_BYTES, "token cache record", links=False)
        )
        tokens = load_tokens(path, links=False)
    except Exception:  # numpy's reader of a damaged header raises ValueError, EOFError, SyntaxError, TokenError...
        return None  # whatever it is, the entry is rebuilt
    if (
        not isinstance(record, dict)
        or record.get("corpus_sha256") != sha256
        or not isinstance(tokens, np.ndarray)
        or tokens.ndim != 1
        or tokens.dtype != _token_dtype(tokenizer)
        or record.get("tokens") != len(tokens)
    ):
        return None
    digest = hashlib.sha256()
    for at in range(0, len(tokens), 1 << 24):  # a slice at a time: a huge entry is never all in memory
        part = np.ascontiguousarray(tokens[at : at + (1 << 24)])
        if int(part.max()) >= tokenizer.vocab_size:
            return None
        digest.update(part.data)
    return tokens if record.get("tokens_sha256") == digest.hexdigest() else None


def encode_corpus(
    path: str | os.PathLike, tokenizer: Tokenizer, progress: Progress | None = None, sha256: str | None = None
) -> Path:
    """Encode the corpus once into token_cache(...) and return that path (an entry already there is used if
    cached_tokens accepts it, else written again).

    Pass `sha256` (the corpus's corpus_sha256) when you have it, to spare hashing the file again. The bytes
    encoded are hashed as they are read, in the same pass: if they are not the ones that sha256 names (the
    file was replaced or changed meanwhile, as an editor's save or `git checkout` do), nothing is cached and
    a CorpusError says so, so a cache entry always holds the tokens of the text its name says.
    """
    sha = sha256 or corpus_sha256(path)
    out = token_cache(sha, tokenizer)
    if cached_tokens(out, tokenizer, sha) is not None:
        return out
    dtype = _token_dtype(tokenizer)
    total = Path(path).stat().st_size
    read, written = hashlib.sha256(), hashlib.sha256()  # the text's bytes, and the tokens'

    def encoded() -> Iterator[np.ndarray]:
        done = 0
        for chunk in iter_corpus(path, digest=read):
            try:
                yield tokenizer.encode_array(chunk)
            except UnknownCharactersError as e:
                shown = ", ".join(repr(c) for c in e.chars[:10])
                raise UnknownCharacters(
                    f"{path} has {len(e.chars)} characters the tokenizer never saw: {shown}; "
                    "train a new model on this text instead of resuming"
                ) from None
            done += len(chunk.encode("utf-8"))  # approximate: newlines and BOM were normalised
            if progress:
                progress(min(done, total), total)

    def write(f) -> None:
        count[0] = _write_npy(f, encoded(), dtype, written)
        if read.hexdigest() != sha:  # raised inside the write: the entry is never made
            raise CorpusError(f"{path} changed while charlm read it: run the command again once it stays the same")

    count = [0]
    _write_cache(out, write)
    record = {"corpus_sha256": sha, "tokens": count[0], "tokens_sha256": written.hexdigest(), "dtype": dtype.name}
    _write_cache(out.with_suffix(".json"), lambda f: f.write(json.dumps(record).encode("utf-8")))
    if progress:
        progress(total, total)
    return out


def load_tokens(path: str | os.PathLike, links: bool = True) -> np.ndarray:
    """A .npy array of token ids, memory-mapped from the file files.open_read opened and checked (np.load
    would open the path again, and wait for ever on a FIFO put there)."""
    with files.open_read(path, "token cache", links) as f:
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f"token cache {path} is a .npy file of version {version}, not one charlm writes")
        shape, fortran, dtype = read_header[version](f)
        if dtype.hasobject or fortran:
            raise ValueError(f"token cache {path} does not hold token ids")
        if math.prod(shape) == 0:
            return np.empty(shape, dtype)
        return np.memmap(f, dtype=dtype, mode="r", offset=f.tell(), shape=shape)


def _cached_tokenizer(path: Path) -> Tokenizer | None:
    """The tokenizer cached at path, or None where there is none or it is not one (damaged, cut short)."""
    try:
        return tokenizer_from_json(files.read_bounded(path, 64 << 20, "tokenizer cache", links=False).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):  # read_bounded's errors (absent, a FIFO...) are ValueErrors too
        return None


def prepare(
    path: str | os.PathLike,
    kind: str,
    vocab_size: int | None,
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
    sha256: str | None = None,
) -> tuple[Tokenizer, Path, str]:
    """Train (or reuse) the tokenizer and encode the corpus: returns (tokenizer, tokens_path, corpus sha256).

    Pass `tokenizer` when resuming: the checkpoint's tokenizer must be used, not a retrained one; and
    `sha256` when the caller already hashed the file (the file is then not hashed at all here).
    A BPE tokenizer learns its merges from sample_corpus(): all the text up to BPE_SAMPLE_BYTES, a sample above.
    A cached tokenizer that is damaged, or cannot encode the text (it was cached for other text), is trained
    again; a new one is cached only once the corpus encoded to the hash it was read under.
    """
    sha = sha256 or corpus_sha256(path)
    for directory in ("tokenizers", "tokens"):  # what encodings killed part-way left behind
        files.remove_dead_temps(cache_dir() / directory)
    if tokenizer is not None:
        return tokenizer, encode_corpus(path, tokenizer, progress, sha256=sha), sha
    tok_path = cache_dir() / "tokenizers" / f"{sha[:16]}-{kind}-{vocab_size if kind == 'bpe' else 'all'}.json"
    if (cached := _cached_tokenizer(tok_path)) is not None and cached.kind == kind:
        try:
            return cached, encode_corpus(path, cached, progress, sha256=sha), sha
        except UnknownCharacters:  # cached for another text: train one for this text
            pass
    # a char vocabulary must see every character; BPE merges only need representative text
    text = (lambda: sample_corpus(path, BPE_SAMPLE_BYTES)) if kind == "bpe" else (lambda: iter_corpus(path))
    tokenizer = train_tokenizer(kind, text, vocab_size)
    tokens = encode_corpus(path, tokenizer, progress, sha256=sha)
    _write_cache(tok_path, lambda f: f.write(tokenizer.to_json().encode("utf-8")))
    return tokenizer, tokens, sha


# ----------------------------------------------------------------------------- batches


@dataclass
class Batches:
    """Train/val split of a (memory-mapped) token array; samples random windows of context+1 tokens.

    Two optional arrays, aligned with the tokens, pose a task example by example (charlm lab):
      starts  offsets where an example begins: windows begin there only (each row starts at an example)
      mask    True where a token is a target to learn; y holds -1 at the others, which the loss ignores
    With either, only windows that hold a target are drawn. Without both, nothing changes."""

    tokens: np.ndarray
    context: int
    val_fraction: float = 0.1
    starts: np.ndarray | None = None
    mask: np.ndarray | None = None
    train: np.ndarray = field(init=False, repr=False)
    val: np.ndarray = field(init=False, repr=False)
    windows: dict | None = field(init=False, repr=False)  # split -> offsets a window may start at (aligned only)

    def __post_init__(self):
        n_val = int(len(self.tokens) * self.val_fraction)
        self.train = self.tokens[: len(self.tokens) - n_val]  # slices of a memmap stay memory-mapped
        self.val = self.tokens[len(self.tokens) - n_val :]
        self.windows = None
        if self.starts is not None or self.mask is not None:
            if self.mask is not None and len(self.mask) != len(self.tokens):
                raise CorpusError(f"the target mask has {len(self.mask)} entries for {len(self.tokens)} tokens")
            cut = len(self.train)
            self.windows = {"train": self._windows(0, cut), "val": self._windows(cut, len(self.tokens))}

    def _windows(self, lo: int, hi: int) -> np.ndarray:
        """Offsets (relative to the split tokens[lo:hi]) of windows that fit in it and hold a target."""
        T = self.context
        if self.starts is None:
            offsets = np.arange(max(hi - lo - T, 0))
        else:
            starts = np.asarray(self.starts, dtype=np.int64)
            offsets = starts[(starts >= lo) & (starts < hi)] - lo
        offsets = offsets[offsets + T + 1 <= hi - lo]
        if self.mask is not None:  # targets among tokens s+1 .. s+T of each window, from a running count
            count = np.concatenate([[0], np.cumsum(np.asarray(self.mask[lo:hi], dtype=np.int64))])
            offsets = offsets[count[offsets + T + 1] - count[offsets + 1] > 0]
        return offsets

    def check(self) -> None:
        for name, data in (("training", self.train), ("validation", self.val)):
            if len(data) < self.context + 1:
                raise CorpusError(
                    f"corpus too short: {len(data)} tokens of {name} text but --context is {self.context}; "
                    "use a smaller --context or a longer text"
                )
        for split, offsets in (self.windows or {}).items():
            if len(offsets) == 0:
                raise CorpusError(
                    f"no window of {self.context + 1} tokens in the {split} split starts at an example and "
                    "holds a target: use a larger --context or more examples"
                )

    def get_batch(
        self, split: str, batch_size: int, generator: torch.Generator, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: int64 (B, context); y is x shifted left by one token (-1 where the mask says: no target)."""
        import torch  # (here, not at the top: the commands that only read files never load torch)

        data = {"train": self.train, "val": self.val}[split]
        T = self.context
        # offsets come from the torch generator, so restoring its state replays the exact batches
        if self.windows is None:
            ix = torch.randint(len(data) - T, (batch_size,), generator=generator).tolist()
        else:
            offsets = self.windows[split]
            ix = offsets[torch.randint(len(offsets), (batch_size,), generator=generator).numpy()].tolist()
        w = torch.from_numpy(np.stack([data[i : i + T + 1] for i in ix]).astype(np.int64))  # (B, T+1)
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        if self.mask is not None:
            mask = self.mask[: len(self.train)] if split == "train" else self.mask[len(self.train) :]
            keep = torch.from_numpy(np.stack([mask[i + 1 : i + T + 1] for i in ix]).astype(bool))
            y = y.masked_fill(~keep, -1)
        if torch.device(device).type == "cuda":
            # pinned memory lets the copy overlap with compute
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    def chars_per_token(self, tokenizer: Tokenizer, split: str = "val", max_tokens: int = 1_000_000) -> float:
        """Average characters per token on (a prefix of) a split, to turn loss per token into bits per char."""
        ids = np.asarray({"train": self.train, "val": self.val}[split][:max_tokens])
        if tokenizer.kind == "char" or len(ids) == 0:
            return 1.0
        return len(tokenizer.decode(ids)) / len(ids)


TARGETS = "targets.npy"  # next to a lab run's corpus.txt: its mask (True where the task determines the character)
READS = "reads.txt"  # beside TARGETS where a lab run's model reads a filler in place of each target: that character


def trained_positions(corpus_txt: Path, ids: list[int], tokenizer) -> np.ndarray | None:
    """Which of ids (the encoded start of a lab run's corpus.txt, one token a character) the run was trained to
    predict: its targets mask cut to them; None for a run without one (not a lab run, or not a char model)."""
    targets = Path(corpus_txt).parent / TARGETS
    if not targets.is_file() or tokenizer.kind != "char":
        return None
    try:
        mask = np.load(targets, allow_pickle=False)[: len(ids)]
    except Exception as e:  # empty (EOFError), garbage, an object array (ValueError): damaged
        raise ConfigError(
            f"{targets} is damaged ({type(e).__name__}): train the lab run again, or remove it to score "
            f"{corpus_txt} as plain text"
        ) from None
    return mask if len(mask) == len(ids) and mask.dtype == bool else None


def filler(corpus_txt: Path, tokenizer) -> int | None:
    """The token a lab run's model reads in place of each of its targets (READS beside its corpus.txt: recall's
    answers are never an input); None where it reads the text as written (no READS: not such a task, or a run
    saved before charlm kept it)."""
    reads = Path(corpus_txt).parent / READS
    if not reads.exists() or tokenizer.kind != "char":
        return None
    try:
        text = files.read_bounded(reads, 16, "the lab run's filler").decode("utf-8", errors="replace")
    except files.ReadError as e:
        raise ConfigError(f"{e}: train the lab run again") from None
    ids = tokenizer.encode(text, unknown="drop")
    if len(text) != 1 or len(ids) != 1:
        raise ConfigError(
            f"{reads} is damaged (it holds the one character the model reads in place of each answer): train the "
            "lab run again"
        )
    return ids[0]


def model_input(ids, mask, fill: int | None):
    """What a model trained with a filler reads of ids (a list or an array): ids with `fill` wherever mask (bool,
    aligned with ids) marks a target; ids themselves where fill or mask is None. The one place this is done:
    the lab trains (training.FilledBatches, forgetting) and scores (lab ablate, explore) through it."""
    if fill is None or mask is None:
        return ids
    out = np.where(np.asarray(mask, dtype=bool), fill, np.asarray(ids))
    return out.tolist() if isinstance(ids, list) else out


def bits_per_char(nats: float, chars_per_token: float = 1.0, *, chars: float | None = None) -> float:
    """The one conversion to bits per character: a loss in nats per token and the characters per token,
    or a total of nats over `chars` characters (or bytes, for bits per byte)."""
    return nats / math.log(2) / (chars if chars is not None else chars_per_token)
