"""Screen an idea that is not a setting: bench_train's `charlm()` at a fixed token count, one thread, with a patch.

    python benchmarks/screen_ideas.py SEED TOKENS PATCHES [KEY=VALUE ...]

PATCHES is a comma list (or "-" for none) of:
    wsd:F        warmup, then the peak rate, then a linear decay over the last F of the run (to min_lr_ratio)
    softcap:C    logits = C tanh(logits / C)
    emblr:X      the embedding table's AdamW rate X times the others'
    ns:N         Muon's Newton-Schulz iterations (now a setting: muon_steps=N)
    qknorm[:G]   queries and keys at unit RMS before RoPE, in the activations' dtype (now a setting: qk_norm=true,
                 in float32), their dot product scaled by G
    zeroproj     every residual branch's output projection starts at zero (modded-nanoGPT's init)
    smear        x_t + lam x_(t-1) after the embedding, lam a vector from 0 (now a setting: smear=true)
    smear2       the same with the two previous tokens, a vector for each
    shiftall     the same at every block's input (RWKV's token shift, roughly)
    vemb         a table per layer of token vectors added to its values, from 0 (modded-nanoGPT's value embeddings)
    x0           each block's input plus a vector times the embedding, from 0
    bigram       a table of (previous, current) token pairs added to the embedding, from 0 (V² rows: a char model's)
    smeargate    the preset's smear times sigmoid(w . x_t) of the current token's embedding (modded-nanoGPT's gate)
Patches apply to today's tiny preset: qknorm and smear are settings of it now, so those patches add a second
copy (screen the setting instead, e.g. smear=false); ns overrides muon_steps. KEY=VALUE pairs are ModelConfig/TrainConfig fields
over the tiny preset's (as bench_train's --set). Prints one
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


def after_init(edit):
    init = tr.Transformer.__init__

    def __init__(self, cfg, *args, **kw):
        init(self, cfg, *args, **kw)
        edit(self, cfg)

    tr.Transformer.__init__ = __init__


def zeroproj():
    def edit(model, cfg):
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                torch.nn.init.zeros_(p)

    after_init(edit)


def smear():
    """x_t + lam * x_(t-1) after the embedding (a per-channel lam, from 0): each position sees its previous token."""

    def edit(model, cfg):
        model.smear = torch.nn.Parameter(torch.zeros(cfg.d_model))
        model.drop.register_forward_hook(lambda m, args, x: x + model.smear * F.pad(x, (0, 0, 1, 0))[:, :-1])

    after_init(edit)


def smear2():
    """smear with the two previous tokens, a lam for each"""

    def edit(model, cfg):
        model.smear = torch.nn.Parameter(torch.zeros(2, cfg.d_model))

        def hook(m, args, x):
            return x + model.smear[0] * F.pad(x, (0, 0, 1, 0))[:, :-1] + model.smear[1] * F.pad(x, (0, 0, 2, 0))[:, :-2]

        model.drop.register_forward_hook(hook)

    after_init(edit)


def shiftall():
    """smear at every block's input: x_t + lam_i * x_(t-1) of the residual stream (RWKV's token shift, roughly)"""

    def edit(model, cfg):
        model.shift = torch.nn.Parameter(torch.zeros(len(model.blocks), cfg.d_model))
        for i, block in enumerate(model.blocks):
            block.register_forward_pre_hook(
                lambda m, args, i=i: (args[0] + model.shift[i] * F.pad(args[0], (0, 0, 1, 0))[:, :-1], *args[1:])
            )

    after_init(edit)


def bigram():
    """a table of (previous token, token) pairs added to the embedding, from 0 (a char vocabulary's V² rows)"""

    def edit(model, cfg):
        V = cfg.vocab_size
        model.bigram = torch.nn.Embedding(V * V, cfg.d_model)
        torch.nn.init.zeros_(model.bigram.weight)
        seen = {}
        model.register_forward_pre_hook(lambda m, args: seen.update(idx=args[0]))

        def hook(m, args, x):
            idx = seen["idx"]
            pair = F.pad(idx, (1, 0))[:, :-1] * V + idx  # the first position pairs with token 0: its row is learnt too
            return x + model.bigram(pair).to(x.dtype)

        model.drop.register_forward_hook(hook)

    after_init(edit)


def smeargate():
    """the preset's smear vector times a gate from the current token's embedding, sigmoid(w . x_t) (modded-nanoGPT's)"""

    def edit(model, cfg):
        model.smear_gate = torch.nn.Linear(cfg.d_model, 1, bias=True)
        torch.nn.init.zeros_(model.smear_gate.weight)
        torch.nn.init.constant_(model.smear_gate.bias, 2.0)  # open at the start: sigmoid(2) = 0.88
        emb = model.tok_emb.forward

        def forward(idx, emb=emb):
            return emb(idx)

        seen = {}
        model.register_forward_pre_hook(lambda m, args: seen.update(idx=args[0]))

        def hook(m, args, x):  # x already holds e_t + smear e_(t-1): rescale the smear term by the gate
            e = model.tok_emb(seen["idx"])
            prev = F.pad(e, (0, 0, 1, 0))[:, :-1]
            gate = torch.sigmoid(model.smear_gate(e))
            return x + (gate - 1) * model.smear * prev

        model.drop.register_forward_hook(hook)

    after_init(edit)


def vemb():
    """a table per layer of token vectors added to that layer's values (modded-nanogpt's value embeddings), from 0"""

    def edit(model, cfg):
        A = cfg.n_heads * cfg.head_size
        model.vemb = torch.nn.ModuleList(torch.nn.Embedding(cfg.vocab_size, A) for _ in model.blocks)
        for table in model.vemb:
            torch.nn.init.zeros_(table.weight)
        seen = {}
        model.register_forward_pre_hook(lambda m, args: seen.update(idx=args[0]))
        for block, table in zip(model.blocks, model.vemb):

            def add(m, args, out, table=table):
                return torch.cat((out[..., : 2 * A], out[..., 2 * A :] + table(seen["idx"]).to(out.dtype)), -1)

            block.attn.qkv.register_forward_hook(add)

    after_init(edit)


def x0():
    """each block's input plus lam_i times the embedding (a per-channel lam per block, from 0)"""

    def edit(model, cfg):
        model.x0_lam = torch.nn.Parameter(torch.zeros(len(model.blocks), cfg.d_model))
        seen = {}

        def keep(m, args, x):
            seen.update(x0=x)

        model.drop.register_forward_hook(keep)
        for i, block in enumerate(model.blocks):
            if i:
                block.register_forward_pre_hook(
                    lambda m, args, i=i: (args[0] + model.x0_lam[i] * seen["x0"], *args[1:])
                )

    after_init(edit)


PATCHES = {
    "wsd": wsd,
    "softcap": softcap,
    "emblr": emblr,
    "ns": ns,
    "qknorm": qknorm,
    "zeroproj": zeroproj,
    "smear": smear,
    "smear2": smear2,
    "shiftall": shiftall,
    "vemb": vemb,
    "bigram": bigram,
    "smeargate": smeargate,
    "x0": x0,
}


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
