"""nanoGPT's shakespeare_char recipe with the README's CPU overrides, re-implemented as published: the
baseline that benchmarks/bench_train.py gives charlm's time budget.

Follows karpathy/nanoGPT's model.py (GPT, LayerNorm, CausalSelfAttention, MLP, Block, _init_weights,
configure_optimizers) and train.py (get_lr, get_batch, the loop) run as

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
        --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
        --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

i.e. 4 layers x 128, 4 heads, context 64, batch 12, learned positions, GELU, tied head, dropout 0, no bias
(train.py's `bias = False`: LayerNorm and Linears without bias), fp32 (train.py autocasts only on CUDA),
AdamW (betas 0.9/0.99, weight decay 0.1 on matrices and embeddings), lr 1e-3 with 100 warmup iterations
then cosine to 1e-4 at iteration 2000, gradient clipping at 1.0, seed 1337, iterations 0..2000 inclusive.
Left out, as they do not change the training: from_pretrained, generate, crop_block_size, the attention
fallback for torch < 2, the periodic evaluations and logging (the benchmark scores the model itself).
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

# config/train_shakespeare_char.py + the README's CPU overrides (train.py's defaults for the rest)
RECIPE = {
    "batch_size": 12,
    "block_size": 64,
    "n_layer": 4,
    "n_head": 4,
    "n_embd": 128,
    "dropout": 0.0,
    "bias": False,
    "learning_rate": 1e-3,
    "max_iters": 2000,
    "lr_decay_iters": 2000,
    "min_lr": 1e-4,
    "warmup_iters": 100,
    "weight_decay": 1e-1,
    "beta1": 0.9,
    "beta2": 0.99,
    "grad_clip": 1.0,
    "seed": 1337,
}


# ---- model.py -----------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "wpe": nn.Embedding(config.block_size, config.n_embd),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                "ln_f": LayerNorm(config.n_embd, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # scaled init of the residual projections, per GPT-2
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        _, t = idx.size()
        assert t <= self.config.block_size, (
            f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        )
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # shape (t)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:  # inference-time mini-optimization: only forward the lm_head on the very last position
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """nanoGPT's generate(), as published: the whole (cropped) window through the model for every token."""
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size :]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        # every 2D tensor (matmul weights, embeddings) is decayed; biases and layernorms are not
        groups = [
            {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
        ]
        fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if fused else {}))


# ---- train.py -----------------------------------------------------------------------------------


def get_lr(it: int, r: dict = RECIPE) -> float:
    if it < r["warmup_iters"]:  # 1) linear warmup
        return r["learning_rate"] * (it + 1) / (r["warmup_iters"] + 1)
    if it > r["lr_decay_iters"]:  # 2) after the decay, min_lr
        return r["min_lr"]
    decay_ratio = (it - r["warmup_iters"]) / (r["lr_decay_iters"] - r["warmup_iters"])  # 3) cosine in between
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return r["min_lr"] + coeff * (r["learning_rate"] - r["min_lr"])


def get_batch(data: np.ndarray, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


def train(train_data: np.ndarray, vocab_size: int, recipe: dict = RECIPE, on_iter=None) -> tuple[GPT, float]:
    """Train the recipe on token ids; returns the model and the seconds the iterations took (model
    building excluded, as charlm's train_seconds excludes its setup). on_iter(iter_num, seconds, model)
    is called after each optimizer step (its own time is not counted)."""
    r = recipe
    torch.manual_seed(r["seed"])
    model = GPT(
        GPTConfig(
            block_size=r["block_size"],
            vocab_size=vocab_size,
            n_layer=r["n_layer"],
            n_head=r["n_head"],
            n_embd=r["n_embd"],
            dropout=r["dropout"],
            bias=r["bias"],
        )
    )
    optimizer = model.configure_optimizers(r["weight_decay"], r["learning_rate"], (r["beta1"], r["beta2"]), "cpu")
    model.train()
    X, Y = get_batch(train_data, r["batch_size"], r["block_size"])  # fetch the very first batch
    seconds, iter_num = 0.0, 0
    while True:
        t0 = time.perf_counter()
        lr = get_lr(iter_num, r)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        _, loss = model(X, Y)
        X, Y = get_batch(train_data, r["batch_size"], r["block_size"])  # prefetch the next batch, as train.py
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # train.py reads the loss every log_interval (1) iterations: a sync point on GPUs
        seconds += time.perf_counter() - t0
        iter_num += 1
        if on_iter:
            on_iter(iter_num, seconds, model)
        if iter_num > r["max_iters"]:
            return model, seconds


class Scored(nn.Module):
    """A GPT seen through charlm's model contract (cfg.context, window, forward -> (logits, _)),
    so charlm.evaluate scores it with the same windows as a charlm model: no second scoring rule."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt = gpt
        self.cfg = SimpleNamespace(context=gpt.config.block_size)
        self.window = gpt.config.block_size

    def forward(self, idx):
        # given targets, GPT.forward returns the logits of every position (without, only the last);
        # these placeholder targets only make it do so, and their loss is dropped
        logits, _ = self.gpt(idx, targets=idx.new_zeros(idx.shape))
        return logits, None
