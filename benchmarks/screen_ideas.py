"""Screen an idea that is not a setting: bench_train's `charlm()` at a fixed token count, one thread, with a patch.

    python benchmarks/screen_ideas.py SEED TOKENS PATCHES [KEY=VALUE ...]

PATCHES is a comma list (or "-" for none) of:
    wsd:F        warmup, then the peak rate, then a linear decay over the last F of the run (to min_lr_ratio)
    softcap:C    logits = C tanh(logits / C)
    emblr:X      the embedding table's AdamW rate X times the others'
    ns:N         Muon's Newton-Schulz iterations (now a setting: muon_steps=N)
    qknorm[:G]   queries and keys at unit RMS before RoPE, in the activations' dtype (now a setting: qk_norm=true,
                 in float32), their dot product scaled by G
KEY=VALUE pairs are ModelConfig/TrainConfig fields over the tiny preset's (as bench_train's --set). Prints one
JSON line: the run, scored as every figure in RESULTS.md is (charlm.evaluate over the whole last 10%).
The protocol of "The tiny preset, round six" in RESULTS.md: two seeds side by side, one thread each; an idea's
loss at the token count the shape reaches in nanoGPT's recipe time (loss per token does not depend on the load).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train as bt

from charlm.models import transformer as tr
from charlm.training import trainer as trn


def wsd(fraction: float):
    def lr_at(cfg, step, elapsed):
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        progress = step / cfg.steps
        if cfg.max_time:
            progress = max(progress, elapsed / cfg.max_time)
        left = min(1.0, max(0.0, (1 - progress) / fraction))
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * left)

    trn.lr_at = lr_at


def softcap(cap: float):
    init = tr.Transformer.__init__

    def __init__(self, cfg, *args, **kw):
        init(self, cfg, *args, **kw)
        forward = self.head.forward
        self.head.forward = lambda x: cap * torch.tanh(forward(x) / cap)

    tr.Transformer.__init__ = __init__


def with_optimizer(edit):
    make = trn.make_optimizer

    def make_optimizer(model, cfg, device):
        opt = make(model, cfg, device)
        edit(model, opt)
        return opt

    trn.make_optimizer = make_optimizer


def emblr(scale: float):
    def edit(model, opt):
        group = opt.optimizers[-1].param_groups[0]  # AdamW's matrices: with a tied head, the embedding alone
        assert len(group["params"]) == 1 and group["params"][0] is model.tok_emb.weight
        group["lr_scale"] = scale

    with_optimizer(edit)


def ns(steps: int):
    def edit(model, opt):
        for group in opt.optimizers[0].param_groups:
            group["ns_steps"] = steps

    with_optimizer(edit)


def qknorm(gain: float = 1.0):
    rope, g = tr.apply_rope, math.sqrt(gain)
    tr.apply_rope = lambda x, cos, sin: rope(F.rms_norm(x, (x.size(-1),)) * g, cos, sin)


PATCHES = {"wsd": wsd, "softcap": softcap, "emblr": emblr, "ns": ns, "qknorm": qknorm}


def main() -> None:
    seed, tokens, patches = int(sys.argv[1]), int(float(sys.argv[2])), sys.argv[3]
    torch.set_num_threads(1)
    for patch in [] if patches == "-" else patches.split(","):
        name, *args = patch.split(":")
        if name not in PATCHES:
            raise SystemExit(f"unknown patch {name!r}: choose from {', '.join(PATCHES)}")
        PATCHES[name](*(float(a) if name != "ns" else int(a) for a in args))
    tokenizer, path, _ = bt.prepare(bt.CORPUS, "char", None)
    batches = bt.Batches(bt.load_tokens(path), context=64)
    t0 = time.time()
    run = bt.charlm(tokenizer, batches, seed, None, tokens, overrides=bt.parse_set(sys.argv[4:]))
    del run["curve"]
    run.update(name=" ".join([patches, *sys.argv[4:]]), tokens=tokens, wall=round(time.time() - t0))
    print(json.dumps(run), flush=True)


if __name__ == "__main__":
    main()
