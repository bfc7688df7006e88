"""docs/architecture.md's "typical changes", made for real: each change is made in its own copy of the charlm
package, in exactly the files the document names, and the number of files the document writes for it (read
from the document) is checked against the files the change touched: a toy sampling option, a toy model family
with no capabilities, a realistic gated toy family, a toy lab experiment and synthetic task, a toy command.
Then the commands a user would run go through the result in a fresh process -- every command, for the two
families; what a family cannot serve is refused in one line naming the family and what it lacks. If a change
needs one more file than the document says, an anchor below is missing or a command fails: then the document
(or the code) is wrong, and this test says so.

The edits are insertions after an anchor line, so a reader sees each change whole."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from charlm.config import FAMILIES, ModelConfig
from charlm.storage.checkpoint import LAST

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
    test = tasks.examples("copy", 4, 1, seed)
    reading = f"Heads came up {records[0]['heads']:.0%} of {s['flips']} flips (chance 50%); a copy: {test[0].text}."
    return LabResult("toy", {**s, "device": device}, records, reading, Chart("seed", "heads", None, "seed", "share"),
                     seconds=clock())
'''


TOY_COMMAND = '''"""count: a toy command for tests/test_extensions.py."""

from charlm.storage import checkpoint
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


MINGRU = '''"""A gated toy family for tests/test_extensions.py: minGRU (Feng et al. 2024, "Were RNNs all we needed?").
Each layer's update gate z and candidate c read only the input; h_t = (1 - z_t) h_(t-1) + z_t c_t. Its gates
can be traced, its units knocked out and pruned (models/__init__.py's capabilities)."""

from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.models.probes import LayerTrace, clamp, zero_units


class State:
    def __init__(self):
        self.h, self.pos = None, 0

    def reset(self):
        self.h, self.pos = None, 0


class MinGRU(nn.Module):
    capabilities = frozenset({"gates", "knock_out", "prune"})
    PART = "unit"
    ACTIVATION_BYTES = 64
    window = None
    rolling_cache = False

    def __init__(self, cfg):
        super().__init__()
        self.cfg, H = cfg, cfg.hidden_size
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(nn.Linear(cfg.d_model if i == 0 else H, 2 * H) for i in range(cfg.n_layers))
        self.head = nn.Linear(H, cfg.vocab_size)
        self._knocked = None

    @staticmethod
    def parts(cfg):
        return cfg.hidden_size

    def hidden_matrices(self):
        return [layer.weight for layer in self.layers]

    def new_cache(self, batch_size=1, rolling=False):
        return State()

    def decode(self, ids, cache):
        idx = torch.tensor([ids], dtype=torch.long, device=self.tok_emb.weight.device)
        return self(idx, cache=cache)[0][0, -1]

    def _run(self, x, h0=None, intervene=None):
        traces, last = [], []
        for i, layer in enumerate(self.layers):
            z, c = layer(x).chunk(2, dim=-1)
            z = torch.sigmoid(z)
            h = h0[i] if h0 is not None else x.new_zeros(x.size(0), z.size(-1))
            hs, zs, cs = [], [], []
            for t in range(x.size(1)):
                zt, ct = z[:, t], c[:, t]
                if intervene is not None:
                    zt, ct = intervene(i, "update", zt), intervene(i, "new", ct)
                h = (1 - zt) * h + zt * ct
                if intervene is not None:
                    h = intervene(i, "hidden", h)
                hs.append(h)
                zs.append(zt)
                cs.append(ct)
            x = torch.stack(hs, dim=1)
            traces.append(LayerTrace({"update": torch.stack(zs, 1), "new": torch.stack(cs, 1)}, x, None))
            last.append(h)
        return traces, last

    def trace(self, idx):
        return self._run(self.tok_emb(idx))[0]

    @contextmanager
    def knock_out(self, part, mode="zero"):
        self._knocked = (part, mode)
        try:
            yield
        finally:
            self._knocked = None

    def _intervention(self, x):
        if self._knocked is None:
            return None
        part, mode = self._knocked
        if part.kind == "gate":
            return clamp(part.layer, part.gate, part.value)
        units = list(part.which) or list(range(self.cfg.hidden_size))
        held = self._run(x)[0][part.layer].h[..., units].mean(dim=(0, 1)) if mode == "mean" else 0.0
        return zero_units(part.layer, units, held)

    def forward(self, idx, targets=None, cache=None):
        x = self.tok_emb(idx)
        traces, last = self._run(x, cache.h if cache is not None else None, self._intervention(x))
        if cache is not None:
            cache.h, cache.pos = last, cache.pos + idx.size(1)
        logits = self.head(traces[-1].h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def importance(self, idx):
        return np.stack([t.h.pow(2).mean(dim=(0, 1)).sqrt().numpy() for t in self.trace(idx[:, :-1])])

    @staticmethod
    def prune(cfg, state, importance, k):
        H, state, dropped, before = cfg.hidden_size, dict(state), [], None
        for i in range(cfg.n_layers):
            kept = sorted(int(u) for u in np.argsort(-importance[i], kind="stable")[: H - k])
            dropped += [(i, u) for u in range(H) if u not in kept]
            rows = torch.tensor(kept + [H + u for u in kept])
            w = state[f"layers.{i}.weight"][rows]
            state[f"layers.{i}.weight"] = (w if before is None else w[:, before]).contiguous()
            state[f"layers.{i}.bias"] = state[f"layers.{i}.bias"][rows].contiguous()
            before = torch.tensor(kept)
        state["head.weight"] = state["head.weight"][:, before].contiguous()
        return replace(cfg, hidden=H - k), state, dropped
'''


def family_change(kind: str, cls: str, shapes: str) -> dict:
    """A model family: its class (a new module), its line in FAMILIES, its presets, its state dict's shapes."""
    return {
        "config.py": [('    "gru": "charlm.models.rnn.RNN",\n', f'    "{kind}": "charlm.models.{kind}.{cls}",\n')],
        "presets.py": [
            (
                'PRESET_TABLE["gru"] = PRESET_TABLE["lstm"]\n',
                f'PRESET_TABLE["{kind}"] = {{"tiny": {SIZES}, "small": {SIZES}, "medium": {SIZES}}}\n',
            )
        ],
        "models/shapes.py": [("Shapes = dict[str, tuple[int, ...]]\n", shapes), ('"gru": rnn', f', "{kind}": {kind}')],
    }


SIZES = "dict(n_layers=2, d_model=16, context=32, dropout=0.0, batch_size=8, lr=1e-2)"
BIGRAM_SHAPES = (
    "\n\ndef bigram(cfg):\n"
    "    V, C = cfg.vocab_size, cfg.d_model\n"
    '    return {"tok_emb.weight": (V, C), "head.weight": (V, C), "head.bias": (V,)}\n'
)
MINGRU_SHAPES = (
    "\n\ndef mingru(cfg):\n"
    "    V, C, H = cfg.vocab_size, cfg.d_model, cfg.hidden_size\n"
    '    shapes = {"tok_emb.weight": (V, C)}\n'
    "    for i in range(cfg.n_layers):\n"
    '        shapes |= {f"layers.{i}.weight": (2 * H, C if i == 0 else H), f"layers.{i}.bias": (2 * H,)}\n'
    '    return shapes | {"head.weight": (V, H), "head.bias": (V,)}\n'
)
# each documented change, named as the document names it: ({file: [(anchor, what is inserted after it)]}, new files)
CHANGES = {
    "sampling option": (
        {
            "config.py": [
                (
                    '        1.0, ">1 discourages repeating tokens.", example="1.2", range=Range(0, 10, low_open=True)\n'
                    "    )\n",
                    '    min_p: float = flag(0.0, "Drop tokens below this share of the best one\'s probability.",'
                    ' example="0.1", range=Range(0, 1))\n',
                )
            ],
            "generate.py": [
                (
                    "    probs = torch.softmax(logits, dim=-1)\n",
                    "    if s.min_p > 0:\n"
                    "        probs = torch.where(probs >= s.min_p * probs.max(), probs, torch.zeros_like(probs))\n"
                    "        probs = probs / probs.sum()\n",
                )
            ],
        },
        {},
    ),
    "model family": (family_change("bigram", "Bigram", BIGRAM_SHAPES), {"models/bigram.py": BIGRAM}),
    "gated model family": (family_change("mingru", "MinGRU", MINGRU_SHAPES), {"models/mingru.py": MINGRU}),
    "lab experiment": (
        {
            "lab/__init__.py": [
                ("EXPERIMENTS = {\n", '    "toy": "a coin flipped: the share of heads against chance",\n'),
                ('SEEDED = ("copy"', ', "toy"'),
            ]
        },
        {"lab/toy.py": TOY_EXPERIMENT},
    ),
    "synthetic task": (
        {
            "lab/tasks.py": [
                (
                    "TASKS = {\n",
                    '    "reverse": Task(lambda rng, n: reverse_example(rng, n), SYMBOLS + SEP, lambda n: 2 * n + 1),\n',
                ),
                (
                    "    return Example(half + half, list(range(s + 1, 2 * s)))  # the repeat's first letter cannot be "
                    "foreseen\n",
                    "\n\ndef reverse_example(rng, n):\n"
                    '    s = "".join(rng.choice(SYMBOLS) for _ in range(n))\n'
                    "    return Example(s + SEP + s[::-1], list(range(n + 1, 2 * n + 1)))\n",
                ),
            ]
        },
        {},
    ),
    "command": (
        {
            "options.py": [('        check_paths(self, "eval_file")\n        return self\n', COUNT_OPTIONS)],
            "cli.py": [("    view.finish(result)\n\n\n", COUNT_COMMAND)],
            "examples.txt": [
                (
                    'charlm sample checkpoints/tinyshakespeare-transformer-char -p "ROMEO:" -n 200\n',
                    "\n# the letters of a word the model knows\ncharlm count checkpoints/x -p ROMEO\n",
                )
            ],
        },
        {"commands/count.py": TOY_COMMAND},
    ),
}


def documented_counts() -> dict[str, int]:
    """docs/architecture.md's typical changes: the number of files it writes for each ("**A new X** ...: N
    files")."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## Typical changes", 1)[1].split("\n## ", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"\*\*A new ([a-z ]+)\*\*[^:]*: (\d+) files?", section)}


def changed(tmp_path: Path, name: str) -> Path:
    """A copy of the package with one documented change made in it (and only that one)."""
    inserts, new = CHANGES[name]
    return copy_with(tmp_path / name.replace(" ", "-"), inserts, new)


def test_each_change_touches_the_number_of_files_the_document_writes():
    counts = documented_counts()
    assert set(counts) == set(CHANGES), set(counts) ^ set(CHANGES)
    for name, (inserts, new) in CHANGES.items():
        assert len(set(inserts) | set(new)) == counts[name], name


def batch(root: Path, cwd: Path, commands: dict[str, list[str]]) -> dict[str, tuple[int, str]]:
    """Every command of `commands` (name -> arguments) run through the CLI in one fresh process on the package
    at root: name -> (exit code, what it printed, stderr included)."""
    script = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from charlm.cli import main\n"
        "out = {}\n"
        "for name, args in json.loads(sys.argv[1]).items():\n"
        "    r = CliRunner().invoke(main, args)\n"
        "    out[name] = [r.exit_code, r.output + (repr(r.exception) if r.exit_code not in (0, 1, 2) else '')]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "100", "CHARLM_CACHE": str(cwd / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(commands)], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: tuple(v) for name, v in json.loads(done.stdout.splitlines()[-1]).items()}


CORPUS = "the cat sat on the mat. the dog sat on the log.\n" * 200


def every_command(run: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command a user would run on a trained run, by name."""
    corpus = str(tmp / "corpus.txt")
    return {
        "info": ["info", str(run), "--json"],
        "sample": ["sample", str(run), "-p", "the ", "-n", "20", "--seed", "1"],
        "eval": ["eval", str(run), corpus, "--json"],
        "compare": ["compare", str(run), str(run / LAST), "-p", "a", "-n", "5", "--json"],
        "attn": ["attn", str(run), "-p", "the cat sat"],
        "gates": ["gates", str(run), "-p", "the cat sat"],
        "lab ablate": ["lab", "ablate", str(run), "--quick"],
        "lab heads": ["lab", "heads", str(run)],
        "explore": ["explore", str(run), "the cat sat on the mat", "--screenshot", str(tmp / "explore.svg")],
        "compress": ["compress", str(run), "--to", str(tmp / "int8"), "--bits", "8", "--tokens", "512"],
        "compress --report": ["compress", str(run), "--report", "--tokens", "512", "--json"],
        "compress --drop-heads": ["compress", str(run), "--to", str(tmp / "heads"), "--drop-heads", "1"],
        "compress --drop-units": ["compress", str(run), "--to", str(tmp / "units"), "--drop-units", "2"],
        "info compressed": ["info", str(tmp / "int8"), "--json"],
        "sample compressed": ["sample", str(tmp / "int8"), "-p", "the ", "-n", "10", "--seed", "1"],
    }


def trained_family(tmp_path: Path, kind: str) -> tuple[Path, Path, Path]:
    """(the changed package, a work folder, a run of the new family trained in it for 30 steps)."""
    root = changed(tmp_path, "model family" if kind == "bigram" else "gated model family")
    tmp = root.parent
    (tmp / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    run = tmp / "runs" / kind
    charlm(root, tmp, "train", str(tmp / "corpus.txt"), "--model", kind, "--steps", "30", "--out", str(run))
    return root, tmp, run


def refused(result: tuple[int, str], *words: str) -> str:
    """A one-line refusal (exit 1) that says each of words."""
    code, out = result
    assert code == 1 and out.count("\n") == 1, out
    assert all(w in out for w in words), out
    return out


def test_a_model_family_with_no_capabilities_goes_through_every_command(tmp_path):
    """The documented 4-file family (a bigram): everything runs, and what needs a capability it lacks (attention
    heads, gates, parts to knock out or prune) is refused in one line naming the family and the capability,
    with no hint to a viewer it lacks too."""
    root, tmp, run = trained_family(tmp_path, "bigram")
    presets = charlm(root, tmp, "train", "--help").stdout
    assert "bigram 2 layers × 16, context 32" in " ".join(presets.split())  # its presets reach --help
    got = batch(root, tmp, every_command(run, tmp))
    for ok in ("info", "sample", "eval", "compare", "compress", "compress --report", "info compressed"):
        assert got[ok][0] == 0, (ok, got[ok][1][-2000:])
    assert '"model": "bigram"' in got["info"][1] and '"bits_per_char"' in got["eval"][1]
    assert got["sample"][1].startswith("the ") and got["sample compressed"][0] == 0
    assert [r["name"] for r in json.loads(got["compress --report"][1])["rows"]] == ["float32", "bf16", "int8", "int4"]
    refused(got["attn"], "attn: a bigram model has no attention heads")
    refused(got["gates"], "gates: a bigram model has no gates to trace")
    refused(got["lab ablate"], "lab ablate: a bigram model has no parts to knock out")
    refused(got["lab heads"], "lab heads: a bigram model has no attention heads")
    refused(got["explore"], "explore: a bigram model has no attention heads and no gates to trace")
    refused(got["compress --drop-heads"], "bigram", "no heads")
    refused(got["compress --drop-units"], "bigram", "no units")
    for name in (
        "attn",
        "gates",
        "lab ablate",
        "lab heads",
        "explore",
        "compress --drop-heads",
        "compress --drop-units",
    ):
        assert not any(hint in got[name][1] for hint in ("charlm attn", "charlm gates", "lab ablate for", "use --"))
    talk = charlm(root, tmp, "chat", str(run), "-n", "10", "--seed", "2", stdin="the cat\n/show\n").stdout
    assert "bigram" in talk
    charlm(root, tmp, "train", str(tmp / "corpus.txt"), "--resume", "--out", str(run), "--steps", "40")


def test_a_gated_model_family_goes_through_every_command_in_four_files(tmp_path):
    """A realistic gated family (minGRU: a gate trace, units knocked out and pruned) in the same four files: its
    gates are drawn and explored, lab ablate clamps its gates and zeroes its units, compress drops its units,
    and only what it lacks (attention heads) is refused, pointing to what it has."""
    root, tmp, run = trained_family(tmp_path, "mingru")
    got = batch(root, tmp, every_command(run, tmp))
    for ok in ("info", "sample", "eval", "compare", "gates", "lab ablate", "explore", "compress", "compress --report",
               "compress --drop-units", "info compressed", "sample compressed"):  # fmt: skip
        assert got[ok][0] == 0, (ok, got[ok][1][-2000:])
    assert "update gate z" in got["gates"][1]
    ablated = got["lab ablate"][1]
    assert "update" in ablated and "random units" in ablated and "busiest units" in ablated
    assert (tmp / "explore.svg").read_text(encoding="utf-8").startswith("<svg")
    report = [r["name"] for r in json.loads(got["compress --report"][1])["rows"]]
    assert "float32 -2 units/layer" in report and "float32 -2 units/layer (random)" in report
    info = json.loads(charlm(root, tmp, "info", str(tmp / "units"), "--json").stdout)
    V, C, H = info["vocab_size"], 16, 14  # 16 units less 2, in each of the 2 layers
    assert info["params"] == V * C + (2 * H * C + 2 * H) + (2 * H * H + 2 * H) + V * H + V
    refused(got["attn"], "has no attention", "charlm gates")  # the viewer it has
    refused(got["lab heads"], "lab heads: a mingru model has no attention heads", "lab ablate")
    refused(got["compress --drop-heads"], "mingru", "no heads", "--drop-units")


def test_a_new_sampling_option_needs_the_files_the_document_names(tmp_path, cmp_runs):
    root = changed(tmp_path, "sampling option")
    tmp, run = root.parent, cmp_runs["tf"]
    for command in ("sample", "chat", "compare"):
        assert "--min-p" in charlm(root, tmp, command, "--help").stdout
    # min_p 1 keeps only the most likely token: greedy, whatever the temperature
    greedy = charlm(root, tmp, "sample", str(run), "-p", "the", "-n", "30", "--seed", "3", "-t", "1", "--min-p", "1")
    assert greedy.stdout == charlm(root, tmp, "sample", str(run), "-p", "the", "-n", "30", "-t", "0").stdout
    shown = charlm(root, tmp, "chat", str(run), stdin="/set min_p 0.3\n/show\n").stdout
    assert "min_p" in shown and "0.3" in shown
    both = charlm(root, tmp, "compare", str(run), str(run / LAST), "-p", "a", "-n", "5", "--min-p", "0.2", "--json")
    assert '"min_p": 0.2' in both.stdout


def test_a_new_lab_experiment_and_task_need_the_files_the_document_names(tmp_path):
    root = changed(tmp_path, "lab experiment")
    tmp = root.parent
    assert "toy" in charlm(root, tmp, "lab").stdout
    quick = charlm(root, tmp, "lab", "toy", "--quick", "--seeds", "2", "--json").stdout
    assert '"flips": 50' in quick and '"seed": 1' in quick
    task = changed(tmp_path, "synthetic task")
    code = (
        "from charlm.lab import tasks\n"
        "lines = tasks.corpus('reverse', (3, 4), 2000, 0, heldout=True).text.split(chr(10))[1:-1]\n"
        "test = tasks.examples('reverse', 4, 20, 0)\n"
        "print(len(set(lines) & {e.text for e in test}), test[0].text)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(task)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=task.parent, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shared, line = done.stdout.split()
    n = len(line) // 2
    assert shared == "0" and len(line) == 2 * n + 1 and line[n] == "|" and line[n + 1 :] == line[:n][::-1]


def test_a_new_command_needs_the_files_the_document_names(tmp_path, cmp_runs):
    root = changed(tmp_path, "command")
    tmp, run = root.parent, cmp_runs["tf"]
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
