"""`charlm explore`'s goals (issue 29): the first screen ≤ 1 s after the model is loaded (tiny preset, 256
tokens), a cursor or head move redrawn in ≤ 50 ms, a knock-out or an edit re-run in ≤ 0.5 s.

    python benchmarks/bench_explore.py                 # tiny preset Transformer and LSTM, 256 tokens, 5 repeats
    python benchmarks/bench_explore.py --ckpt RUN      # a trained run instead (its own preset)

The models are freshly initialised tiny presets over tinyshakespeare's characters (speed does not depend
on what a model learnt). Each figure is the median over the repeats of:
  first screen   ExploreApp built (every number computed) until Textual has drawn its first frame, headless
  key → drawn    one key press through Textual's pilot, until the screen is idle again (the harness's own
                 wait included: an upper bound on what a person sees); and the app's own work for it (the
                 action, then every widget's render()), without the harness
  knock-out      x on a head never knocked out before (the text re-read in every window)
  edit           the text replaced (re-encoded, every number computed again), redrawn
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import torch

from charlm.explore.app import ExploreApp
from charlm.explore.widgets import TextPane
from charlm.models import build_model
from charlm.presets import train_configs
from charlm.runtime import cpu_name
from charlm.storage import checkpoint
from charlm.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpora" / "tinyshakespeare.txt"


def models(ckpt: str | None):
    if ckpt:
        ck = checkpoint.load(ckpt)
        yield ck.path.parent.name, ck.model, ck.tokenizer
        return
    text = CORPUS.read_text(encoding="utf-8")
    tok = CharTokenizer(sorted(set(text)))
    for kind in ("transformer", "lstm"):
        cfg, _ = train_configs("tiny", {"kind": kind})
        cfg.vocab_size = tok.vocab_size
        torch.manual_seed(0)
        yield f"tiny {kind}", build_model(cfg).eval(), tok


def own_work(app: ExploreApp, action) -> float:
    """Seconds of the app's own work for a key: the action, then every widget's render()."""
    t = time.perf_counter()
    action()
    app.query_one(TextPane).render()
    for name in ("#title", "#grid", "#panel", "#note", "#keys"):
        app.query_one(name).render()
    return time.perf_counter() - t


async def measure(model, tok, ids: list[int], edit_ids: list[int]) -> dict:
    t0 = time.perf_counter()
    app = ExploreApp(model, tok, ids, name="bench")
    out = {}
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        out["first screen"] = time.perf_counter() - t0
        keys = ["z", "left", "up"] if app.rnn else ["z", "left", "right_square_bracket", "up"]  # z: no key's
        for key in keys:
            times = []
            for _ in range(10):
                t = time.perf_counter()
                await pilot.press(key)
                times.append(time.perf_counter() - t)
            out[f"key {key} → drawn (pilot)"] = statistics.median(times)  # z: the harness's own cost
        out["cursor move (own work)"] = statistics.median(own_work(app, lambda: app.action_move(-1)) for _ in range(20))
        other = (lambda: app.action_view("vertical", 1)) if app.rnn else (lambda: app.action_view("bracket", 1))
        out["head/unit move (own work)"] = statistics.median(own_work(app, other) for _ in range(20))
        app.scene.knockouts.clear()
        t = time.perf_counter()
        await pilot.press("x")
        out["knock-out"] = time.perf_counter() - t
        text = tok.decode(edit_ids)
        t = time.perf_counter()
        app.rerun(text)
        await pilot.pause()
        out["edit"] = time.perf_counter() - t
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", help="a trained run to time instead of the fresh tiny presets")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    text = CORPUS.read_text(encoding="utf-8")
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    for name, model, tok in models(args.ckpt):
        ids = tok.encode(text[: args.tokens * 8], unknown="drop")[: args.tokens]
        edit = tok.encode(text[5000 : 5000 + args.tokens * 8], unknown="drop")[: args.tokens]
        runs = [asyncio.run(measure(model, tok, ids, edit)) for _ in range(args.repeats)]
        cfg = model.cfg
        size = f"{cfg.n_layers}×{cfg.d_model}" + (f", {cfg.n_heads} heads" if cfg.kind == "transformer" else "")
        print(f"\n{name} ({size}, context {cfg.context}), {len(ids)} tokens, median of {args.repeats}:")
        for key in runs[0]:
            values = [r[key] for r in runs]
            print(f"  {key:<28} {statistics.median(values) * 1000:8.1f} ms   (max {max(values) * 1000:.1f})")


if __name__ == "__main__":
    main()
