"""docs/architecture.md's "typical changes", made for real: each test copies the charlm package, makes one
change in exactly the files the document names (a toy model family, a toy sampling option, a toy lab
experiment, a toy command), and runs the commands a user would on the result, in a fresh process. If a
change needs one more file than the document says, an anchor below is missing or a command fails: then the
document (or the code) is wrong, and this test says so.

The edits are insertions after an anchor line, so a reader sees each change whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from charlm.checkpoint import BEST, LAST
from charlm.config import FAMILIES, ModelConfig

PACKAGE = Path(__file__).resolve().parent.parent / "charlm"


def copy_with(tmp_path: Path, inserts: dict[str, list[tuple[str, str]]], new: dict[str, str]) -> Path:
    """A copy of charlm under tmp_path/pkg with `new` files added and, in each file of `inserts`, each text
    inserted after its anchor (which must occur exactly once). Returns the folder to put on PYTHONPATH."""
    root = tmp_path / "pkg"
    shutil.copytree(PACKAGE, root / "charlm", ignore=shutil.ignore_patterns("__pycache__"))
    touched = set(inserts) | set(new)
    for rel, pairs in inserts.items():
        path = root / "charlm" / rel
        text = path.read_text(encoding="utf-8")
        for anchor, insert in pairs:
            assert text.count(anchor) == 1, f"{rel}: the anchor {anchor!r} is not there once"
            text = text.replace(anchor, anchor + insert)
        path.write_text(text, encoding="utf-8")
    for rel, text in new.items():
        (root / "charlm" / rel).write_text(text, encoding="utf-8")
    assert len(touched) == len(inserts) + len(new)
    return root


def charlm(root: Path, cwd: Path, *args: str, stdin: str = "", ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "100", "CHARLM_CACHE": str(cwd / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "charlm", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 or not ok, f"charlm {' '.join(args)}: {done.stderr[-2000:]}"
    return done


BIGRAM = '''"""A toy family for tests/test_extensions.py: each token's logits from its own embedding alone."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cache:
    def __init__(self):
        self.pos = 0

    def reset(self):
        self.pos = 0


class Bigram(nn.Module):
    capabilities = frozenset()
    ACTIVATION_BYTES = 8
    window = None
    rolling_cache = False

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def hidden_matrices(self):
        return []

    def new_cache(self, batch_size=1, rolling=False):
        return Cache()

    def decode(self, ids, cache):
        idx = torch.tensor([ids], dtype=torch.long, device=self.tok_emb.weight.device)
        return self(idx, cache=cache)[0][0, -1]

    def forward(self, idx, targets=None, cache=None):
        logits = self.head(self.tok_emb(idx))
        if cache is not None:
            cache.pos += idx.size(1)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss
'''


TOY_EXPERIMENT = '''"""toy: a lab experiment for tests/test_extensions.py (no model: a coin, flipped)."""

import random

from charlm.lab import tasks
from charlm.lab.result import Chart, Clock, LabResult

DEFAULTS = dict(flips=200)
QUICK = dict(flips=50)


def run(out, seed=0, seeds=1, device="cpu", progress=print, **settings):
    s = {**DEFAULTS, **settings}
    clock = Clock()
    records = []
    for k in range(seed, seed + seeds):
        rng = random.Random(k)
        heads = sum(rng.random() < 0.5 for _ in range(s["flips"])) / s["flips"]
        records.append({"seed": k, "heads": heads, "chance": 0.5})
    lines = tasks.corpus("reverse", (3, 4), 2000, seed, heldout=True).text.split("\\n")[1:-1]
    test = tasks.examples("reverse", 4, 20, seed)
    reading = (
        f"Heads came up {records[0]['heads']:.0%} of {s['flips']} flips (chance 50%). "
        f"reverse: {len(lines)} training lines, {len(set(lines) & {e.text for e in test})} of them in the test set, "
        f"first test line {test[0].text}."
    )
    return LabResult("toy", {**s, "device": device}, records, reading, Chart("seed", "heads", None, "seed", "share"),
                     seconds=clock())
'''


TOY_COMMAND = '''"""count: a toy command for tests/test_extensions.py."""

from charlm import checkpoint
from charlm.errors import UserError
from charlm.tokenizer import tokenizer_from_json


class NothingToCount(UserError):
    pass


def count(ckpt, opts):
    """How many characters of opts.text the checkpoint's tokenizer knows (read without torch)."""
    if not opts.text:
        raise NothingToCount("nothing to count: give a text with -p")
    saved = checkpoint.read_header(checkpoint.resolve(ckpt))
    alphabet = set(getattr(tokenizer_from_json(saved.tokenizer), "chars", []))
    return {"checkpoint": str(ckpt), "known": sum(ch in alphabet for ch in opts.text), "of": len(opts.text)}
'''

COUNT_OPTIONS = '''

