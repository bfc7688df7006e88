"""Shared fixtures: every test gets its own token cache and runs torch on one thread; tiny checkpoints
are trained once per test session for the tests that need a trained model."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
import torch
from click.testing import CliRunner

from charlm.cli import main
from charlm.config import ModelConfig, TrainConfig
from charlm.models import build_model, count_params
from charlm.storage import safetensors_file
from charlm.storage.checkpoint import OLD_LAST, Corpus, Saved
from charlm.tokenizer import CharTokenizer
from charlm.training.trainer import Trainer

# A terminal's size comes from the terminal (the pty tests) or Rich's default of 80 columns (CliRunner),
# never from the environment of whoever runs the tests: Rich reads LINES and COLUMNS before the pty's size.
for _var in ("LINES", "COLUMNS"):
    os.environ.pop(_var, None)

# ---- the slow marker: `python -m pytest -m "not slow"` is the quick loop -------------------------------

# a test that starts another process (a pseudo-terminal, a subprocess, torchrun) pays that process's start and
# torch's import, seconds each on a busy CPU: it is marked slow, whether it starts one itself, through a helper
# function or class of its module, or through a fixture. So are the tests that train models for seconds in
# this process, or draw hundreds of hypothesis examples, a CPU-second or more each (measured: benchmarks/RESULTS.md,
# "The quick test loop"): those that use a fixture of SLOW_FIXTURES, and SLOW_TESTS by name (or carrying
# @pytest.mark.slow themselves). tests/test_slow_rules.py checks that each name here is a test or fixture.
SLOW_FIXTURES = {"copy_result", "recall_results", "positions_result"}  # lab models trained at --quick size
SLOW_TESTS = {
    "test_a_timed_run_shows_a_validation_loss_before_its_end",
    "test_forgetting_is_drawn_by_the_cli",
    "test_any_record_is_refused_in_one_line_or_described_sanely",
    "test_any_metrics_file_gives_its_evaluations_and_counts_the_rest",
    "test_any_config_validates_or_is_a_config_error",
    "test_any_logits_give_a_token_with_probability",
    "test_any_payload_is_a_typed_saved_or_one_line",
    "test_induction_the_loss_falls_as_the_induction_head_forms",
    "test_capacity_a_larger_state_copies_longer",
    "test_cost_recomputation_grows_faster_than_the_cache",
    "test_seeds_show_every_value_and_the_same_seeds_give_the_same_table",
    "test_a_huge_metrics_file_is_read_from_its_end_only",
    "test_a_masked_run_trains_and_evaluates_on_the_targets_only",
    "test_report_measures_every_method_and_names_the_best_trade",
    "test_a_kill_between_any_two_writes_leaves_files_that_agree",
    "test_never_saves_the_compile_wrapper",
    "test_every_run_charlm_writes_is_listed_and_opens_by_name",
}
STARTS_A_PROCESS = re.compile(
    r"\bsubprocess\.|\bpexpect\.spawn\(|\bcharlm_pty\(|\bchat_pty\b|\bimported\(|\brun_limited\("
)


@functools.cache
def _source(function) -> str:
    """A function's source, read once: collection asks for each fixture's again for every test that uses it."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _starts_a_process(function, helpers: set[str]) -> bool:
    source = _source(function)
    return bool(STARTS_A_PROCESS.search(source) or any(re.search(rf"\b{h}\(", source) for h in helpers))


def pytest_collection_modifyitems(config, items):
    helpers: dict[object, set[str]] = {}  # each module's functions that start a process
    for item in items:
        module = getattr(item, "module", None)
        if module is None or getattr(item, "function", None) is None:
            continue
        if module not in helpers:
            own = [
                (name, f)
                for name, f in vars(module).items()
                if (inspect.isfunction(f) or inspect.isclass(f))
                and getattr(f, "__module__", None) == module.__name__
                and not name.startswith("test_")
            ]
            found = {name for name, f in own if _starts_a_process(f, set())}
            found |= {name for name, f in own if _starts_a_process(f, found)}  # helpers built on those
            helpers[module] = found
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        if (
            item.function.__name__ in SLOW_TESTS
            or SLOW_FIXTURES & set(item.fixturenames)
            or any(_starts_a_process(f, helpers[module]) for f in [item.function, *fixtures])
        ):
            item.add_marker(pytest.mark.slow)


