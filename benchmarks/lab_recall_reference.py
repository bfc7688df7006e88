"""An independent check of `charlm lab recall`: a plain-PyTorch 2-layer Transformer (width 64, 2 heads) on
charlm's recall examples, fresh ones every step, loss on the answers only; AdamW 3e-3 (betas 0.9/0.95,
weight decay 0.1, clipping 1.0, charlm's), batch 64, constant learning rate, one thread. MODE makes it
charlm-like one piece at a time (any of them joined by '-'):

    rms      RMSNorm without bias, not LayerNorm        rope    rotary positions, not learned ones
    relu2    ReLU² in the MLP, not GELU                 nobias  no biases in the linear layers
    init     charlm's lab init before this round: matrices and embeddings N(0, 0.05), residual
             projections N(0, 0.01) (PyTorch's own otherwise: embeddings N(0, 1), linear ~1/sqrt(3 fan-in))

    python benchmarks/lab_recall_reference.py P SEED STEPS [MODE]
    python benchmarks/lab_recall_reference.py 8 0 1000 init      # prints the accuracy every 200 steps

benchmarks/RESULTS.md ("Lab") has what each gave: only `init` kept the model in its elimination shortcut.
"""

import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.lab import tasks
from charlm.models.transformer import apply_rope, rope_tables

torch.set_num_threads(1)
P, seed, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else ""
torch.manual_seed(seed)
alpha = "\n" + tasks.alphabet("recall")
stoi = {c: i for i, c in enumerate(alpha)}
T, d, H = tasks.example_length("recall", P) + 1, 64, 2
hs = d // H
cos, sin = rope_tables(hs, T)
bias = "nobias" not in mode


def batch(rng: random.Random, n: int):
    """n fresh examples, one a row from its newline: inputs (the filler in place of each answer), targets, and
    where the answers are."""
    ex = [tasks.recall_example(rng, P) for _ in range(n)]
    x = torch.tensor([[stoi[c] for c in "\n" + e.text] for e in ex])
    read = torch.tensor([[stoi[c] for c in "\n" + e.inputs] for e in ex])
    m = torch.zeros(n, T, dtype=torch.bool)
    for b, e in enumerate(ex):
        m[b, [t + 1 for t in e.targets]] = True
    return read[:, :-1], x[:, 1:], m[:, 1:]


def norm() -> nn.Module:
    return nn.RMSNorm(d) if "rms" in mode else nn.LayerNorm(d)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = norm(), norm()
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias)
        self.fc, self.fc2 = nn.Linear(d, 4 * d, bias=bias), nn.Linear(4 * d, d, bias=bias)

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = (t.view(B, L, H, hs).transpose(1, 2) for t in self.qkv(self.n1(x)).split(d, 2))
        if "rope" in mode:
            q, k = apply_rope(q, cos[:L], sin[:L]), apply_rope(k, cos[:L], sin[:L])
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, d)
        x = x + self.proj(y)
        h = self.fc(self.n2(x))
        return x + self.fc2(F.relu(h).square() if "relu2" in mode else F.gelu(h))


class Model(nn.Module):
    def __init__(self, V: int):
        super().__init__()
        self.emb, self.pos = nn.Embedding(V, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.norm, self.out = norm(), nn.Linear(d, V, bias=bias)
        if "init" in mode:
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.01 if name.endswith(("proj.weight", "fc2.weight")) else 0.05)

    def forward(self, x):
        h = self.emb(x) + (0 if "rope" in mode else self.pos(torch.arange(x.size(1))))
        for block in self.blocks:
            h = block(h)
        return self.out(self.norm(h))


model = Model(len(alpha))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
rng, fresh = random.Random(seed), random.Random(10_000 + seed)
xe, ye, me = batch(fresh, 300)
t0, row = time.process_time(), []
for step in range(1, steps + 1):
    x, y, mask = batch(rng, 64)
    loss = F.cross_entropy(model(x)[mask], y[mask])
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step % 200 == 0:
        with torch.no_grad():
            row.append(f"{step}:{(model(xe).argmax(-1)[me] == ye[me]).float().mean().item():.2f}")
print(mode or "base", f"seed {seed}", " ".join(row), f"cpu {time.process_time() - t0:.0f} s", flush=True)
