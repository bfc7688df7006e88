import json
import random
import re

import numpy as np
import pytest
from tokenizers import pre_tokenizers

from charlm.tokenizer import (
    BYTE_DECODER,
    PIECE_CHARS,
    BPETokenizer,
    CharTokenizer,
    UnknownCharactersError,
    _pieces,
    tokenizer_from_json,
    train_tokenizer,
)

SAMPLES = [
    "hello world, the cat sat on the mat.\n",
    "  leading and trailing spaces  \n\n\ttabs\t",
    "中文文本：你好，世界！",
    "مرحبا بالعالم",
    "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧",
    "combining e\u0301 a\u0308 and precomposed é ä",
    "def f(x):\n    return {'a': [x ** 2 for _ in range(3)]}  # code\n",
    "control \x00 \x1b[31mred\x1b[0m \x07 \r\n \r lone CR \x7f \u2028 \ufeff \u200b",
    "mixed: Ελληνικά Русский 日本語 한국어 हिन्दी",
]
CORPUS = "".join(SAMPLES) * 3


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train([CORPUS, "the quick brown fox jumps over the lazy dog\n" * 50], vocab_size=400)


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return CharTokenizer.train([CORPUS])


@pytest.mark.parametrize("text", SAMPLES + [""])
def test_char_round_trip(char, text):
    ids = char.encode(text)
    assert char.decode(ids) == text
    assert char.encode_array(text).tolist() == ids
    assert b"".join(char.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_char_vocab_is_sorted_set():
    tok = CharTokenizer.train(["cab", "ba\n"])
    assert tok.chars == ["\n", "a", "b", "c"]
    assert tok.vocab_size == 4
    assert tok.encode("abc\n") == [1, 2, 3, 0]


@pytest.mark.parametrize("text", SAMPLES + ["", "x", "unseen text: ÆØÅ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦀 ሰላም"])
def test_bpe_round_trip(bpe, text):
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert b"".join(bpe.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_bpe_encode_array_matches_encode(bpe):
    # encode_array splits the text into pieces for speed; that must not change the ids
    rng = random.Random(0)
    words = ["the", "cat", " ", "  ", "\n", " \n", "\n\n", "\t", "你好", "😀", "x,", "'s", "\r"]
    text = "".join(rng.choice(words) for _ in range(5000))
    arr = bpe.encode_array(text)
    assert arr.dtype.kind in "iu"
    assert arr.tolist() == bpe.encode(text)


def test_bpe_encode_array_in_pieces_matches_encode(bpe):
    # a long text is cut into pieces of >= PIECE_CHARS at "X\nY" boundaries; blank lines and indents are never cut
    rng = random.Random(2)
    lines = ["the cat", "  indented", "", "\t", "你好 😀", "x,'s", " "]
    text = "\n".join(rng.choice(lines) for _ in range(12000))
    pieces = _pieces(text, 1000)
    assert "".join(pieces) == text and len(pieces) > 50
    assert all(len(piece) >= 1000 and re.search(r"\S\n$", piece) for piece in pieces[:-1])
    assert all(re.match(r"\S", piece) for piece in pieces[1:])
    assert len(text) > 2 * PIECE_CHARS and bpe.encode_array(text).tolist() == bpe.encode(text)
    assert _pieces("short") == ["short"] and _pieces("") == [""]


def test_char_train_and_lookup_match_a_set_of_characters():
    # the vocabulary pass takes an ASCII shortcut and the lookup table stops at the largest known code point
    chunks = ["plain ascii\n", "more ascii, new: {}", "中文 😀", "", "ascii again ~", "a\udc80b", "\x00\x7f"]
    tok = CharTokenizer.train(chunks)
    assert tok.chars == sorted(set("".join(chunks)))
    text = "".join(chunks)
    assert tok.encode(text) == [tok.chars.index(c) for c in text]
    small = CharTokenizer(list("ac"))  # 'b' falls between known code points, '😀' beyond the largest
    assert small.encode("abc😀", unknown="drop") == [0, 1] and small.encode("abc😀", unknown="replace") == [0, 0, 1, 0]
    with pytest.raises(UnknownCharactersError, match="'b', '😀'"):
        small.encode_array("abc😀")


def test_bpe_decode_of_any_ids_matches_token_bytes(bpe):
    # decode must agree with the streaming path, even for ids that split a UTF-8 character
    rng = random.Random(1)
    for _ in range(200):
        ids = [rng.randrange(bpe.vocab_size) for _ in range(rng.randrange(1, 8))]
        expected = b"".join(bpe.token_bytes(i) for i in ids).decode("utf-8", errors="replace")
        assert bpe.decode(ids) == expected


def test_bpe_vocab_and_alphabet(bpe):
    assert 256 < bpe.vocab_size <= 400
    assert set(BYTE_DECODER) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(bpe.token_bytes(i) for i in range(bpe.vocab_size) if len(bpe.token_bytes(i)) == 1) == [
        bytes([b]) for b in range(256)
    ]
    assert len(bpe.encode("the quick brown fox")) < len("the quick brown fox")  # merges were learned


def test_bpe_min_vocab():
    with pytest.raises(ValueError, match="at least 257"):
        BPETokenizer.train(["abc"], vocab_size=256)
    assert BPETokenizer.train(["abc abc"], vocab_size=257).vocab_size == 257


def test_bpe_ignores_unknown_policy_and_survives_surrogates(bpe):
    assert bpe.encode("héllo", unknown="error") == bpe.encode("héllo", unknown="drop")
    assert bpe.decode(bpe.encode("a\udc80b")) == "a\ufffdb"


def test_unknown_error_lists_chars_in_order(char):
    with pytest.raises(UnknownCharactersError) as info:
        char.encode("hi ⅀ there ⅀ \x01 ⅀")
    assert info.value.chars == ["⅀", "\x01"]
    msg = str(info.value)
    assert "prompt has 2 characters the model never saw: '⅀', '\\x01'" in msg
    assert "--unknown drop" in msg and "--unknown replace" in msg
    assert isinstance(info.value, ValueError)


def test_unknown_drop_and_replace(char):
    text = "a⅀b"
    assert char.decode(char.encode(text, unknown="drop")) == "ab"
    assert char.decode(char.encode(text, unknown="replace")) == "a b"
    with pytest.raises(UnknownCharactersError):
        char.encode_array(text)
    with pytest.raises(ValueError, match="unknown must be"):
        char.encode("a", unknown="ignore")


def test_unknown_replace_fallbacks():
    assert CharTokenizer(["a", "?"]).encode("a!", unknown="replace") == [0, 1]
    assert CharTokenizer(["b", "a"]).encode("a!", unknown="replace") == [1, 0]


def test_char_lone_surrogate_is_unknown(char):
    assert char.encode("a\udc80b", unknown="drop") == char.encode("ab")


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_json_round_trip(which, char, bpe):
    tok = {"char": char, "bpe": bpe}[which]
    s = tok.to_json()
    again = tokenizer_from_json(s)
    assert type(again) is type(tok) and again.kind == which
    assert again.to_json() == s  # stable, so its hash can key the token cache
    assert again.vocab_size == tok.vocab_size
    for text in SAMPLES:
        assert again.encode(text) == tok.encode(text)


def test_json_wrong_kind(char, bpe):
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_json('{"kind": "pickle"}')


def test_train_tokenizer():
    chunks = lambda: iter(["some text ", "more text\n"] * 20)  # noqa: E731
    assert train_tokenizer("char", chunks, None).kind == "char"
    tok = train_tokenizer("bpe", chunks, 300)
    assert tok.kind == "bpe" and tok.decode(tok.encode("some more")) == "some more"
    with pytest.raises(ValueError):
        train_tokenizer("bpe", chunks, None)
    with pytest.raises(ValueError):
        train_tokenizer("word", chunks, None)


def test_decode_accepts_numpy(char, bpe):
    for tok in (char, bpe):
        ids = tok.encode("the cat")
        assert tok.decode(np.array(ids, dtype=np.uint16)) == "the cat"


TOKENIZERS = [
        ("[]", "unknown tokenizer kind None"),  # AttributeError: 'list' object has no attribute 'get'
        ('{"kind": "char", "chars": 5}', "a char vocabulary must be"),  # TypeError: 'int' object is not iterable
        ('{"kind": "char", "chars": [1, 2]}', "a char vocabulary must be"),  # TypeError: len() of an int
        ('{"kind": "char"}', "a char vocabulary must be"),  # KeyError: 'chars'
        ('{"kind": "char", "chars": ["a", "\\ud800"]}', "a char vocabulary must be"),  # accepted; printing failed
        ('{"kind": "bpe"}', "a BPE tokenizer holds a Hugging Face tokenizer"),  # KeyError: 'tokenizer'
        ('{"kind": "bpe", "tokenizer": {}}', "not a Hugging Face tokenizer"),  # the library's bare Exception
        ("[" * 100_000, "a tokenizer is JSON, and this is not (RecursionError)"),  # RecursionError
]  # fmt: skip


@pytest.mark.parametrize("text, message", TOKENIZERS, ids=[t[:24] for t, _ in TOKENIZERS])
def test_a_bad_tokenizer_is_a_value_error(text, message):
    """Property tests: tokenizer_from_json raised AttributeError, TypeError, KeyError or the tokenizers
    library's bare Exception on JSON that is not a tokenizer (a damaged token cache, data.prepare, was then an
    "unexpected" error); it is a ValueError that says what is wrong."""
    with pytest.raises(ValueError) as e:
        tokenizer_from_json(text)
    assert type(e.value) is ValueError and message in str(e.value) and "\n" not in str(e.value)


def test_a_char_of_an_undecodable_byte_has_its_byte():
    """The tokenizer property test: a char vocabulary may hold surrogateescape's U+DC80-U+DCFF (they stay
    allowed), but token_bytes raised UnicodeEncodeError for one: the streaming output of every token."""
    tok = tokenizer_from_json(json.dumps({"kind": "char", "chars": ["a", "\udcff"]}))
    assert tok.token_bytes(1) == b"\xff" and tok.decode([0, 1]) == "a\udcff"


@pytest.mark.parametrize("drop", ["decoder", "pre_tokenizer", "byte"])
def test_a_bpe_tokenizer_that_garbles_text_is_refused(drop):
    """The tokenizer property test: a BPE JSON without its decoder (or pre-tokenizer) loaded, and gave back
    "0 0" for "00"; one without a byte's token dropped that byte from every text. Both are refused now."""
    d = json.loads(BPETokenizer.train(["abcabc abab"] * 20, vocab_size=260).to_json())
    if drop == "byte":
        del d["tokenizer"]["model"]["vocab"]["!"]
        d["tokenizer"]["model"]["vocab"] = {k: i for i, k in enumerate(d["tokenizer"]["model"]["vocab"])}
        d["tokenizer"]["model"]["merges"] = []
    else:
        d["tokenizer"][drop] = None
    with pytest.raises(ValueError, match="all 256 bytes|does not give back the text it encodes"):
        tokenizer_from_json(json.dumps(d))


def test_a_bpe_vocabulary_with_a_gap_is_a_value_error():
    """A BPE vocabulary that skips an id (id_to_token is None there): TypeError building the token table."""
    tok = BPETokenizer.train(["abcabc abab"] * 20, vocab_size=260)
    d = json.loads(tok.to_json())
    d["tokenizer"]["model"]["vocab"] = {k: v + (v >= 100) for k, v in d["tokenizer"]["model"]["vocab"].items()}
    with pytest.raises(ValueError, match="byte-level tokens numbered from 0, without gaps"):
        tokenizer_from_json(json.dumps(d))
