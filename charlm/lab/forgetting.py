"""forgetting: what learnable forgetting buys an LSTM. One-layer LSTMs of one width, each with its forget gate
made differently, learn two things at equal compute (the same steps, batch and width: the same FLOPs but for the
meta-memory's small controller; the table gives each arm's CPU-seconds):

  text    bits/char on held-out text, a slice of the bundled corpus (corpora/tinyshakespeare.txt)
  recall  Zoology's recall (tasks.recall_example: every key asked, a filler read in place of each answer),
          accuracy beside 1/P, what no binding can reach

The arms (gate order in nn.LSTM's weights: input, forget, cell, output):
  free        the forget gate as nn.LSTM has it, learned from x and h (PyTorch's init)
  constant    a learned constant per unit: the forget gate's rows pinned to 0, its bias free
  chrono      free, with chrono initialisation (Tallec & Ollivier 2018): forget bias log U(1, T - 1), input -it
  floor       (this lab's design) a learned retention floor per unit: f = r + (1 - r) sigmoid(...), r = sigmoid(b_r)
              learned, so a unit can learn never to forget faster than its floor while its gate stays free above it
  meta        meta-memory: a small controller (one tanh layer of 16) reads the cell state c and h at each step and
              sets the forget and input gates' biases for the next (it starts at zero: the free LSTM), so the
              network adjusts its own gating from what it holds, which nn.LSTM's gates never see
  forget=1, input=1, output=1   that gate fixed open, trained so from the start (its rows pinned to 0, its bias to
              30: sigmoid 1 in float32), not clamped after training as `lab ablate` does

The fused nn.LSTM kernel is kept for every arm but floor and meta (pinned rows are written again before each step
and get no gradient); those two run a cell of their own, step by step. These are experiment models, trained by
a plain loop here (AdamW, constant rate), not charlm runs: nothing is saved.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from charlm.data import bits_per_char, model_input
from charlm.lab import tasks
from charlm.lab.result import Clock, LabResult, pct, record, seeds_of
from charlm.lab.scoring import accuracy
from charlm.models.inspect import nats

TEXT = Path(__file__).resolve().parents[2] / "corpora" / "tinyshakespeare.txt"
ARMS = ("free", "constant", "chrono", "floor", "meta", "forget=1", "input=1", "output=1")
GATES = {"input": 0, "forget": 1, "cell": 2, "output": 3}
OPEN = 30.0  # a pinned bias: sigmoid(30) is 1 in float32

DEFAULTS = dict(
    arms=ARMS,
    hidden=64,
    lr=1e-2,
    batch_size=32,
    text_chars=200_000,  # the slice learned from; the next text_val characters are scored
    text_val=20_000,
    context=64,
    text_steps=500,
    pairs=(2, 4),
    recall_steps=2000,
    recall_chars=200_000,
    eval_examples=300,
)
QUICK = dict(
    arms=("free", "constant", "floor", "meta", "forget=1"),
    hidden=16,
    text_chars=20_000,
    text_val=4_000,
    context=32,
    text_steps=40,
    recall_steps=40,
    recall_chars=20_000,
    eval_examples=50,
)

CHART = None  # arms are names, not a scale: the table and the reading say it


class Chars:
    """A char tokenizer over a fixed alphabet (what scoring.accuracy needs of one)."""

    def __init__(self, alphabet: str):
        self.chars = sorted(set(alphabet) | {"\n"})
        self.ids = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [self.ids[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


class Cell(nn.Module):
    """An LSTM layer step by step, for the arms nn.LSTM cannot express: `floor` (a learned retention floor per
    unit) or `meta` (a controller that sets the input and forget gates' biases from h and c)."""

    def __init__(self, n_in: int, hidden: int, design: str):
        super().__init__()
        self.hidden, self.design = hidden, design
        self.ih = nn.Linear(n_in, 4 * hidden)
        self.hh = nn.Linear(hidden, 4 * hidden, bias=False)
        if design == "floor":
            self.retain = nn.Parameter(torch.full((hidden,), -3.0))  # a floor of 5% to start
        if design == "meta":
            self.ctrl = nn.Sequential(nn.Linear(2 * hidden, 16), nn.Tanh(), nn.Linear(16, 2 * hidden))
            nn.init.zeros_(self.ctrl[2].weight)  # it starts as the free LSTM
            nn.init.zeros_(self.ctrl[2].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H = self.hidden
        h = x.new_zeros(B, H)
        c = x.new_zeros(B, H)
        pre = self.ih(x)  # (B, T, 4H): the input's part at once
        out = []
        for t in range(T):
            a = pre[:, t] + self.hh(h)
            if self.design == "meta":
                a = a + F.pad(self.ctrl(torch.cat([h, c], -1)), (0, 2 * H))  # biases of input and forget
            i, f, g, o = a.chunk(4, -1)
            f = torch.sigmoid(f)
            if self.design == "floor":
                r = torch.sigmoid(self.retain)
                f = r + (1 - r) * f
            c = f * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            out.append(h)
        return torch.stack(out, 1)


class ArmLSTM(nn.Module):
    """Embedding, one LSTM layer made as `arm` says, a linear head. forward(ids) -> (logits, None)."""

    def __init__(self, vocab: int, hidden: int, arm: str, context: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)
        self.pins: list[tuple[str, slice, float]] = []  # (parameter of the fused LSTM, rows, value)
        if arm in ("floor", "meta"):
            self.rnn = Cell(hidden, hidden, arm)
            return
        self.rnn = nn.LSTM(hidden, hidden, batch_first=True)
        H = hidden
        rows = {gate: slice(k * H, (k + 1) * H) for gate, k in GATES.items()}
        if arm == "constant":  # no input to the forget gate; its bias (bias_ih's rows) stays free
            f = rows["forget"]
            self.pins += [("weight_ih_l0", f, 0.0), ("weight_hh_l0", f, 0.0), ("bias_hh_l0", f, 0.0)]
        elif arm.endswith("=1"):
            g = rows[arm[:-2]]
            self.pins += [
                ("weight_ih_l0", g, 0.0),
                ("weight_hh_l0", g, 0.0),
                ("bias_ih_l0", g, OPEN),
                ("bias_hh_l0", g, 0.0),
            ]
        elif arm == "chrono":
            with torch.no_grad():
                b = torch.log(torch.empty(H).uniform_(1, max(context - 1, 2)))
                self.rnn.bias_ih_l0[rows["forget"]] = b
                self.rnn.bias_hh_l0[rows["forget"]] = 0
                self.rnn.bias_ih_l0[rows["input"]] = -b
                self.rnn.bias_hh_l0[rows["input"]] = 0
        for name, r, _ in self.pins:  # a pinned row learns nothing (and Adam's moments for it stay zero)
            mask = torch.ones_like(getattr(self.rnn, name))
            mask[r] = 0
            getattr(self.rnn, name).register_hook(lambda grad, mask=mask: grad * mask)
        self.pin()

    @torch.no_grad()
    def pin(self) -> None:
        for name, r, value in self.pins:
            getattr(self.rnn, name)[r] = value

    def forward(self, ids: torch.Tensor):
        self.pin()
        out = self.rnn(self.emb(ids))
        return self.head(out[0] if isinstance(out, tuple) else out), None


def train(model: ArmLSTM, batch, steps: int, lr: float) -> float:
    """A plain loop: AdamW at a constant rate, gradients clipped to 1. batch() -> (x, y), -1 where no target.
    Returns the CPU-seconds it took."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    t0 = time.process_time()
    model.train()
    for _ in range(steps):
        x, y = batch()
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return time.process_time() - t0


def text_task(s: dict, seed: int):
    """(tokenizer, batch, score): windows of the corpus slice, and bits/char on fixed windows of the text after it."""
    raw = TEXT.read_text(encoding="utf-8")[: s["text_chars"] + s["text_val"]]
    tok = Chars(raw)
    ids = torch.tensor(tok.encode(raw))
    train_ids, val_ids = ids[: s["text_chars"]], ids[s["text_chars"] :]
    T, gen = s["context"], torch.Generator().manual_seed(seed)

    def batch():
        ix = torch.randint(len(train_ids) - T - 1, (s["batch_size"],), generator=gen)
        w = torch.stack([train_ids[i : i + T + 1] for i in ix.tolist()])
        return w[:, :-1], w[:, 1:]

    starts = range(0, len(val_ids) - T - 1, T)
    val = torch.stack([val_ids[i : i + T + 1] for i in starts])

    @torch.no_grad()
    def score(model) -> float:
        return bits_per_char(nats(model(val[:, :-1])[0], val))  # one character a token

    return tok, batch, score


def recall_task(s: dict, seed: int):
    """(tokenizer, batch, score): recall lines of every P mixed, one a window (the filler read in place of each
    answer), and the accuracy over the P's on held-out lines."""
    P = tuple(s["pairs"])
    T = tasks.example_length("recall", max(P)) + 1
    data = tasks.corpus("recall", P, s["recall_chars"], seed + 50_000, pad=T - 1, heldout=True)
    tok = Chars(tasks.alphabet("recall"))
    ids = np.asarray(tok.encode(data.text))
    x_ids = model_input(ids, data.mask, tok.encode(data.fill)[0])  # the filler where each answer stands
    y_ids = np.where(data.mask, ids, -1)
    starts = data.starts[data.starts + T + 1 <= len(ids)]
    gen = torch.Generator().manual_seed(seed)

    def batch():
        ix = starts[torch.randint(len(starts), (s["batch_size"],), generator=gen).numpy()]
        x = torch.from_numpy(np.stack([x_ids[i : i + T] for i in ix]))
        y = torch.from_numpy(np.stack([y_ids[i + 1 : i + T + 1] for i in ix]))
        return x, y

    fresh = {p: tasks.examples("recall", p, s["eval_examples"], seed + 60_000 + p) for p in P}

    def score(model) -> dict:
        return {p: accuracy(model, tok, ex) for p, ex in fresh.items()}

    return tok, batch, score, T


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    raw: list[dict] = []
    for seed_ in seed_list:
        text_tok, text_batch, text_score = text_task(s, seed_)
        rec_tok, rec_batch, rec_score, rec_T = recall_task(s, seed_)
        for k, arm in enumerate(s["arms"], 1):
            progress(f"forgetting: {arm} ({k}/{len(s['arms'])}), seed {seed_}, text then recall")
            torch.manual_seed(seed_)
            model = ArmLSTM(text_tok.vocab_size, s["hidden"], arm, s["context"])
            cpu = train(model, text_batch, s["text_steps"], s["lr"])
            raw.append(dict(arm=arm, seed=seed_, task="text", score=text_score(model), cpu_seconds=cpu))
            torch.manual_seed(seed_)
            model = ArmLSTM(rec_tok.vocab_size, s["hidden"], arm, rec_T)
            cpu = train(model, rec_batch, s["recall_steps"], s["lr"])
            acc = rec_score(model)
            raw.append(
                dict(
                    arm=arm,
                    seed=seed_,
                    task="recall",
                    score=statistics.fmean(acc.values()),
                    by_pairs={str(p): round(a, 4) for p, a in acc.items()},
                    cpu_seconds=cpu,
                )
            )
    records = summarise(raw, s)
    return LabResult(
        "forgetting",
        {**s, "arms": list(s["arms"]), "pairs": list(s["pairs"]), "seeds": seed_list, "device": device},
        records,
        reading(records, s, seed_list),
        CHART,
        seconds=clock(),
        details={"per_seed": [record(**r) for r in raw]},
    )


def summarise(raw: list[dict], s: dict) -> list[dict]:
    """One record per (task, arm): the mean over seeds, every seed's value, and the gap to the free arm in each
    seed (its mean, lowest and highest: a gap whose range excludes 0 held in every seed)."""
    out = []
    for task in ("text", "recall"):
        free = {r["seed"]: r["score"] for r in raw if r["task"] == task and r["arm"] == "free"}
        for arm in s["arms"]:
            rows = [r for r in raw if r["task"] == task and r["arm"] == arm]
            values = [r["score"] for r in rows]
            gaps = [r["score"] - free[r["seed"]] for r in rows] if free else []
            extra = {}
            if task == "recall":
                extra = {f"P{p}": statistics.fmean(r["by_pairs"][str(p)] for r in rows) for p in s["pairs"]} | {
                    "no_binding": statistics.fmean(1 / p for p in s["pairs"])
                }
            out.append(
                record(
                    task=task,
                    arm=arm,
                    score=statistics.fmean(values),
                    per_seed=[round(v, 4) for v in values],
                    vs_free=statistics.fmean(gaps) if gaps else None,
                    vs_free_low=min(gaps) if gaps else None,
                    vs_free_high=max(gaps) if gaps else None,
                    **extra,
                    cpu_seconds=statistics.fmean(r["cpu_seconds"] for r in rows),
                )
            )
    return out


def _gap(r: dict, unit: str) -> str:
    if r["vs_free"] is None or r["arm"] == "free":
        return ""
    f = (lambda v: f"{v:+.3f}") if unit == "bits" else (lambda v: f"{v * 100:+.1f} pts")
    if len(r["per_seed"]) == 1:
        return f" ({f(r['vs_free'])} vs free)"
    return f" ({f(r['vs_free'])} vs free, {f(r['vs_free_low'])} to {f(r['vs_free_high'])} over seeds)"


def reading(records: list[dict], s: dict, seeds: list[int]) -> str:
    text = sorted([r for r in records if r["task"] == "text"], key=lambda r: r["score"])
    rec = sorted([r for r in records if r["task"] == "recall"], key=lambda r: -r["score"])
    K = len(seeds)
    parts = [
        f"One-layer LSTMs of {s['hidden']} units, seed{'s' if K > 1 else ''} {', '.join(map(str, seeds))}, equal "
        f"steps, batch and width per task ({s['text_steps']} steps on text, {s['recall_steps']} on recall).",
        "Text, bits/char on held-out text (lower is better), best first: "
        + "; ".join(f"{r['arm']} {r['score']:.3f}{_gap(r, 'bits')}" for r in text)
        + ".",
        f"Recall (P = {', '.join(map(str, s['pairs']))} mixed; no binding reaches "
        f"{pct(rec[0]['no_binding'])} on average), accuracy, best first: "
        + "; ".join(f"{r['arm']} {pct(r['score'])}{_gap(r, 'acc')}" for r in rec)
        + ".",
    ]
    if K > 1:
        better = [r["arm"] for r in text if r["arm"] != "free" and r["vs_free_high"] < 0]
        worse = [r["arm"] for r in text if r["arm"] != "free" and r["vs_free_low"] > 0]
        up = [r["arm"] for r in rec if r["arm"] != "free" and r["vs_free_low"] > 0]
        down = [r["arm"] for r in rec if r["arm"] != "free" and r["vs_free_high"] < 0]
        parts.append(
            f"Against the free gate seed by seed — on text, better in every seed: {', '.join(better) or 'none'}; "
            f"worse in every seed: {', '.join(worse) or 'none'}. On recall, better in every seed: "
            f"{', '.join(up) or 'none'}; worse in every seed: {', '.join(down) or 'none'}. The others changed "
            "sign between seeds."
        )
    cpu = {r["arm"]: r["cpu_seconds"] for r in text}
    parts.append(
        "CPU-seconds a text model: " + ", ".join(f"{a} {c:.0f}" for a, c in cpu.items()) + " (floor and meta step "
        "by step, the others nn.LSTM's fused kernel; the same FLOPs but for meta's controller)."
    )
    return " ".join(parts)
