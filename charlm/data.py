"""Corpus -> token ids (encoded once, cached as .npy, memory-mapped) -> random train/val batches."""

from __future__ import annotations

import codecs
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from charlm.tokenizer import BPETokenizer, CharTokenizer, UnknownCharactersError, tokenizer_from_json, train_tokenizer

Tokenizer = CharTokenizer | BPETokenizer
Progress = Callable[[int, int], None]


class CorpusError(Exception):
    """A one-line, user-facing problem with the corpus (or with --context for it)."""


# ----------------------------------------------------------------------------- reading text


def _check_file(path: Path) -> None:
    if not path.exists():
        raise CorpusError(f"no such file: {path}")
    if path.is_dir():
        raise CorpusError(f"{path} is a directory; give the path of a text file")
    if path.stat().st_size == 0:
        raise CorpusError(f"{path} is empty; give a file with some text in it")


def _looks_binary(head: bytes) -> bool:
    # NULs never occur in real text; lots of other control bytes means an image, archive, etc.
    controls = sum(head.count(bytes([b])) for b in (*range(0, 8), *range(14, 27), *range(28, 32)))
    return b"\x00" in head or controls > len(head) // 10


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def iter_corpus(path: str | os.PathLike, chunk_chars: int = 1 << 20) -> Iterator[str]:
    """Stream a UTF-8 text file as ~chunk_chars-character chunks with '\\n' newlines, cut after a newline if possible."""
    path = Path(path)
    _check_file(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    buf, carry, offset, first, any_text = "", "", 0, True, False
    with open(path, "rb") as f:
        head = f.read(8192)
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            raise CorpusError(f"{path} is UTF-16 text, not UTF-8; convert it, e.g. iconv -f utf-16 -t utf-8")
        if _looks_binary(head):
            raise CorpusError(f"{path} looks like a binary file, not text")
        f.seek(0)
        while True:
            block = f.read(chunk_chars)
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
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ----------------------------------------------------------------------------- the token cache


def cache_dir() -> Path:
    if os.environ.get("CHARLM_CACHE"):
        return Path(os.environ["CHARLM_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "charlm"


def _atomic_write(path: Path, write: Callable) -> None:
    """Write via a temp file + os.replace so a crash never leaves a half-written cache entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def encode_corpus(path: str | os.PathLike, tokenizer: Tokenizer, progress: Progress | None = None) -> Path:
    """Encode the corpus once into cache_dir()/tokens/<corpus sha>-<tokenizer sha>.npy and return that path."""
    sha = corpus_sha256(path)
    tok_sha = hashlib.sha256(tokenizer.to_json().encode()).hexdigest()
    out = cache_dir() / "tokens" / f"{sha[:16]}-{tok_sha[:16]}.npy"
    if out.exists():
        return out
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32  # ids go up to vocab_size - 1
    total, done, parts = Path(path).stat().st_size, 0, []
    for chunk in iter_corpus(path):
        try:
            parts.append(tokenizer.encode_array(chunk).astype(dtype))
        except UnknownCharactersError as e:
            shown = ", ".join(repr(c) for c in e.chars[:10])
            raise CorpusError(
                f"{path} has {len(e.chars)} characters the tokenizer never saw: {shown}; "
                "train a new model on this text instead of resuming"
            ) from None
        done += len(chunk.encode("utf-8"))  # approximate: newlines and BOM were normalised
        if progress:
            progress(min(done, total), total)
    tokens = np.concatenate(parts)
    _atomic_write(out, lambda f: np.save(f, tokens))
    if progress:
        progress(total, total)
    return out


def load_tokens(path: str | os.PathLike) -> np.ndarray:
    return np.load(path, mmap_mode="r")


def prepare(
    path: str | os.PathLike,
    kind: str,
    vocab_size: int | None,
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
) -> tuple[Tokenizer, Path, str]:
    """Train (or reuse) the tokenizer and encode the corpus: returns (tokenizer, tokens_path, corpus sha256).

    Pass `tokenizer` when resuming: the checkpoint's tokenizer must be used, not a retrained one.
    """
    sha = corpus_sha256(path)
    if tokenizer is None:
        tok_path = cache_dir() / "tokenizers" / f"{sha[:16]}-{kind}-{vocab_size if kind == 'bpe' else 'all'}.json"
        if tok_path.exists():
            tokenizer = tokenizer_from_json(tok_path.read_text(encoding="utf-8"))
        else:
            tokenizer = train_tokenizer(kind, lambda: iter_corpus(path), vocab_size)
            _atomic_write(tok_path, lambda f: f.write(tokenizer.to_json().encode("utf-8")))
    return tokenizer, encode_corpus(path, tokenizer, progress), sha


# ----------------------------------------------------------------------------- batches


@dataclass
class Batches:
    """Train/val split of a (memory-mapped) token array; samples random windows of context+1 tokens."""

    tokens: np.ndarray
    context: int
    val_fraction: float = 0.1
    train: np.ndarray = field(init=False, repr=False)
    val: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        n_val = int(len(self.tokens) * self.val_fraction)
        self.train = self.tokens[: len(self.tokens) - n_val]  # slices of a memmap stay memory-mapped
        self.val = self.tokens[len(self.tokens) - n_val :]

    def check(self) -> None:
        for name, data in (("training", self.train), ("validation", self.val)):
            if len(data) < self.context + 1:
                raise CorpusError(
                    f"corpus too short: {len(data)} tokens of {name} text but --context is {self.context}; "
                    "use a smaller --context or a longer text"
                )

    def get_batch(
        self, split: str, batch_size: int, generator: torch.Generator, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: int64 (B, context); y is x shifted left by one token."""
        data = {"train": self.train, "val": self.val}[split]
        T = self.context
        # offsets come from the torch generator, so restoring its state replays the exact batches
        ix = torch.randint(len(data) - T, (batch_size,), generator=generator).tolist()
        w = torch.from_numpy(np.stack([data[i : i + T + 1] for i in ix]).astype(np.int64))  # (B, T+1)
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
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


def bits_per_char(loss_nats_per_token: float, chars_per_token: float) -> float:
    return loss_nats_per_token / math.log(2) / chars_per_token