@dataclass
class CountOptions(Validated):
    """`charlm count`'s flags."""

    text: str = flag("", "The text to count.", short="p")

    def validate(self) -> CountOptions:
        check_types(self)
        check(len(self.text) <= 1000, "--text takes at most 1,000 characters")
        return self

'''

COUNT_COMMAND = '''@command(options.CountOptions, args=[path_argument("ckpt")], json=True)
def count(ckpt, as_json, **flags):
    """Count the characters of a text that CKPT's tokenizer knows."""
    from charlm.commands.count import count as run

    result = run(ckpt, from_flags(options.CountOptions, flags))
    print_json(result) if as_json else out_console().print(safe(f"{result['known']} of {result['of']} known"))


'''


SIZES = "dict(n_layers=1, d_model=16, context=32, dropout=0.0, batch_size=8, lr=1e-2)"
CHANGES = {  # file -> (anchor, what is inserted after it): the four changes, each in the files the document names
    "config.py": [
        # a model family: its class
        ('    "gru": "charlm.models.rnn.RNN",\n', '    "bigram": "charlm.models.bigram.Bigram",\n'),
        # a sampling option: its field
        (
            '    repetition_penalty: float = flag(1.0, ">1 discourages repeating tokens.", example="1.2")\n',
            '    min_p: float = flag(0.0, "Drop tokens below this share of the best one\'s probability.",'
            ' example="0.1")\n',
        ),
    ],
    "presets.py": [  # a model family: its presets
        (
            'PRESET_TABLE["gru"] = PRESET_TABLE["lstm"]\n',
            f'PRESET_TABLE["bigram"] = {{"tiny": {SIZES}, "small": {SIZES}, "medium": {SIZES}}}\n',
        ),
    ],
    "options.py": [  # a command: its options
        ('        check_paths(self, "eval_file")\n        return self\n', COUNT_OPTIONS),
    ],
    "models/shapes.py": [  # a model family: its state dict
        (
            "Shapes = dict[str, tuple[int, ...]]\n",
            "\n\ndef bigram(cfg):\n"
            "    V, C = cfg.vocab_size, cfg.d_model\n"
            '    return {"tok_emb.weight": (V, C), "head.weight": (V, C), "head.bias": (V,)}\n',
        ),
        ('"gru": rnn', ', "bigram": bigram'),
    ],
    "generate.py": [  # a sampling option: its use
        (
            "    probs = torch.softmax(logits, dim=-1)\n",
            "    if s.min_p > 0:\n"
            "        probs = torch.where(probs >= s.min_p * probs.max(), probs, torch.zeros_like(probs))\n"
            "        probs = probs / probs.sum()\n",
        ),
    ],
    "lab/tasks.py": [  # a lab task: its example and one entry
        (
            "TASKS = {\n",
            '    "reverse": Task(lambda rng, n: reverse_example(rng, n), SYMBOLS + SEP, lambda n: 2 * n + 1),\n',
        ),
        (
            "    return Example(half + half, list(range(s + 1, 2 * s)))  # the repeat's first letter cannot be foreseen\n",
            "\n\ndef reverse_example(rng, n):\n"
            '    s = "".join(rng.choice(SYMBOLS) for _ in range(n))\n'
            "    return Example(s + SEP + s[::-1], list(range(n + 1, 2 * n + 1)))\n",
        ),
    ],
    "lab/__init__.py": [  # a lab experiment: its line
        ("EXPERIMENTS = {\n", '    "toy": "a coin flipped: the share of heads against chance",\n'),
        ('SEEDED = ("copy"', ', "toy"'),
    ],
    "cli.py": [("    view.finish(result)\n\n\n", COUNT_COMMAND)],  # a command: its Click command
    "examples.txt": [  # a command: its example
        (
            'charlm sample checkpoints/tinyshakespeare-transformer-char -p "ROMEO:" -n 200\n',
            "\n# the letters of a word the model knows\ncharlm count checkpoints/x -p ROMEO\n",
        )
    ],
}
NEW = {"models/bigram.py": BIGRAM, "lab/toy.py": TOY_EXPERIMENT, "commands/count.py": TOY_COMMAND}


@pytest.fixture(scope="module")
def changed(tmp_path_factory):
    """(the changed package's folder, a work folder with a corpus and a bigram run trained in it)."""
    tmp = tmp_path_factory.mktemp("extensions")
    root = copy_with(tmp, CHANGES, NEW)
    corpus = tmp / "corpus.txt"
    corpus.write_text("the cat sat on the mat. the dog sat on the log.\n" * 200, encoding="utf-8")
    run = tmp / "runs" / "b"
    charlm(root, tmp, "train", str(corpus), "--model", "bigram", "--steps", "30", "--out", str(run))
    return root, tmp, run


def test_a_new_model_family_needs_the_four_files_the_document_names(changed):
    root, tmp, run = changed
    presets = charlm(root, tmp, "train", "--help").stdout
    assert "bigram 1 layers × 16, context 32" in " ".join(presets.split())  # its presets reach --help
    assert (run / BEST).exists() and '"model": "bigram"' in charlm(root, tmp, "info", str(run), "--json").stdout
    text = charlm(root, tmp, "sample", str(run), "-p", "the ", "-n", "40", "--seed", "1").stdout
    assert text.startswith("the ") and len(text) > 20
    assert '"bits_per_char"' in charlm(root, tmp, "eval", str(run), str(tmp / "corpus.txt"), "--json").stdout
    talk = charlm(root, tmp, "chat", str(run), "-n", "10", "--seed", "2", stdin="the cat\n/show\n").stdout
    assert "bigram" in talk
    charlm(root, tmp, "train", str(tmp / "corpus.txt"), "--resume", "--out", str(run), "--steps", "40")


def test_a_new_sampling_option_needs_the_two_files_the_document_names(changed):
    root, tmp, run = changed
    for command in ("sample", "chat", "compare"):
        assert "--min-p" in charlm(root, tmp, command, "--help").stdout
    # min_p 1 keeps only the most likely token: greedy, whatever the temperature (a family of its own, too)
    greedy = charlm(root, tmp, "sample", str(run), "-p", "the", "-n", "30", "--seed", "3", "-t", "1", "--min-p", "1")
    assert greedy.stdout == charlm(root, tmp, "sample", str(run), "-p", "the", "-n", "30", "-t", "0").stdout
    shown = charlm(root, tmp, "chat", str(run), stdin="/set min_p 0.3\n/show\n").stdout
    assert "min_p" in shown and "0.3" in shown
    both = charlm(root, tmp, "compare", str(run), str(run / LAST), "-p", "a", "-n", "5", "--min-p", "0.2", "--json")
    assert '"min_p": 0.2' in both.stdout


def test_a_new_lab_experiment_needs_the_two_files_the_document_names(changed):
    root, tmp, _ = changed
    assert "toy" in charlm(root, tmp, "lab").stdout
    quick = charlm(root, tmp, "lab", "toy", "--quick", "--seeds", "2", "--json").stdout
    assert '"flips": 50' in quick and '"seed": 1' in quick
    line = json.loads(quick)["reading"].split("first test line ")[1].rstrip(".")  # a lab task: one entry
    n = len(line) // 2
    assert len(line) == 2 * n + 1 and line[n] == "|" and line[n + 1 :] == line[:n][::-1]
    assert "0 of them in the test set" in quick


def test_a_new_command_needs_the_four_files_the_document_names(changed):
    root, tmp, run = changed
    helped = charlm(root, tmp, "count", "--help").stdout
    assert "--text" in helped and "charlm count checkpoints/x -p ROMEO" in helped
    assert "count" in charlm(root, tmp, "--help").stdout
    assert "3 of 4 known" in charlm(root, tmp, "count", str(run), "-p", "cat!").stdout
    bad = charlm(root, tmp, "count", str(run), "-p", "x" * 2000, ok=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "1,000" in bad.stderr
    empty = charlm(root, tmp, "count", str(run), ok=False)  # an error type of its own, listed nowhere
    assert empty.returncode == 1 and empty.stderr == "error: nothing to count: give a text with -p\n"
    missing = charlm(root, tmp, "count", ok=False)
    assert missing.returncode == 2 and "CKPT" in missing.stderr  # the "which run?" hint


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_every_registered_family_honours_the_contract_models_init_writes(kind):
    """Each name in models/__init__.py's contract, on a tiny model of every family config.FAMILIES lists."""
    import torch

    from charlm.models import build_model, config_params, count_params, param_shapes

    cfg = ModelConfig(kind=kind, vocab_size=11, n_layers=1, d_model=16, n_heads=2, context=8)
    model = build_model(cfg)
    assert model.cfg is cfg and isinstance(model.capabilities, frozenset)
    assert model.window in (None, cfg.context) and isinstance(model.rolling_cache, bool)
    assert isinstance(model.ACTIVATION_BYTES, (int, float)) and model.ACTIVATION_BYTES > 0
    assert all(p.dim() == 2 for p in model.hidden_matrices())
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == param_shapes(cfg)
    assert count_params(model) == config_params(cfg)
    idx = torch.randint(0, 11, (2, 8))
    targets = idx.clone()
    targets[:, :3] = -1
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 8, 11) and loss.dim() == 0
    cache = model.new_cache(1, rolling=True) if model.rolling_cache else model.new_cache(1)
    step = model.decode([1, 2, 3], cache)
    assert step.shape == (11,) and cache.pos == 3
    torch.testing.assert_close(step, model(torch.tensor([[1, 2, 3]]))[0][0, -1], atol=1e-4, rtol=1e-4)
    cache.reset()
    assert cache.pos == 0


def test_the_views_that_draw_probes_load_no_torch():
    """docs/architecture.md: views only draw. Those that draw what a probe read take its results as data."""
    views = "attention, gates, heatmap, chat, runs, plot, lab, text"
    code = f"import sys; from charlm.views import {views}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"
