import hashlib
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CITIZENS, TINY, cli, one_line_error, train_ok

from charlm import data
from charlm.data import (
    Batches,
    CorpusError,
    bits_per_char,
    cache_dir,
    corpus_sha256,
    encode_corpus,
    iter_corpus,
    load_tokens,
    prepare,
    sample_corpus,
)
from charlm.tokenizer import BPETokenizer, CharTokenizer

TEXT = "First line, plain ASCII.\nSecond: 中文 and émoji 😀\n\nThird\tline with tab.\n" * 40


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def read_all(path, **kw) -> str:
    return "".join(iter_corpus(path, **kw))


# ----------------------------------------------------------------------------- iter_corpus


@pytest.mark.parametrize("chunk_chars", [1, 2, 3, 7, 64, 1 << 20])
def test_iter_corpus_chunks_join_to_normalised_text(tmp_path, chunk_chars):
    raw = "a\r\nb\rc\n\r\n\r\rd 中文😀\r\n" * 5 + "end\r"
    p = write(tmp_path, "t.txt", raw.encode("utf-8"))
    chunks = list(iter_corpus(p, chunk_chars=chunk_chars))
    assert "".join(chunks) == raw.replace("\r\n", "\n").replace("\r", "\n")
    assert all(chunks)


def test_iter_corpus_cuts_at_newlines(tmp_path):
    p = write(tmp_path, "t.txt", ("x" * 9 + "\n").encode() * 100)
    chunks = list(iter_corpus(p, chunk_chars=95))
    assert len(chunks) > 5 and all(c.endswith("\n") for c in chunks)


def test_crlf_file_encodes_same_as_lf(tmp_path):
    lf = write(tmp_path, "lf.txt", TEXT.encode())
    crlf = write(tmp_path, "crlf.txt", TEXT.replace("\n", "\r\n").encode())
    tok = CharTokenizer.train(iter_corpus(lf))
    assert "\r" not in tok.chars
    a, b = load_tokens(encode_corpus(lf, tok)), load_tokens(encode_corpus(crlf, tok))
    assert np.array_equal(a, b)


def test_bom_dropped(tmp_path):
    p = write(tmp_path, "bom.txt", b"\xef\xbb\xbfhello\n")
    assert read_all(p) == "hello\n"
    assert read_all(p, chunk_chars=1) == "hello\n"


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda d: d / "missing.txt", "no such file: .*missing.txt"),
        (lambda d: d, "is a directory"),
        (lambda d: write(d, "empty.txt", b""), "empty.txt is empty"),
        (lambda d: write(d, "bom-only.txt", b"\xef\xbb\xbf"), "is empty"),
        (
            lambda d: write(d, "img.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))),
            "img.png looks like a binary file, not text",
        ),
        (lambda d: write(d, "late-nul.txt", b"a" * 10000 + b"\x00"), "binary file.*offset 10000"),
        (lambda d: write(d, "utf16.txt", "hi".encode("utf-16")), "UTF-16.*iconv"),
        (
            lambda d: write(d, "latin1.txt", "café\n".encode() * 300 + "naïve ÿ".encode("latin-1")),
            r"latin1.txt is not UTF-8 text \(invalid byte 0xef at offset 1802\); convert it, e.g. iconv -f latin1 -t utf-8",
        ),
    ],
)
def test_corpus_errors(tmp_path, setup, match):
    path = setup(tmp_path)
    for chunk_chars in (1 << 20, 5):  # the offset must not depend on where blocks are cut
        with pytest.raises(CorpusError, match=match):
            read_all(path, chunk_chars=chunk_chars)


def test_invalid_byte_split_across_blocks(tmp_path):
    # a 3-byte character truncated by a plain ASCII byte, straddling block boundaries
    p = write(tmp_path, "t.txt", b"abcd\xe4\xb8" + b"x")
    for chunk_chars in (1, 2, 5, 6, 100):
        with pytest.raises(CorpusError, match="invalid byte 0xe4 at offset 4"):
            read_all(p, chunk_chars=chunk_chars)
    p = write(tmp_path, "t2.txt", b"abcd\xe4\xb8")  # truncated at end of file
    with pytest.raises(CorpusError, match="invalid byte 0xe4 at offset 4"):
        read_all(p, chunk_chars=3)


def test_corpus_sha256(tmp_path):
    p = write(tmp_path, "t.txt", TEXT.encode())
    assert corpus_sha256(p) == hashlib.sha256(TEXT.encode()).hexdigest()
    big = TEXT.encode() * 400  # several read blocks
    assert corpus_sha256(write(tmp_path, "big.txt", big)) == hashlib.sha256(big).hexdigest()
    with pytest.raises(CorpusError, match="no such file"):
        corpus_sha256(tmp_path / "nope")


