"""Issue 20: property-based tests (hypothesis) of the edges that take outside data: a checkpoint's payload, the
checkpoint files themselves, tokenizer JSON, the configs, the sampler's inputs, metrics.jsonl, and chat's
/set, /attn and /gates. Each states what must hold for ANY input of its kind, and hypothesis looks for one
where it does not. What they found is fixed, with an example each in test_fuzz_findings.py.

Bounded and reproducible: a fixed number of examples each (a few seconds on a laptop CPU), derandomized
(the same examples on every run, in CI too), no example database."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import re
import string
import warnings
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import cli, saved_model, stored_payload
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rich.console import Console

from charlm.commands.chat import Chat
from charlm.commands.repl import Hint, Session
from charlm.config import ModelConfig, SampleConfig, TrainConfig
from charlm.errors import CheckpointError, ConfigError
from charlm.generate import sample_next_token, sampling_probs
from charlm.models import build_model, param_shapes
from charlm.storage import checkpoint, runs
from charlm.storage.checkpoint import LAST, Saved
from charlm.tokenizer import BPETokenizer, CharTokenizer, tokenizer_from_json

FUZZ = int(os.environ.get("CHARLM_HYPOTHESIS_EXAMPLES", "0"))  # a long fuzzing run: this many examples, fresh seeds


def bounded(examples: int):
    """A few seconds a test, the same examples on every run (CI included), nothing kept between runs; with
    CHARLM_HYPOTHESIS_EXAMPLES=N, N examples drawn from --hypothesis-seed (benchmarks/RESULTS.md's fuzzing runs)."""
    return settings(
        max_examples=FUZZ or examples,
        deadline=None,
        derandomize=not FUZZ,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def one_line(e: Exception, *names: object) -> str:
    text = str(e)
    assert text and "\n" not in text, repr(text)
    for name in names:
        assert str(name) in text, (name, text)
    return text


def writable(text: str) -> bool:
    """What a terminal can be sent: UTF-8, or a file name's undecodable bytes as surrogateescape keeps them."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


# ---- hostile values ---------------------------------------------------------------------------------------

EDGES = [0, 1, -1, 2, 257, 2**31, 2**63 - 1, 2**63, -(2**63), 10**30, 0.5, -0.0, 1e308, 5e-324]
WORDS = ["", "x", "transformer", "lstm", "gru", "char", "bpe", "rope", "learned", "cpu", "auto", "muon", "none"]
NASTY = ["\x00", "\x1b[2J[bold]x\x07", "x\ny", "\ud800", "\udcff", "a" * 3000, "😀", "\u202e"]

scalars = st.one_of(
    st.integers(),
    st.sampled_from(EDGES),
    st.builds(pow, st.just(10), st.just(5000)),  # repr() of it raises ValueError: never in a strategy's repr
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(WORDS + NASTY),
    st.binary(max_size=6),
)
hostile = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


# ---- checkpoints ---------------------------------------------------------------------------------------------


def tiny_checkpoint(path: Path, kind: str = "transformer") -> Path:
    torch.manual_seed(0)
    cfg = ModelConfig(kind=kind, vocab_size=4, n_layers=1, d_model=4, n_heads=2, context=8)
    model = build_model(cfg)
    saved = saved_model(
        model,
        "ab \n",
        step=3,
        train_seconds=1.5,
        best_val_loss=1.2,
        best_val_bpc=1.7,
        device="cpu",
        metrics={"step": 3, "val_loss": 1.2},
    )
    checkpoint.save(saved, path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("props") / "run" / LAST)


@pytest.fixture(scope="module")
def payload(tiny) -> dict:
    return stored_payload(tiny)


PLACES = [None, "model_config", "train_config", "corpus", "metrics"]  # where a change goes: the top level, or a dict
KEYS = sorted(
    {f.name for f in fields(Saved)}
    | {f.name for f in fields(ModelConfig)}
    | {f.name for f in fields(TrainConfig)}
    | {"format", "version", "distributed", "name", "sha256", "train_tokens", "val_tokens", "chars_per_token"}
)


def mutated(payload: dict, data) -> dict:
    """payload with 1 to 3 changes: a value replaced by a hostile one, a key removed, or one added."""
    out = copy.deepcopy(payload)
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        place = data.draw(st.sampled_from(PLACES), label="place")
        target = out if place is None else out.get(place)
        if not isinstance(target, dict):
            continue
        op = data.draw(st.sampled_from(["replace", "delete", "add"]), label="op")
        if op == "add" or not target:
            target[data.draw(st.sampled_from(KEYS), label="key")] = data.draw(hostile, label="value")
        elif op == "delete":
            del target[data.draw(st.sampled_from(sorted(target, key=str)), label="key")]
        else:
            key = data.draw(st.sampled_from(sorted(target, key=str)), label="key")
            target[key] = data.draw(hostile, label="value")
    return out


def assert_typed(saved: Saved) -> None:
    """What every command may take for granted of a Saved (the oracle: independent of the reader's code)."""
    count = lambda x, least=0: type(x) is int and least <= x < 2**63  # noqa: E731
    number = lambda x: type(x) is float and math.isfinite(x) or type(x) is int and abs(x) < 2**63  # noqa: E731
    amount = lambda x: number(x) and x >= 0  # noqa: E731
    assert isinstance(saved.run_name, str) and writable(saved.run_name)
    assert count(saved.step) and amount(saved.train_seconds) and count(saved.world_size, 1)
    assert (saved.best_val_loss is None) == (saved.best_val_bpc is None)
    assert saved.best_val_loss is None or amount(saved.best_val_loss) and amount(saved.best_val_bpc)
    assert saved.params is None or count(saved.params)
    assert saved.device is None or isinstance(saved.device, str)
    assert saved.metrics is None or all(isinstance(k, str) and number(v) for k, v in saved.metrics.items())
    assert saved.weights_sha256 is None or all(isinstance(d, str) for d in saved.weights_sha256)
    if saved.corpus is not None:
        c = saved.corpus
        assert isinstance(c.name, str) and isinstance(c.sha256, str) and count(c.train_tokens) and count(c.val_tokens)
        assert amount(c.chars_per_token) and c.chars_per_token > 0
    for cfg in (saved.model_config, saved.train_config):
        assert_config_typed(cfg)
    json.dumps(saved.summary(), allow_nan=False)  # what `info --json` and `runs --json` print


@bounded(300)
@given(data=st.data())
def test_any_payload_is_a_typed_saved_or_one_line(payload, data):
    """Saved.from_payload on any dict (hostile values in any field, fields missing or added): a Saved whose
    every field has its declared type and range, or a CheckpointError of one line naming the file."""
    path = Path("/runs/x/last.pt")
    candidate = mutated(payload, data)
    try:
        saved = Saved.from_payload(candidate, path)
    except CheckpointError as e:
        one_line(e, path)
        event("refused")
        return
    event("accepted")
    assert_typed(saved)


CHANGES = st.sampled_from(["payload", "tensor", "tokenizer"])
TENSORS = st.sampled_from(
    [torch.zeros(3), torch.full((4, 4), math.nan), torch.ones(4, 4, dtype=torch.int64), torch.ones(4, 4).half(),
     torch.ones(()), torch.ones(4, 4)[:, :2], torch.ones(0, 4)]
)  # fmt: skip


@bounded(60)
@given(data=st.data())
def test_any_saved_file_reads_or_is_one_line(tiny, payload, tmp_path_factory, data):
    """A payload written by torch.save after changes (a field, a weight replaced by another tensor, the
    tokenizer's JSON): read_header and load return a usable checkpoint, or one line naming the file; and
    when the reader accepts it, `charlm info` shows it and exits 0."""
    candidate = mutated(payload, data)
    what = data.draw(CHANGES, label="also")
    if what == "tensor" and isinstance(candidate.get("model"), dict) and candidate["model"]:
        name = data.draw(st.sampled_from(sorted(candidate["model"], key=str)), label="weight")
        candidate["model"][name] = data.draw(TENSORS, label="tensor")
    elif what == "tokenizer":
        candidate["tokenizer"] = data.draw(tokenizer_texts, label="tokenizer")
    path = tmp_path_factory.mktemp("saved") / LAST
    torch.save(candidate, path)
    try:
        saved = checkpoint.read_header(path)
        loaded = checkpoint.load(path)
    except CheckpointError as e:
        one_line(e, path)
        event("refused")
        return
    event("accepted")
    assert_typed(saved)
    assert loaded.tokenizer.vocab_size == loaded.model_config.vocab_size
    r = cli("info", path)
    assert r.exit_code == 0 and r.stderr == "", r.output


# ---- tokenizers ---------------------------------------------------------------------------------------------


def _bpe_json() -> dict:
    return json.loads(BPETokenizer.train(["the cat sat on the mat. " * 20], vocab_size=270).to_json())


BPE = _bpe_json()
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
char_tokenizers = st.fixed_dictionaries(
    {
        "kind": st.just("char"),
        "chars": st.lists(st.characters() | st.sampled_from(["\ud800", "\udcff", "ab", "", 5, None]), max_size=8),
    }
)


@st.composite
def bpe_tokenizers(draw) -> dict:
    """charlm's BPE JSON with one part changed: a key of the tokenizer removed, a vocabulary id or merge changed."""
    d = copy.deepcopy(BPE)
    tok = d["tokenizer"]
    op = draw(st.sampled_from(["drop", "vocab", "merge", "value"]))
    if op == "drop":
        del tok[draw(st.sampled_from(sorted(tok)))]
    elif op == "vocab":
        vocab = tok["model"]["vocab"]
        vocab[draw(st.sampled_from(sorted(vocab)))] = draw(st.integers(-5, 400))
    elif op == "merge" and tok["model"]["merges"]:
        tok["model"]["merges"][draw(st.integers(0, len(tok["model"]["merges"]) - 1))] = draw(json_values)
    else:
        tok[draw(st.sampled_from(sorted(tok)))] = draw(json_values)
    return d


tokenizer_texts = st.one_of(
    st.text(max_size=30),
    json_values.map(json.dumps),
    char_tokenizers.map(json.dumps),
    bpe_tokenizers().map(json.dumps),
    st.just(json.dumps(BPE)),
)


@bounded(200)
@given(text=tokenizer_texts, sample=st.text(max_size=20))
def test_any_json_is_a_usable_tokenizer_or_a_value_error(text, sample):
    """tokenizer_from_json on any text: a tokenizer that gives back what it encodes (and whose tokens' bytes
    are what decode gives), or a ValueError of one line. Nothing else: a checkpoint and the token cache both
    hold tokenizers as this JSON."""
    try:
        tok = tokenizer_from_json(text)
    except ValueError as e:
        assert type(e) is ValueError
        one_line(e)
        event("refused")
        return
    event(f"a {tok.kind} tokenizer")
    assert tok.vocab_size >= 1
    if isinstance(tok, CharTokenizer):
        sample = "".join(c for c in sample if c in tok.chars) or tok.chars[0]
    ids = tok.encode(sample, unknown="error")
    assert all(0 <= i < tok.vocab_size for i in ids) and tok.decode(ids) == sample
    assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", "surrogateescape") == sample
    assert all(writable(tok.decode([i])) for i in range(min(tok.vocab_size, 300)))


# ---- configs ------------------------------------------------------------------------------------------------

KINDS = {  # the declared field types, as the oracle reads them
    "int": lambda x: type(x) is int,
    "float": lambda x: type(x) in (int, float) and not math.isnan(x),
    "str": lambda x: isinstance(x, str),
    "bool": lambda x: type(x) is bool,
    "list[str]": lambda x: isinstance(x, list) and all(isinstance(s, str) for s in x),
}


def assert_config_typed(cfg) -> None:
    for f in fields(cfg):
        value, kind = getattr(cfg, f.name), str(f.type)
        optional = kind.endswith(" | None")
        assert optional and value is None or KINDS[kind.removesuffix(" | None")](value), (f.name, value)


def plausible(f) -> st.SearchStrategy:
    """Values of the field's type, of the size its flag takes: many of them valid."""
    kind = str(f.type).removesuffix(" | None")
    values = {
        "int": st.integers(0, 70),
        "float": st.floats(0, 1.5),
        "str": st.sampled_from(list(f.metadata.get("choices") or WORDS)),
        "bool": st.booleans(),
        "list[str]": st.lists(st.text(max_size=3), max_size=2),
    }[kind]
    return values | st.none() if str(f.type).endswith(" | None") else values


@bounded(400)
@given(cls=st.sampled_from([ModelConfig, TrainConfig, SampleConfig]), data=st.data())
def test_any_config_validates_or_is_a_config_error(cls, data):
    """validate() on any values (1 to 3 fields of a valid config changed; TrainConfig and SampleConfig validate
    as they are made): the config, every field of its declared type and no NaN; or a ConfigError of one line.
    Never another exception: a checkpoint's configs are outside data."""
    base = cls(vocab_size=65) if cls is ModelConfig else cls()
    value = lambda f: st.one_of(plausible(f), plausible(f), hostile)  # noqa: E731 - some accepted, most not
    chosen = data.draw(st.lists(st.sampled_from(fields(cls)), min_size=1, max_size=3, unique=True))
    changes = {f.name: data.draw(value(f), label=f.name) for f in chosen}
    try:
        cfg = replace(base, **changes).validate()
    except ConfigError as e:
        one_line(e)
        event("refused")
        return
    event("accepted")
    assert_config_typed(cfg)
    if cls is ModelConfig:
        assert all(all(type(n) is int and n >= 1 for n in s) for s in param_shapes(cfg).values())
        cfg.describe()


# ---- sampling ----------------------------------------------------------------------------------------------

any_logits = st.lists(st.floats(width=32), min_size=1, max_size=40) | st.lists(
    st.sampled_from([0.0, 1.0, -1.0, 3e38, -3e38, math.inf, -math.inf, math.nan]), min_size=1, max_size=8
)
any_settings = st.builds(
    SampleConfig,
    temperature=st.just(0.0) | st.floats(0, 100) | st.sampled_from([1e-5, 1e-4, 0.5, 1.0]),
    top_k=st.integers(0, 50),
    top_p=st.floats(0, 1, exclude_min=True) | st.just(1.0),
    repetition_penalty=st.just(1.0) | st.floats(0, 10, exclude_min=True),
)


@bounded(500)
@given(values=any_logits, s=any_settings, seen=st.lists(st.integers(0, 39), max_size=6), seed=st.integers(0, 2**32))
def test_any_logits_give_a_token_with_probability(values, s, seen, seed):
    """sample_next_token on any logits (finite or not: a model with huge weights overflows) and any valid
    settings: a token in range that sampling_probs gives a positive probability, from probabilities that are
    numbers summing to 1; and no warning on the terminal."""
    logits = torch.tensor(values, dtype=torch.float32)
    history = torch.tensor(sorted({i % len(values) for i in seen}), dtype=torch.long) if seen else None
    s = s.validate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        token = sample_next_token(logits, s, torch.Generator().manual_seed(seed), history)
        probs = sampling_probs(logits, s, history)
    assert bool(torch.isfinite(probs).all()) and bool((probs >= 0).all()) and abs(float(probs.sum()) - 1) < 1e-5
    assert 0 <= token < len(values) and probs[token] > 0


# ---- metrics.jsonl ----------------------------------------------------------------------------------------

evaluations = st.fixed_dictionaries(
    {
        "step": st.integers(0, 10**6),
        "train_loss": st.floats(0, 10),
        "val_loss": st.floats(0, 10),
        "val_bpc": st.floats(0, 20),
        "elapsed": st.floats(0, 1e5),
    },
    optional={"tokens_per_s": st.floats(0, 1e6)},
)
not_evaluations = st.one_of(
    st.binary(min_size=1, max_size=30),  # torn by a crash, a bad disk
    json_values.map(lambda v: json.dumps(v).encode()),
    evaluations.map(lambda r: json.dumps(r).encode()[:-3]),  # cut short
    st.tuples(evaluations, st.sampled_from(["step", "val_loss", "elapsed"]), json_values | st.floats()).map(
        lambda t: json.dumps({**t[0], t[1]: t[2]}).encode()
    ),  # a value of the wrong kind, NaN or infinite (json writes NaN and Infinity)
)
metrics_lines = st.lists(
    evaluations.map(lambda r: json.dumps(r).encode()) | not_evaluations.map(lambda b: re.sub(rb"[\r\n]", b" ", b)),
    max_size=12,
)


def _is_evaluation(line: bytes) -> bool:
    """The oracle: an evaluation is a JSON object with the five numbers plot and info draw, finite, not negative,
    the step a whole number."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return False
    keys = ("step", "train_loss", "val_loss", "val_bpc", "elapsed")
    return (
        isinstance(row, dict)
        and all(type(row.get(k)) in (int, float) and math.isfinite(row[k]) and row[k] >= 0 for k in keys)
        and type(row["step"]) is int
    )


@bounded(200)
@given(lines=metrics_lines, ending=st.sampled_from([b"\n", b"\r\n", b""]))
def test_any_metrics_file_gives_its_evaluations_and_counts_the_rest(tmp_path_factory, lines, ending):
    """read_metrics on any lines: the evaluations in order, and the count of the lines that are not one
    (blank lines aside); a note of one line when there are any."""
    run = tmp_path_factory.mktemp("metrics")
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines) + ending)
    m = runs.read_metrics(run)
    wanted = [json.loads(line) for line in lines if _is_evaluation(line)]
    unreadable = [line for line in lines if line.strip() and not _is_evaluation(line)]
    event(f"{'some' if unreadable else 'no'} unreadable lines")
    assert m.rows == wanted and m.skipped == len(unreadable)
    assert (m.note is None) == (not unreadable) and (m.note is None or "\n" not in m.note)


# ---- chat's /set, /attn and /gates ---------------------------------------------------------------------------


@bounded(300)
@given(
    rest=st.one_of(
        st.text(max_size=30),
        st.tuples(
            st.sampled_from([f.name for f in fields(SampleConfig)] + ["top-k", "TOP_P", "parameter seed", "nope"]),
            st.sampled_from(["", " ", "=", " = "]),
            st.sampled_from(["0", "-1", "1e999", "nan", "inf", "1_0", "0x10", "9" * 5000, "none", "off", "drop"])
            | st.sampled_from(["0.5", "0.9", "1", "1.2", "40", "42", "2", r"\n\n", "error", "replace", "1e-50"])
            | st.text(max_size=12),
        ).map("".join),
    )
)
def test_any_set_line_is_a_setting_or_a_hint(rest):
    """/set with anything after it: the settings become a valid SampleConfig, or a Hint (one line) says what
    was wrong; never another exception (the REPL would say "unexpected ... please report it")."""
    session = SimpleNamespace(settings=SampleConfig(), hint=lambda message, style="": None)
    try:
        Session.set(session, rest)
    except Hint as e:
        one_line(e)
        event("a hint")
        return
    event("set")
    assert_config_typed(session.settings)
    session.settings.validate()


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> dict[str, Chat]:
    """A transformer's and a GRU's chat, with a running text, printing into a string."""
    out = {}
    for kind in ("transformer", "gru"):
        path = tiny_checkpoint(tmp_path_factory.mktemp(kind) / LAST, kind)
        console = Console(file=io.StringIO(), width=100, height=40)
        chat = Chat(checkpoint.load(path), SampleConfig(), console, interactive=True)
        chat.gen.ids = chat.ckpt.tokenizer.encode("ab ba abba\nab ")
        out[kind] = chat
    return out


VIEW_WORDS = ["layer", "head", "tokens", "end", "ascii", "mean", "overview", "stats", "focus", "top", "scale", "row"]
VIEW_WORDS += ["abs", "units", "help", "0", "1", "2", "-1", "-99", "99", "3,1", "5,", ",", "ab", "x"]


@bounded(150)
@given(
    kind=st.sampled_from(["transformer", "gru"]),
    name=st.sampled_from(["/attn", "/gates"]),
    words=st.lists(st.sampled_from(VIEW_WORDS) | st.text(string.printable, max_size=5), max_size=5),
)
def test_any_view_command_shows_or_is_a_hint(chats, kind, name, words):
    """/attn and /gates with any words, on either kind of model: a view, or a Hint of one line; never
    another exception."""
    chat = chats[kind]
    try:
        chat.command(f"{name} {' '.join(words)}")
    except Hint as e:
        one_line(e)
        event("a hint")
        return
    event("a view")