# ---- a small corpus and the flags of a tiny training run, for the CLI, signal and disk tests -------

CITIZENS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n"
) * 12
TINY_MODEL = ["--layers", "1", "--d-model", "32", "--heads", "2", "--context", "32", "--batch-size", "8"]
TINY = [
    *TINY_MODEL,
    "--eval-iters",
    "2",
    "--sample-tokens",
    "0",
    "--warmup",
    "5",
    "--device",
    "cpu",
]


# ---- helpers the test files share -------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colour and cursor sequences a terminal program writes


def strip_ansi(screen: str) -> str:
    """What a person reads on the screen: the text without escape sequences or carriage returns."""
    return ANSI.sub("", screen).replace("\r", "")


def cli(*args, input=None):
    """`charlm ARGS` through Click's CliRunner (stdout and stderr apart), every argument as a string."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def one_line_error(r, *fragments: str, code: int = 1) -> str:
    """The contract for every user error: exit code, a single 'error: ...' line on stderr, no traceback, never
    "please report it"."""
    assert r.exit_code == code, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, repr(r.stderr)
    assert "Traceback" not in r.output and "please report it" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models run faster on one thread, and far faster when another process shares the cores
    (two threads then mostly wait for each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARLM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path) -> Path:
    """CITIZENS in a file (a test file with a corpus of its own overrides this)."""
    path = tmp_path / "citizens.txt"
    path.write_text(CITIZENS, encoding="utf-8")
    return path


def train_ok(corpus: Path, out: Path, *extra):
    """`charlm train CORPUS` of a TINY model for 2 steps (extra flags come last and win) into out; it succeeds."""
    r = cli("train", corpus, *TINY, "--steps", "2", "--out", out, *extra)
    assert r.exit_code == 0, r.output
    return r


def run_limited(
    args: list[str], headroom_mb: int = 1400, timeout: float = 120, estimate: bool = True
) -> subprocess.CompletedProcess:
    """`charlm ARGS` in a process that may map at most headroom_mb more than Python, torch and charlm
    take once imported (~650 MB with the CPU build, several GB with a CUDA build's libraries), and sees no
    GPU: these tests are about the host's memory (a crash there is an exit code, not the end of the test run).
    estimate=False: skip charlm's memory estimate."""
    code = (
        "import resource, sys; from charlm.cli import main; from charlm.training import memory; "
        + ("" if estimate else "memory.available = lambda device: None; ")
        + "size = next(int(l.split()[1]) << 10 for l in open('/proc/self/status') if l.startswith('VmSize:')); "
        f"resource.setrlimit(resource.RLIMIT_AS, (size + ({headroom_mb} << 20),) * 2); "
        "sys.argv = ['charlm', *sys.argv[1:]]; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "RAYON_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "CHARLM_DEBUG": "",
        },
    )