# ----------------------------------------------------------------------------- cache


def test_cache_dir(monkeypatch, tmp_path):
    assert cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("CHARLM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "charlm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "charlm"


def test_encode_corpus_cached_and_uint16(tmp_path, cache):
    p = write(tmp_path, "t.txt", TEXT.encode())
    tok = CharTokenizer.train(iter_corpus(p))
    calls = []
    out = encode_corpus(p, tok, progress=lambda done, total: calls.append((done, total)))
    assert out.parent == cache / "tokens" and out.name.startswith(corpus_sha256(p)[:16])
    assert calls and calls[-1] == (p.stat().st_size, p.stat().st_size)
    tokens = load_tokens(out)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16
    assert tok.decode(tokens) == TEXT
    assert not list(out.parent.glob("*.tmp"))

    mtime = out.stat().st_mtime_ns
    calls.clear()
    assert encode_corpus(p, tok, progress=lambda d, t: calls.append(d)) == out
    assert out.stat().st_mtime_ns == mtime and not calls  # reused, not re-encoded

    other = CharTokenizer(tok.chars + ["Ω"])  # a different tokenizer gets its own cache entry
    assert encode_corpus(p, other) != out


def test_encode_corpus_unknown_chars(tmp_path):
    p = write(tmp_path, "t.txt", b"abc xyz\n")
    with pytest.raises(CorpusError, match="characters the tokenizer never saw: 'x', 'y', 'z'"):
        encode_corpus(p, CharTokenizer(list("abc \n")))


def test_prepare_bpe_round_trip_and_tokenizer_cache(tmp_path, cache):
    p = write(tmp_path, "t.txt", TEXT.encode())
    tok, tokens_path, sha = prepare(p, "bpe", 300)
    assert tok.kind == "bpe" and sha == corpus_sha256(p)
    tokens = load_tokens(tokens_path)
    assert tokens.dtype == np.uint16 and len(tokens) < len(TEXT)
    assert tok.decode(tokens) == TEXT
    assert len(list((cache / "tokenizers").glob("*-bpe-300.json"))) == 1

    tok2, tokens_path2, _ = prepare(p, "bpe", 300)  # second run reuses both caches
    assert tok2.to_json() == tok.to_json() and tokens_path2 == tokens_path

    given = CharTokenizer.train([TEXT])  # resuming: the given tokenizer wins
    tok3, tokens_path3, _ = prepare(p, "bpe", 300, tokenizer=given)
    assert tok3 is given and tokens_path3 != tokens_path


def test_prepare_surfaces_corpus_errors(tmp_path):
    p = write(tmp_path, "bad.txt", b"ok\n" * 10 + b"\xff")
    with pytest.raises(CorpusError, match="not UTF-8"):
        prepare(p, "bpe", 300)


@pytest.mark.parametrize("chunk_chars", [7, 64, 1 << 20])
def test_chunked_cache_equals_one_shot_encode(tmp_path, monkeypatch, chunk_chars):
    # the cache is written chunk by chunk; multi-byte characters and CRLFs straddle the read blocks
    raw = ("Ünïcode 中文 and 😀👍🏽\r\nplain ascii line\r\n\r\n" * 60).encode()
    p = write(tmp_path, "t.txt", raw)
    text = raw.decode().replace("\r\n", "\n")
    monkeypatch.setattr(data, "iter_corpus", lambda path, **kw: iter_corpus(path, chunk_chars=chunk_chars, **kw))
    char = CharTokenizer.train([text])
    tokens = load_tokens(encode_corpus(p, char))
    assert tokens.dtype == np.uint16 and tokens.tolist() == char.encode(text)
    # BPE chunks are encoded separately, as before the cache was streamed: ids of the chunks, in order
    bpe = BPETokenizer.train([text], 300)
    tokens = load_tokens(encode_corpus(p, bpe))
    assert tokens.tolist() == [i for c in iter_corpus(p, chunk_chars=chunk_chars) for i in bpe.encode(c)]
    assert bpe.decode(tokens) == text


def test_npy_writer_header_does_not_depend_on_length(tmp_path):
    # the header is written before the length is known, then rewritten in place
    assert len(data._npy_header(0, np.uint16)) == len(data._npy_header(10**15, np.uint32))
    parts = [np.arange(5), np.arange(0), np.arange(70000, 70003)]
    with open(tmp_path / "a.npy", "wb") as f:
        data._write_npy(f, parts, np.uint32)
    a = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert a.dtype == np.uint32 and a.tolist() == [0, 1, 2, 3, 4, 70000, 70001, 70002]


def test_interrupted_encoding_and_leftover_temp_files(tmp_path, cache):
    p = write(tmp_path, "t.txt", TEXT.encode() * 700)  # three 1 MB chunks
    tok = CharTokenizer.train([TEXT])

    def interrupt(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C after the first chunk
        encode_corpus(p, tok, progress=interrupt)
    assert not list((cache / "tokens").iterdir())  # neither a cache entry nor its temp file is left behind
    out = encode_corpus(p, tok)
    out.unlink()
    # a killed run (its pid, or ours reused) leaves garbage in a temp file: the next run is not fooled by it
    for pid in (os.getpid(), 999999):
        out.with_name(f"{out.name}.{pid}.tmp").write_bytes(b"garbage")
    assert encode_corpus(p, tok) == out
    assert np.array_equal(load_tokens(out), np.tile(tok.encode(TEXT), 700))


def test_prepare_hashes_the_corpus_once(tmp_path, monkeypatch):
    p = write(tmp_path, "t.txt", TEXT.encode())
    sha = corpus_sha256(p)
    calls = []
    monkeypatch.setattr(data, "corpus_sha256", lambda path: calls.append(path) or sha)
    for kind in ("char", "bpe"):
        assert prepare(p, kind, 300)[2] == sha
        assert prepare(p, kind, 300)[2] == sha  # cache hit
    assert len(calls) == 4
    tok, tokens_path, given = prepare(p, "char", None, sha256=sha)  # the caller hashed it already: no hashing
    assert len(calls) == 4 and given == sha and tok.decode(load_tokens(tokens_path)) == TEXT


LINES = [f"line {i:05d} 中文 😀 {'x' * (i % 37)}\n" for i in range(1500)]


def test_sample_corpus(tmp_path):
    raw = ("\ufeff" + "".join(LINES)).encode().replace(b"\n", b"\r\n")
    p = write(tmp_path, "t.txt", raw)
    assert "".join(sample_corpus(p, len(raw))) == "".join(LINES)  # small enough: all of it, normalised
    sample = list(sample_corpus(p, 16384, windows=8))
    assert sample == list(sample_corpus(p, 16384, windows=8))  # deterministic
    assert len(sample) == 8 and sum(len(w.encode()) for w in sample) <= 16384
    lines = [line for w in sample for line in w.splitlines(keepends=True)]
    assert set(lines) <= set(LINES)  # whole lines only: nothing cut, CRLF and BOM gone
    numbers = [int(line.split()[1]) for line in lines]
    assert numbers[0] == 0 and numbers[-1] == len(LINES) - 1 and numbers == sorted(numbers)  # spread from start to end
    # a file that is one huge line: the windows are kept whole, minus characters cut at their edges
    p = write(tmp_path, "one-line.txt", "中文😀".encode() * 20000)
    sample = list(sample_corpus(p, 8192, windows=4))
    assert len(sample) == 4 and all(set(w) <= set("中文😀") and len(w.encode()) >= 2048 - 6 for w in sample)


def test_prepare_learns_bpe_from_a_sample_only_above_the_threshold(tmp_path, monkeypatch, cache):
    p = write(tmp_path, "t.txt", "".join(LINES).encode())
    size = p.stat().st_size
    full = BPETokenizer.train(iter_corpus(p), 300).to_json()
    monkeypatch.setattr(data, "BPE_SAMPLE_BYTES", size)
    assert prepare(p, "bpe", 300)[0].to_json() == full
    for _ in range(2):  # deterministic: the same merges from an empty cache again
        shutil.rmtree(cache)
        monkeypatch.setattr(data, "BPE_SAMPLE_BYTES", size - 1)
        tok, tokens_path, _ = prepare(p, "bpe", 300)
        assert tok.to_json() == BPETokenizer.train(sample_corpus(p, size - 1), 300).to_json() != full
        assert tok.decode(load_tokens(tokens_path)) == "".join(LINES)  # the whole corpus is encoded
    monkeypatch.setattr(data, "BPE_SAMPLE_BYTES", 1000)
    assert prepare(p, "char", None)[0].chars == sorted(set("".join(LINES)))  # a char vocabulary sees everything


def test_uint32_for_large_vocab(tmp_path):
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c < 0xE000]
    text = "".join(chars[-5:]) + "\n"
    p = write(tmp_path, "t.txt", text.encode())
    tok = CharTokenizer(chars + ["\n"])
    tokens = load_tokens(encode_corpus(p, tok))
    assert tokens.dtype == np.uint32 and tok.decode(tokens) == text


# ----------------------------------------------------------------------------- batches


def test_split_and_batch_shapes():
    b = Batches(np.arange(1000, dtype=np.uint16), context=8, val_fraction=0.1)
    assert len(b.train) == 900 and len(b.val) == 100 and b.val[0] == 900
    b.check()
    x, y = b.get_batch("train", 4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)  # y is x shifted by one
    assert x.max() < 900
    xv, yv = b.get_batch("val", 64, torch.Generator().manual_seed(0))
    assert xv.min() >= 900 and yv.max() <= 999  # windows stay inside the split


def test_batches_cover_the_ends_of_the_split():
    b = Batches(np.arange(20, dtype=np.uint16), context=4, val_fraction=0.5)
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        _, y = b.get_batch("train", 8, g)
        seen.update(y.flatten().tolist())
    assert seen == set(range(1, 10))  # last train token (9) reachable as a target, never a val token


def test_get_batch_determinism_from_generator_state():
    b = Batches(np.arange(5000, dtype=np.uint16), context=16)
    g = torch.Generator().manual_seed(123)
    b.get_batch("train", 8, g)
    state = g.get_state()
    first = [b.get_batch("train", 8, g) for _ in range(3)]
    g2 = torch.Generator()
    g2.set_state(state)
    again = [b.get_batch("train", 8, g2) for _ in range(3)]
    for (x1, y1), (x2, y2) in zip(first, again):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_get_batch_from_memmap(tmp_path):
    p = tmp_path / "t.npy"
    np.save(p, np.arange(300, dtype=np.uint16))
    b = Batches(load_tokens(p), context=10)
    x, y = b.get_batch("val", 2, torch.Generator().manual_seed(0))
    assert x.dtype == torch.int64 and torch.equal(y[:, :-1], x[:, 1:])


@pytest.mark.parametrize(
    "n, val_fraction, match",
    [
        (2000, 0.1, "corpus too short: 200 tokens of validation text but --context is 256"),
        (2000, 0.0, "corpus too short: 0 tokens of validation text"),
        (260, 0.5, "corpus too short: 130 tokens of training text but --context is 256"),
    ],
)
def test_corpus_too_short(n, val_fraction, match):
    b = Batches(np.zeros(n, dtype=np.uint16), context=256, val_fraction=val_fraction)
    with pytest.raises(CorpusError, match=match + ".*use a smaller --context or a longer text"):
        b.check()


def test_check_accepts_exactly_context_plus_one():
    b = Batches(np.arange(22, dtype=np.uint16), context=10, val_fraction=0.5)
    assert len(b.train) == len(b.val) == 11
    b.check()  # accepted: each split holds exactly one window of context + 1 tokens ...
    x, y = b.get_batch("val", 3, torch.Generator().manual_seed(0))
    assert x.tolist() == [list(range(11, 21))] * 3 and y.tolist() == [list(range(12, 22))] * 3  # ... and it is that one
    with pytest.raises(CorpusError, match="10 tokens of validation text but --context is 10"):  # one token fewer
        Batches(np.arange(21, dtype=np.uint16), context=10, val_fraction=0.5).check()


def test_chars_per_token(tmp_path):
    p = write(tmp_path, "t.txt", TEXT.encode())
    tok, tokens_path, _ = prepare(p, "bpe", 320)
    tokens = load_tokens(tokens_path)
    b = Batches(tokens, context=8, val_fraction=0.5)
    cpt = b.chars_per_token(tok)
    assert cpt == pytest.approx(len(tok.decode(b.val)) / len(b.val)) and cpt > 1.2
    assert b.chars_per_token(tok, split="train", max_tokens=100) == pytest.approx(len(tok.decode(b.train[:100])) / 100)
    char = CharTokenizer.train([TEXT])
    assert Batches(np.zeros(100, dtype=np.uint16), context=8).chars_per_token(char) == 1.0


def test_bits_per_char():
    assert bits_per_char(math.log(2), 1.0) == pytest.approx(1.0)
    assert bits_per_char(2 * math.log(2), 4.0) == pytest.approx(0.5)
    assert bits_per_char(math.log(65), 1.0) == pytest.approx(math.log2(65))


def cache_entry(tmp_path):
    (npy,) = (tmp_path / "cache" / "tokens").glob("*.npy")
    return npy


def test_a_corpus_replaced_while_it_is_read_is_never_cached_under_the_old_hash(corpus, tmp_path, monkeypatch):
    """Regression (item 2): the corpus was hashed, then read again to be encoded; replaced in between (`mv B A`,
    as editors and git checkout save), B's tokens were cached under A's hash, and every later run of A
    trained on B's tokens. Now the bytes encoded are hashed in the same pass: a mismatch caches nothing and
    says what happened."""
    from charlm import data

    other = "Another text entirely, with its own letters: zebra quiz.\n" * 40
    real = data.iter_corpus

    def replaced_after_hashing(path, *args, **kw):  # the file changes between the hash and the encoding
        corpus.write_text(other, encoding="utf-8")
        return real(path, *args, **kw)

    monkeypatch.setattr(data, "iter_corpus", replaced_after_hashing)
    sha = data.corpus_sha256(corpus)
    tok = data.CharTokenizer.train([CITIZENS + other])
    with pytest.raises(data.CorpusError, match="changed while charlm read it"):
        data.encode_corpus(corpus, tok, sha256=sha)
    assert list((tmp_path / "cache").rglob("*.npy")) == []  # nothing cached under the old hash


@pytest.mark.parametrize(
    "damage",
    ["short", "float32", "ids beyond the vocabulary", "other ids", "2-D", "truncated", "garbage", "empty", "object"],
)
def test_a_damaged_cache_entry_is_never_used_but_rebuilt(corpus, tmp_path, damage):
    """Regression (items 3, 10, 12): a damaged token-cache entry was used unchecked (a 5,000-token array under
    a corpus's key trained on "4,500 train tokens"; a float32 array was cast silently) or crashed without
    naming the cache file (ids beyond the vocabulary: IndexError; a truncated .npy: mmap length; garbage:
    pickle ValueError; an empty file: "interrupted", exit 130). Each entry is now checked on read (its
    record, length, dtype, shape, id range) and rebuilt when it is not what its name says."""
    import numpy as np

    train_ok(corpus, tmp_path / "first")
    npy = cache_entry(tmp_path)
    want = np.load(npy).copy()
    if damage == "short":
        np.save(npy, want[:-50])
    elif damage == "float32":
        np.save(npy, want.astype(np.float32))
    elif damage == "ids beyond the vocabulary":
        bad = want.copy()
        bad[5] = 60000
        np.save(npy, bad)
    elif damage == "other ids":  # same length, dtype and id range: only the record's sha256 tells
        np.save(npy, want[::-1].copy())
    elif damage == "2-D":
        np.save(npy, np.stack([want, want]))
    elif damage == "truncated":
        npy.write_bytes(npy.read_bytes()[:200])
    elif damage == "garbage":
        npy.write_bytes(b"\x93NUMPY garbage" * 10)
    elif damage == "empty":
        npy.write_bytes(b"")
    elif damage == "object":
        np.save(npy, np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    r = train_ok(corpus, tmp_path / "second")
    assert f"{len(want) - int(len(want) * 0.1):,} train" in r.output  # the whole corpus, not the damaged entry
    rebuilt = np.load(npy)
    assert rebuilt.dtype == want.dtype and np.array_equal(rebuilt, want)  # rebuilt


def test_a_stale_or_damaged_tokenizer_cache_is_retrained(corpus, tmp_path):
    """Regression (items 12, 21): tokenizer-cache JSON garbage crashed without naming the file, and a stale
    cached tokenizer on a new run said "…instead of resuming". Either is now trained again."""
    train_ok(corpus, tmp_path / "first")
    (tok,) = (tmp_path / "cache" / "tokenizers").glob("*.json")
    for text in ("{garbage", '{"kind": "char", "chars": ["a", "b"]}'):
        tok.write_text(text, encoding="utf-8")
        for npy in (tmp_path / "cache" / "tokens").glob("*"):
            npy.unlink()
        train_ok(corpus, tmp_path / f"again-{len(text)}")


def test_a_cache_that_cannot_be_written_is_named_with_the_real_reason(corpus, tmp_path, monkeypatch):
    """Regression (items 13, 21): CHARLM_CACHE pointing at a plain file or a symlink loop crashed with
    NotADirectoryError or ELOOP from the temp-file clean-up, which hid the real error; a cache that cannot be
    written said "free some space" whatever the reason. Now: one line naming the path, with the advice that
    fits (space only for a full disk)."""
    plain = tmp_path / "plain"
    plain.write_text("x")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for cache in (plain, loop):
        monkeypatch.setenv("CHARLM_CACHE", str(cache))
        err = one_line_error(cli("train", corpus, *TINY, "--steps", "1", "--out", tmp_path / "run"), str(cache))
        assert "free some space" not in err and "unexpected" not in err