def charlm_pty(tmp_path: Path, *args, size=(100, 40), env: dict | None = None, timeout=60, **kw) -> pexpect.spawn:
    """`charlm ARGS...` in a real pseudo-terminal of size (columns, lines): the one set-up of every terminal
    test. Its caches live under tmp_path (CHARLM_CACHE; XDG_CACHE_HOME, where the chat history goes without
    it), TERM is xterm-256color, torch runs one thread; env adds variables, or with None removes one. kw goes
    to pexpect.spawn (codec_errors=...)."""
    full = {**os.environ, "CHARLM_CACHE": str(tmp_path / "cache"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    full |= {"TERM": "xterm-256color", "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}
    for name, value in (env or {}).items():
        full.pop(name, None) if value is None else full.__setitem__(name, value)
    cols, lines = size
    return pexpect.spawn(
        sys.executable,
        ["-m", "charlm", *map(str, args)],
        env=full,
        dimensions=(lines, cols),
        encoding="utf-8",
        timeout=timeout,
        **kw,
    )


# runs `charlm ARGS` in this fresh interpreter, then says which heavy modules it had imported
PROBE = """
import json, sys
from charlm.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps([m for m in ("torch", "charlm.models.transformer", "charlm.training.trainer") if m in sys.modules]))
"""


def imported(*args, cwd=None) -> list[str]:
    """The heavy modules `charlm ARGS` imported, in a fresh process (the start-up tests' probe)."""
    env = {k: v for k, v in os.environ.items() if k != "CHARLM_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def chat_pty(tmp_path):
    """Start `charlm chat RUN ARGS...` in a real pseudo-terminal (100 × 40); closed after the test."""
    children = []

    def spawn(run: Path, *args: str) -> pexpect.spawn:
        child = charlm_pty(tmp_path, "chat", run, *args)
        children.append(child)
        return child

    yield spawn
    for child in children:
        child.close()


def train_runs(root: Path, text: str, specs: dict[str, tuple[ModelConfig, TrainConfig]]) -> dict[str, Path]:
    """Train each (model, train) config on `text` for its few steps; returns run directories by name."""
    corpus = root / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHARLM_CACHE", str(root / "cache"))
        for name, (model_cfg, train_cfg) in specs.items():
            Trainer(corpus, model_cfg, train_cfg, root / name).fit()
            runs[name] = root / name
    return runs


def saved_model(model, chars: str, **fields) -> Saved:
    """A checkpoint's payload for a model a test built: a char tokenizer of `chars`, a tiny corpus record and
    plain values for the rest; `fields` replace any of them."""
    plain = dict(
        run_name="run",
        model_config=model.cfg,
        train_config=TrainConfig(),
        tokenizer=CharTokenizer(list(chars)).to_json(),
        model=model.state_dict(),
        step=1,
        train_seconds=0.5,
        best_val_loss=1.0,
        best_val_bpc=1.5,
        params=count_params(model),
        corpus=Corpus(name="c.txt", sha256="0" * 64, train_tokens=90, val_tokens=10, chars_per_token=1.0),
    )
    return Saved(**(plain | fields))


def stored_payload(path: Path) -> dict:
    """A checkpoint file's fields as stored (plain values; tensors as they lie in the file: int8 weights stay
    int8), to tamper with and write again with checkpoint.save (or torch.save, as an older charlm did)."""
    from safetensors.torch import load_file

    if not safetensors_file.is_safetensors(Path(path)):  # an older charlm's .pt
        return torch.load(path, weights_only=True)
    header = safetensors_file.Header(Path(path))
    return safetensors_file.with_tensors(header.payload(), load_file(path))


def legacy_payload(path: Path) -> dict:
    """What an older charlm's checkpoint (format 2, torch.save's best.pt / last.pt, before safetensors) held,
    built from a checkpoint file: to write with torch.save for the tests of the reader of those files."""
    return {**stored_payload(path), "version": 2}


def tampered(base: Path, dest: Path, **changes) -> Path:
    """An older charlm's .pt copy of the checkpoint base with fields replaced (a dict for a config or the corpus:
    merged into the saved one)."""
    data = legacy_payload(base)
    for name in ("model_config", "train_config", "corpus"):
        if isinstance(changes.get(name), dict):
            changes[name] = {**data[name], **changes[name]}
    dest.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**data, **changes}, dest)
    return dest


@pytest.fixture(scope="session")
def old_pt(tmp_path_factory) -> Path:
    """A valid last.pt of an older charlm (torch.save's archive) in a run directory, built without training: a
    transformer of 1 layer × 4 with a 3-character vocabulary."""
    run = tmp_path_factory.mktemp("old-pt") / "run"
    run.mkdir()
    torch.manual_seed(0)
    cfg = ModelConfig(kind="transformer", vocab_size=3, n_layers=1, d_model=4, n_heads=2, context=4)
    saved = saved_model(build_model(cfg), "ab\n")
    torch.save({**saved.to_payload(), "version": 2}, run / OLD_LAST)
    return run / OLD_LAST


def tiny_train(steps: int, **kw) -> TrainConfig:
    settings = dict(
        steps=steps, batch_size=8, lr=1e-2, warmup=5, eval_interval=steps, eval_iters=1, sample_tokens=0, device="cpu"
    )
    return TrainConfig(**{**settings, **kw})


# ---- compare / eval: an LSTM and a Transformer on chars, a Transformer on BPE -------------------

CMP_TEXT = (
    "the cat sat on the mat, and the dog ran to the log.\n"
    "a bird sang in the tree; the bee flew to me.\n"
    "then the cat and the dog and the bird went home.\n"
) * 45


@pytest.fixture(scope="session")
def cmp_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "rhymes.txt"
    path.write_text(CMP_TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def cmp_runs(cmp_corpus, tmp_path_factory):
    """Run directories of three tiny models, 30 steps each. Keys: "lstm", "tf", "bpe"."""
    size = dict(n_layers=1, d_model=32, n_heads=2, context=32)
    runs = train_runs(
        tmp_path_factory.mktemp("cmp-runs"),
        CMP_TEXT,
        {
            "cmp-lstm": (ModelConfig(kind="lstm", **size), tiny_train(30, eval_iters=2)),
            "cmp-tf": (ModelConfig(kind="transformer", **size), tiny_train(30, eval_iters=2)),
            "cmp-bpe": (
                ModelConfig(kind="transformer", **size),
                tiny_train(30, eval_iters=2, tokenizer="bpe", bpe_vocab=300),
            ),
        },
    )
    return {name.removeprefix("cmp-"): path for name, path in runs.items()}


# ---- viewers: char Transformer, BPE Transformer, LSTM, GRU (2 layers each) ---------------------

VIEW_TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"
) * 40


@pytest.fixture(scope="session")
def view_runs(tmp_path_factory):
    """Run directories of four tiny models, 20 steps each. Keys: "tf", "bpe", "lstm", "gru"."""
    size = dict(n_layers=2, d_model=32, n_heads=2, context=48)
    runs = train_runs(
        tmp_path_factory.mktemp("view-runs"),
        VIEW_TEXT,
        {
            "view-tf": (ModelConfig(kind="transformer", **size), tiny_train(20)),
            "view-bpe": (ModelConfig(kind="transformer", **size), tiny_train(20, tokenizer="bpe", bpe_vocab=300)),
            "view-lstm": (ModelConfig(kind="lstm", **size), tiny_train(20)),
            "view-gru": (ModelConfig(kind="gru", **size), tiny_train(20)),
        },
    )
    return {name.removeprefix("view-"): path for name, path in runs.items()}


# ---- generation: a Transformer that memorised hostile text, and an LSTM ------------------------

# A text the model learns by heart, full of Rich markup and terminal escapes (an OSC title change, a
# BEL, colour codes): sample and chat must show them as harmless visible text.
GEN_TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    "[bold]red[/bold] \x1b]0;pwned\x07 \x1b[31mred\x1b[0m\n"
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"
) * 60


@pytest.fixture(scope="session")
def gen_runs(tmp_path_factory):
    """ "tf": a char Transformer (1 layer × 48, context 48) trained for 80 steps, which has memorised
    GEN_TEXT; "lstm": a char LSTM trained for 3 steps."""
    size = dict(n_layers=1, d_model=48, n_heads=2, context=48)
    runs = train_runs(
        tmp_path_factory.mktemp("gen-runs"),
        GEN_TEXT,
        {
            "gen-tf": (ModelConfig(kind="transformer", **size), tiny_train(80, batch_size=16, warmup=10)),
            "gen-lstm": (ModelConfig(kind="lstm", **size), tiny_train(3, batch_size=16, warmup=10)),
        },
    )
    return {name.removeprefix("gen-"): path for name, path in runs.items()}
