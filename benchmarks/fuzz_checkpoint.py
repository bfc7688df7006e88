"""Coverage-guided fuzzing of the checkpoint loader (issues 20 and 39): atheris (libFuzzer for Python) feeds
files mutated from a few small seeds to checkpoint.read_header, and each file it accepts to the commands that
show a checkpoint (info, runs) and to checkpoint.load and charlm sample.

    python benchmarks/fuzz_checkpoint.py                  # a minute, on safetensors checkpoints
    python benchmarks/fuzz_checkpoint.py --seconds 1800   # what benchmarks/RESULTS.md records
    python benchmarks/fuzz_checkpoint.py --target pt      # an older charlm's .pt files (storage/safe_pickle.py)
    python benchmarks/fuzz_checkpoint.py --make-seeds     # write benchmarks/fuzz_seeds/ again
    python benchmarks/fuzz_checkpoint.py --replay FILE... # each file once, through the same checks
    python benchmarks/fuzz_checkpoint.py --target resume  # last.safetensors's training state, through train --resume
    python benchmarks/fuzz_checkpoint.py --target cache   # a token-cache entry, through data.prepare

Four targets (--target): "checkpoint" (the default) as above, on safetensors files (the seeds of
benchmarks/fuzz_seeds/, older charlm's .pt files, written again as safetensors at the start); "pt": the same on
those .pt files as they are (the reader kept for them); "resume": a mutated last.safetensors (mutations aimed
at its optimizer and RNG state, four in five) beside the corpus it was trained on, through `charlm train
--resume` for one more step: it must train (and leave checkpoints that read back) or refuse in one line;
"cache": a mutated token-cache entry (.npy, and its .json record after a b"\0--\0" line) where data.prepare
looks for the corpus's tokens: prepare must give exactly the corpus's tokens (the entry rebuilt if needed)
or refuse in one line naming the cache.

A finding is: any exception but CheckpointError; a CheckpointError of more than one line, or that does not
name the file; a command that fails (non-zero exit, "please report it") on a file the reader accepted; a hang
(--timeout); memory beyond --rss-mb; a crash of the interpreter. Findings go to benchmarks/fuzz_out/findings/
(git-ignored): each input with a .txt saying what went wrong (the first input of each kind); the corpus it
grows is benchmarks/fuzz_out/corpus/. One process (libFuzzer alone, no workers), started again after a hang,
a crash or running out of memory, until the time is spent. Needs atheris: pip install -e '.[dev]'.

Most mutations keep the file's structure and change what is inside it. A safetensors file: one value inside a
metadata field's JSON (a config field, the tokenizer's JSON, the optimizer's structure...), a tensor entry's
dtype, shape or byte range, a tensor's stored values, an entry dropped or renamed, the header's length. A .pt
file (a byte flipped mostly breaks a checksum): data.pkl's bytes, one value of the pickled payload or a
tensor's stored values, the archive's entries. The rest are libFuzzer's own mutations of the whole file.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import hashlib
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import types
import warnings
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = "checkpoint"
SEEDS = HERE / "fuzz_seeds"
OUT = HERE / "fuzz_out"
MAX_LEN = 1 << 18  # inputs up to 256 KB: the seeds are a few KB each


# ---- the target ---------------------------------------------------------------------------------


class Target:
    """One input: a file in a scratch run directory, read as every command reads it."""

    def __init__(self, findings: Path, scratch: Path):
        from click.testing import CliRunner

        from charlm import errors
        from charlm.cli import main
        from charlm.storage import checkpoint

        self.checkpoint, self.errors, self.main, self.runner = checkpoint, errors, main, CliRunner()
        self.findings = findings
        self.dir = scratch / "runs"
        self.run = self.dir / "run"
        self.run.mkdir(parents=True, exist_ok=True)
        self.file = self.run / (checkpoint.OLD_LAST if TARGET == "pt" else checkpoint.LAST)
        self.seen: collections.Counter = collections.Counter()

    def __call__(self, data: bytes) -> None:
        self.file.write_bytes(data)
        try:
            self.checkpoint.read_header(self.file)
        except self.errors.CheckpointError as e:
            self._check_refusal(e, data)
            return
        except Exception as e:  # noqa: BLE001 - what the fuzzer is looking for
            self.found(_exception_signature(e), data, traceback.format_exc())
            return
        for args in (
            ["info", self.run],
            ["info", self.run, "--json"],
            ["runs", self.dir],
            ["runs", self.dir, "--json"],
        ):
            self._command(args, data)
        try:
            self.checkpoint.load(self.file)
        except self.errors.CheckpointError as e:  # torch.load and load_state_dict check more than the header
            self._check_refusal(e, data)
            return
        except Exception as e:  # noqa: BLE001
            self.found(_exception_signature(e), data, traceback.format_exc())
            return
        self._command(["sample", self.file, "-n", "3", "--seed", "0"], data)

    def _check_refusal(self, e: Exception, data: bytes) -> None:
        text = str(e)
        if "\n" in text or str(self.file) not in text:
            self.found(
                f"refusal-{_shape(text)}", data, f"a CheckpointError that is not one line naming the file:\n{text}"
            )

    def _command(self, args: list, data: bytes, ok: tuple[int, ...] = (0,)):
        r = self.runner.invoke(self.main, [str(a) for a in args])
        err = r.stderr.strip()
        one_line = r.exit_code == 0 or (err.startswith("error: ") and "\n" not in err)
        if r.exit_code not in ok or not one_line or "please report" in err or "Traceback" in r.output:
            tb = (
                "".join(traceback.format_exception(r.exc_info[1]))
                if r.exc_info and r.exc_info[0] is not SystemExit
                else ""
            )
            self.found(
                f"{args[0]}-exit{r.exit_code}-{_shape(err.splitlines()[-1] if err else '')}",
                data,
                f"charlm {' '.join(map(str, args))} -> exit {r.exit_code}\n{err}\n{tb}",
            )
        return r

    def found(self, signature: str, data: bytes, details: str) -> None:
        signature = re.sub(r"[^\w.-]+", "-", signature)[:80].strip("-")
        key = f"{signature}-{hashlib.sha1(signature.encode()).hexdigest()[:8]}"
        self.seen[key] += 1
        if self.seen[key] > 1:
            return
        self.findings.mkdir(parents=True, exist_ok=True)
        (self.findings / f"{key}.ckpt").write_bytes(data)
        (self.findings / f"{key}.txt").write_text(details, encoding="utf-8", errors="replace")
        print(f"\nFINDING {key}: {details.strip().splitlines()[-1][:200]}", file=sys.stderr, flush=True)


CORPUS = "ab ba abba.\n" * 40  # the text the seeds were trained on (make_seeds)


class ResumeTarget(Target):
    """One input: a last.safetensors in a fresh run directory, resumed for one step by `charlm train --resume`."""

    def __init__(self, findings: Path, scratch: Path):
        super().__init__(findings, scratch)
        self.corpus = scratch / "corpus.txt"
        self.corpus.write_text(CORPUS, encoding="utf-8")

    def __call__(self, data: bytes) -> None:
        shutil.rmtree(self.run, ignore_errors=True)
        self.run.mkdir(parents=True)
        self.file.write_bytes(data)
        try:
            saved = self.checkpoint.read(self.file)
        except self.errors.CheckpointError as e:
            self._check_refusal(e, data)
            return
        except Exception as e:  # noqa: BLE001
            self.found(_exception_signature(e), data, traceback.format_exc())
            return
        if saved.optimizer is None or not isinstance(saved.step, int) or saved.step >= 10**6:
            return  # nothing a resume would read past the one-line refusal checkpoint_read's target covers
        args = ["train", self.corpus, "--out", self.run, "--resume", "--steps", saved.step + 1]
        r = self._command([*args, "--eval-iters", "1", "--sample-tokens", "0", "--device", "cpu"], data, ok=(0, 1))
        if r is not None and r.exit_code == 0:
            for name in (self.checkpoint.LAST, self.checkpoint.BEST):  # exit 0: what it wrote must read back
                if (self.run / name).exists():
                    try:
                        self.checkpoint.read(self.run / name)
                    except Exception as e:  # noqa: BLE001
                        self.found(f"unreadable-{name}-{_shape(str(e))}", data, f"resumed, then: {e}")


class CacheTarget:
    """One input: a token-cache entry (and optionally its record) where data.prepare looks for the tokens of
    a small corpus: prepare must return exactly that corpus's tokens, or refuse in one line naming the cache."""

    def __init__(self, findings: Path, scratch: Path):
        import numpy as np

        from charlm import data

        self.np, self.data, self.findings = np, data, findings
        self.seen: collections.Counter = collections.Counter()
        self.corpus = scratch / "cache-corpus.txt"
        self.corpus.write_text(CORPUS + "and a bit more, ünïcode too.\n", encoding="utf-8")
        tok, path, self.sha = data.prepare(self.corpus, "char", None)
        self.want = np.array(data.load_tokens(path))
        self.tokenizer, self.path = tok, path
        self.record = path.with_suffix(".json").read_bytes()

    found = Target.found

    def __call__(self, blob: bytes) -> None:
        npy, sep, record = blob.partition(SEP)
        self.path.write_bytes(npy)
        self.path.with_suffix(".json").write_bytes(record if sep else self.record)
        try:
            tok, path, _ = self.data.prepare(self.corpus, "char", None, sha256=self.sha)
            got = self.np.array(self.data.load_tokens(path))
        except (self.data.CorpusError, self.data.files.WriteError) as e:
            if "\n" in str(e) or str(self.path.parent) not in str(e):
                self.found(f"refusal-{_shape(str(e))}", blob, f"not one line naming the cache:\n{e}")
            return
        except Exception as e:  # noqa: BLE001
            self.found(_exception_signature(e), blob, traceback.format_exc())
            return
        if tok.to_json() != self.tokenizer.to_json() or got.shape != self.want.shape or (got != self.want).any():
            self.found("cache-lies", blob, f"prepare() gave {got.shape} tokens, not the corpus's {self.want.shape}")


SEP = b"\0--\0"


def _exception_signature(e: BaseException) -> str:
    """The exception's type and the innermost frame of charlm's (or the innermost of all) that raised it."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "charlm" in f.filename] or frames
    where = f"{Path(ours[-1].filename).stem}.{ours[-1].lineno}" if ours else "?"
    return f"{type(e).__name__}-{where}"


def _shape(text: str) -> str:
    """A message with its paths and numbers taken out: one signature for one kind of failure."""
    text = re.sub(r"/\S+", "PATH", text)
    return re.sub(r"\d+", "N", text)[:60]


# ---- the mutator ------------------------------------------------------------------------------------


FOCUS: tuple[str, ...] = ()  # the payload's fields most mutations go to (--target resume: the training state)


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """Four in five: inside the file (it stays a safetensors file, or a valid zip); else libFuzzer's byte
    mutations."""
    import atheris

    rng = random.Random(seed)
    if TARGET == "cache":
        return atheris.Mutate(data, max_size)
    if rng.random() < 0.8:
        try:
            out = _mutate_inside(data, rng) if TARGET == "pt" else _mutate_safetensors(data, rng)
        except Exception:  # noqa: BLE001 - not a zip, or a data.pkl that does not read: mutate the bytes
            out = None
        if out is not None and len(out) <= max_size:
            return out
    return atheris.Mutate(data, max_size)


SPECIAL = [b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\xff\xff\x7f\x7f", b"\x80\x7f", b"\xff\xff"]  # NaN, inf...


def _mutate_safetensors(data: bytes, rng: random.Random) -> bytes | None:
    """One change inside a safetensors file, the header written again with its true length (but one in twenty)."""
    import atheris

    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    meta = header.setdefault("__metadata__", {})
    names = [k for k in header if k != "__metadata__"]
    what = rng.random()
    if what < 0.4 and meta:  # one value inside one metadata field's JSON
        focus = [k for k in FOCUS if k in meta]
        key = rng.choice(focus if focus and rng.random() < 0.8 else list(meta))
        value = json.loads(meta[key])
        value = mutate_tree(value, rng) if isinstance(value, (dict, list)) else interesting(rng, value)
        meta[key] = json.dumps(value, default=repr) if rng.random() < 0.9 else meta[key][: len(meta[key]) // 2]
    elif what < 0.6 and names:  # one tensor entry's dtype, shape or byte range
        e = header[rng.choice(names)]
        field = rng.choice(["dtype", "shape", "data_offsets"])
        old = e.get(field)
        if isinstance(old, list) and old and rng.random() < 0.7:
            i = rng.randrange(len(old))
            old[i] = interesting(rng, old[i])
        else:
            e[field] = rng.choice(
                [interesting(rng, old), "F16", "BF16", "F64", "I64", "I8", "U8", [], [0], [2**40, 2**40]]
            )
    elif what < 0.85 and names:  # a tensor's stored values
        begin, end = header[rng.choice(names)]["data_offsets"]
        value = body[begin:end]
        if value and rng.random() < 0.5:
            at = rng.randrange(0, max(len(value) - 3, 1))
            special = rng.choice(SPECIAL)
            value = (value[:at] + special + value[at + len(special) :])[: len(value)]
        else:
            value = atheris.Mutate(value, len(value) + 16)
        body = body[:begin] + value + body[end:]
    elif what < 0.95:  # an entry or a metadata field dropped, or renamed
        holder = rng.choice([header, meta])
        if holder:
            key = rng.choice(list(holder))
            value = holder.pop(key)
            if rng.random() < 0.5:
                holder[rng.choice([key + ".1", "head.weight", "model", "optimizer", "rng", key.upper(), ""])] = value
    h = json.dumps(header, default=repr).encode()
    length = len(h) if rng.random() < 0.95 else interesting(rng, len(h)) % 2**64
    return struct.pack("<Q", length) + h + body


def safetensors_seeds(where: Path) -> Path:
    """The seeds of fuzz_seeds/ (an older charlm's .pt files), written again as safetensors checkpoints."""
    from charlm.storage import checkpoint

    where.mkdir(parents=True, exist_ok=True)
    for seed in sorted(SEEDS.glob("*.ckpt")):
        checkpoint.save(checkpoint.read(seed), where / seed.name)
    return where


def _mutate_inside(data: bytes, rng: random.Random) -> bytes | None:
    import atheris

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        entries = {info.filename: z.read(info) for info in z.infolist()}
    pkl = next((n for n in entries if n.endswith("/data.pkl")), None)
    if pkl is None:
        return None
    what = rng.random()
    if what < 0.45:  # one value of the payload
        entries[pkl] = encode(mutate_tree(decode(entries[pkl]), rng))
    elif what < 0.75:  # the pickle's bytes
        entries[pkl] = atheris.Mutate(entries[pkl], len(entries[pkl]) + 64)
    elif what < 0.9:  # a tensor's stored values
        name = rng.choice([n for n in entries if "/data/" in n] or [pkl])
        value = entries[name]
        if value and rng.random() < 0.5:
            at = rng.randrange(0, max(len(value) - 3, 1))
            special = rng.choice(SPECIAL)
            value = value[:at] + special + value[at + len(special) :]
        else:
            value = atheris.Mutate(value, len(value) + 16)
        entries[name] = value
    else:  # the archive's entries: one dropped, doubled or renamed
        name = rng.choice(list(entries))
        op = rng.randrange(3)
        if op == 0:
            del entries[name]
        elif op == 1:
            entries[name + rng.choice(["", "/", ".1"])] = entries[name]
        else:
            entries[name.replace("archive", rng.choice(["other", "archive/archive", ""]), 1)] = entries.pop(name)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:  # ZIP_STORED, as torch.save writes
        for name, value in entries.items():
            z.writestr(name, value)
    return out.getvalue()


def decode(pkl: bytes):
    """data.pkl as the header reader sees it: plain values, tensors as TensorInfo."""
    from charlm.storage.safe_pickle import HeaderUnpickler

    return HeaderUnpickler(io.BytesIO(pkl)).load()


def encode(tree) -> bytes:
    """The payload as torch.save pickles it (protocol 2, storages as persistent ids)."""
    buf = io.BytesIO()
    _Writer(buf, protocol=2).dump(tree)
    return buf.getvalue()


@dataclasses.dataclass(frozen=True)
class _Stored:
    kind: object
    key: object
    numel: object


class _Writer(pickle.Pickler):
    def reducer_override(self, obj):
        from charlm.storage.safe_pickle import TensorInfo

        if isinstance(obj, TensorInfo):
            import torch._utils

            storage = _Stored(obj.dtype, obj.key, obj.storage_numel)
            return torch._utils._rebuild_tensor_v2, (
                storage,
                obj.offset,
                obj.shape,
                obj.stride,
                False,
                collections.OrderedDict(),
            )
        return NotImplemented

    def persistent_id(self, obj):
        if isinstance(obj, _Stored):
            import torch

            kind = getattr(torch, obj.kind, None) if isinstance(obj.kind, str) else None
            return ("storage", kind if isinstance(kind, type) else torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None


FIELDS = (  # names a payload holds, for keys to add
    "format version run_name model_config train_config tokenizer model step train_seconds best_val_loss "
    "best_val_bpc params device metrics corpus optimizer rng scaler world_size weights_sha256 distributed "
    "kind vocab_size n_layers d_model n_heads context dropout positions mlp_ratio qk_norm smear tied steps max_time "
    "batch_size precision grad_accum lr min_lr_ratio warmup seed name sha256 train_tokens val_tokens chars_per_token "
    "chars merges vocab type"
).split()


def interesting(rng: random.Random, like=None):
    """A value of the kind that breaks parsers: bounds, non-finite numbers, wrong types, control bytes."""
    if isinstance(like, bool) or rng.random() < 0.3:
        pass
    elif isinstance(like, int):
        return rng.choice([like + 1, like - 1, -like, like * 2, like * 1000, 0, 1, -1, 2**31, 2**63, -(2**63), 10**30])
    elif isinstance(like, float):
        return rng.choice([-like, like * 1e30, 0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, float(int(like))])
    elif isinstance(like, str):
        return rng.choice([like + "\x00", like[: len(like) // 2], like * 3, "\x1b[2J" + like, like.upper(), ""])
    return rng.choice(
        [0, 1, -1, 2, 257, 2**31, 2**63 - 1, 2**63, -(2**63), 10**30, 10**5000, 0.5, 1e308, math.nan, math.inf,
         -math.inf, True, False, None, "", "x", "transformer", "lstm", "gru", "char", "bpe", "rope", "learned",
         "\x00\x1b[2J[bold]\x07", "\ud800", "a" * 5000, b"\xff\xfe", [], {}, (), [1, 2], {"a": 1}, {1: 2},
         [[[[[[[[[[0]]]]]]]]]], collections.OrderedDict(a=1)]
    )  # fmt: skip


def mutate_tree(tree, rng: random.Random):
    """tree with one value changed, one key removed or added, or a string's JSON changed (the tokenizer)."""
    from charlm.storage.safe_pickle import TensorInfo

    slots = []  # (container, key) of every value, the root's holder included
    seen = set()  # containers walked: a decoded pickle may share them (2^depth paths through a few KB)

    def walk(holder, key, value, depth):
        slots.append((holder, key))
        if depth > 20 or id(value) in seen or len(slots) > 10_000:
            return
        if isinstance(value, (dict, list)):
            seen.add(id(value))
        if isinstance(value, dict):
            for k, v in value.items():
                walk(value, k, v, depth + 1)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(value, i, v, depth + 1)

    root = [tree]
    focus = [k for k in FOCUS if isinstance(tree, dict) and k in tree]
    if focus and rng.random() < 0.8:  # inside one field: the optimizer's or the RNG's state
        k = rng.choice(focus)
        walk(tree, k, tree[k], 1)
    else:
        walk(root, 0, tree, 0)
    holder, key = rng.choice(slots)
    value = holder[key]
    op = rng.random()
    if isinstance(value, TensorInfo) and op < 0.7:
        name = rng.choice(["dtype", "key", "shape", "stride", "offset", "storage_numel"])
        old = getattr(value, name)
        if isinstance(old, tuple) and old and rng.random() < 0.7:
            i = rng.randrange(len(old))
            new = old[:i] + (interesting(rng, old[i]),) + old[i + 1 :]
        else:
            new = rng.choice([interesting(rng, old), "HalfStorage", "BFloat16Storage", "DoubleStorage", "LongStorage"])
        holder[key] = dataclasses.replace(value, **{name: new})
    elif isinstance(value, str) and value[:1] in "{[" and op < 0.6:  # JSON inside a string: the tokenizer
        holder[key] = json.dumps(mutate_tree(json.loads(value), rng), ensure_ascii=rng.random() < 0.5)
    elif isinstance(value, dict) and op < 0.3 and value:
        del value[rng.choice(list(value))]
    elif isinstance(value, dict) and op < 0.5:
        value[rng.choice(FIELDS)] = interesting(rng)
    elif isinstance(value, list) and op < 0.4 and value:
        i = rng.randrange(len(value))
        value[i : i + 1] = rng.choice([[], [value[i], value[i]]])
    else:
        holder[key] = interesting(rng, value)
    return root[0]


# ---- seeds --------------------------------------------------------------------------------------------


def make_seeds() -> None:
    """A few small checkpoints: two trained for a step (optimizer, rng, corpus and metrics included: what
    a resume reads), a format-1 file, and one with bf16 weights. A few KB each."""
    import torch

    from charlm.config import ModelConfig, TrainConfig
    from charlm.models import build_model, count_params
    from charlm.storage import checkpoint
    from charlm.tokenizer import CharTokenizer
    from charlm.training.trainer import Trainer

    SEEDS.mkdir(exist_ok=True)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["CHARLM_CACHE"] = str(tmp / "cache")
        corpus = tmp / "corpus.txt"
        corpus.write_text("ab ba abba.\n" * 40, encoding="utf-8")
        tiny = dict(n_layers=1, d_model=4, n_heads=2, context=4)
        train = dict(steps=10, batch_size=2, warmup=1, eval_interval=1, eval_iters=1, sample_tokens=0, device="cpu")
        for name, kind, tokenizer, optimizer in (
            ("transformer-char", "transformer", "char", "muon"),
            ("lstm-bpe", "lstm", "bpe", "adamw"),
        ):
            model_cfg = ModelConfig(kind=kind, **tiny)
            train_cfg = TrainConfig(tokenizer=tokenizer, bpe_vocab=257, optimizer=optimizer, **train)
            Trainer(corpus, model_cfg, train_cfg, tmp / name).fit(until=1)  # then as an older charlm wrote it
            torch.save(
                {**checkpoint.read(tmp / name / checkpoint.LAST).to_payload(), "version": 2}, SEEDS / f"{name}.ckpt"
            )
        tok = CharTokenizer(list("ab\n"))
        for name, kind, dtype, version in (
            ("gru-v1", "gru", torch.float32, 1),
            ("transformer-bf16", "transformer", torch.bfloat16, 2),
        ):
            cfg = ModelConfig(kind=kind, vocab_size=3, positions="learned", **tiny)
            model = build_model(cfg).to(dtype)
            saved = checkpoint.Saved(
                run_name=name, model_config=cfg, train_config=TrainConfig(), tokenizer=tok.to_json(),
                model=model.state_dict(), step=1, train_seconds=0.5, best_val_loss=1.0, best_val_bpc=1.5,
                params=count_params(model), device="cpu",
            )  # fmt: skip
            payload = saved.to_payload()
            if version == 1:  # "no evaluation yet" was inf, the process count a "distributed" dict
                payload.update(version=1, best_val_loss=math.inf, best_val_bpc=math.inf, distributed={"world_size": 1})
                del payload["world_size"], payload["weights_sha256"]
            torch.save(payload, SEEDS / f"{name}.ckpt")
    for p in sorted(SEEDS.iterdir()):
        print(f"{p.relative_to(HERE.parent)}: {p.stat().st_size:,} bytes")


# ---- one libFuzzer process ------------------------------------------------------------------------


def instrument(prefixes: tuple[str, ...]) -> int:
    """Coverage for the Python code that reads a checkpoint: charlm, pickle, zipfile (not torch: too slow)."""
    import atheris

    n = 0
    with warnings.catch_warnings():  # reading __module__ of some of torch's objects warns
        warnings.simplefilter("ignore")
        functions = [o for o in gc.get_objects() if isinstance(o, types.FunctionType)]
    for obj in functions:
        if (obj.__module__ or "").split(".")[0] in prefixes:
            try:
                atheris.instrument_func(obj)
                n += 1
            except Exception:  # noqa: BLE001 - a function atheris cannot patch stays as it is
                pass
    return n


def child(args) -> None:
    import atheris
    import torch

    torch.set_num_threads(1)
    os.environ["CHARLM_CACHE"] = str(args.scratch / "cache")
    import charlm.cli  # noqa: F401 - everything a command imports, before instrumenting
    import charlm.commands.train  # noqa: F401
    import charlm.generate  # noqa: F401
    import charlm.models.rnn  # noqa: F401
    import charlm.models.transformer  # noqa: F401
    import charlm.training.trainer  # noqa: F401
    import charlm.views.runs  # noqa: F401

    global TARGET, FOCUS
    TARGET, FOCUS = args.target, ("optimizer", "rng") if args.target == "resume" else ()
    target = {"checkpoint": Target, "pt": Target, "resume": ResumeTarget, "cache": CacheTarget}[args.target](
        args.findings, args.scratch
    )
    prefixes = {"cache": ("charlm", "numpy"), "pt": ("charlm", "pickle", "zipfile")}.get(
        args.target, ("charlm", "json")
    )
    print(f"instrumented {instrument(prefixes)} functions", file=sys.stderr)
    corpus = args.out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    args.findings.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-max_total_time={args.seconds}",
        f"-timeout={args.timeout}",
        f"-rss_limit_mb={args.rss_mb}",
        f"-max_len={MAX_LEN}",
        f"-artifact_prefix={args.findings}/",
        "-print_final_stats=1",
        *([f"-seed={args.seed}"] if args.seed is not None else []),
    ]
    seeds = {"cache": args.out / "seeds", "pt": SEEDS}.get(args.target) or safetensors_seeds(args.out / "seeds")
    if args.target == "cache":  # the real entry, with and without its record
        seeds.mkdir(parents=True, exist_ok=True)
        (seeds / "entry.npy").write_bytes(target.path.read_bytes())
        (seeds / "entry-and-record").write_bytes(target.path.read_bytes() + SEP + target.record)
    atheris.Setup([sys.argv[0], *flags, str(corpus), str(seeds)], target, custom_mutator=mutate)
    atheris.Fuzz()


# ---- the whole run: libFuzzer again after each hang or crash, until the time is spent ------------------


PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)")
STAT = re.compile(r"^stat::(number_of_executed_units|peak_rss_mb|slowest_unit_time_sec):\s+(\d+)")


def supervise(args) -> int:
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # each input is written to a file: in memory
    args.scratch = Path(tempfile.mkdtemp(prefix="charlm-fuzz-", dir=shm))
    try:
        return _supervise(args)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)


def _supervise(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "log.txt").open("a", encoding="utf-8")
    start, executions, runs, last, peak_rss, slowest = time.monotonic(), 0, 0, None, 0, 0
    load = os.getloadavg()[0]
    print(f"fuzzing {args.target} for {args.seconds}s; the log: {log.name}", flush=True)
    while (left := args.seconds - (time.monotonic() - start)) > 10:
        runs += 1
        cmd = [sys.executable, __file__, "--child", f"--seconds={int(left)}", f"--timeout={args.timeout}",
               f"--rss-mb={args.rss_mb}", f"--out={args.out}", f"--findings={args.findings}",
               f"--scratch={args.scratch}", f"--target={args.target}"]  # fmt: skip
        if args.seed is not None:
            cmd.append(f"--seed={args.seed + runs}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        run_last, stats = None, {}
        for line in proc.stdout:
            log.write(line)
            if m := PROGRESS.match(line):
                run_last = tuple(map(int, m.groups()))
            elif m := STAT.match(line):  # at the end of a run that was not cut short
                stats[m[1]] = int(m[2])
            elif line.startswith(("FINDING", "==", "ALARM", "SUMMARY")) or "out-of-memory" in line:
                print(line.rstrip()[:200], flush=True)
        proc.wait()
        if run_last:
            executions += stats.get("number_of_executed_units", run_last[0])
            last = run_last
            peak_rss = max(peak_rss, stats.get("peak_rss_mb", 0))
            slowest = max(slowest, stats.get("slowest_unit_time_sec", 0))
        elif proc.returncode != 0:
            print(f"libFuzzer did not start (exit {proc.returncode}): see {log.name}", file=sys.stderr)
            return 2
        if proc.returncode != 0:
            print(
                f"libFuzzer stopped (exit {proc.returncode}) after {time.monotonic() - start:.0f}s: started again",
                flush=True,
            )
    elapsed = time.monotonic() - start
    cpu = os.times()
    findings = (
        sorted(p.name for p in args.findings.glob("*") if not p.name.endswith(".txt")) if args.findings.exists() else []
    )
    cov, ft, corp = last[1:] if last else (0, 0, 0)
    print(
        f"\n{elapsed:.0f}s, {runs} libFuzzer run(s): {executions:,} inputs ({executions / max(elapsed, 1):.0f}/s), "
        f"coverage {cov} edges, {ft} features, corpus {corp} inputs; peak RSS {peak_rss} MB, "
        f"slowest input {slowest}s; "
        f"CPU {cpu.children_user + cpu.children_system:.0f}s; "
        f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    print(f"findings in {args.findings}: " + (", ".join(findings) if findings else "none"))
    return 1 if findings else 0


def replay(args) -> int:
    """Each file once through the target (no libFuzzer, no instrumentation): whether old findings still fail."""
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="charlm-fuzz-") as tmp:
        os.environ["CHARLM_CACHE"] = str(Path(tmp) / "cache")
        global TARGET, FOCUS
        TARGET = args.target
        kind = {"checkpoint": Target, "pt": Target, "resume": ResumeTarget, "cache": CacheTarget}[args.target]
        target = kind(Path(tmp) / "findings", Path(tmp))
        for path in args.replay:
            target(path.read_bytes())
        failed = sorted(p.stem for p in target.findings.glob("*.txt")) if target.findings.exists() else []
    print(f"{len(args.replay)} inputs replayed: " + (f"{len(failed)} kinds of finding" if failed else "no finding"))
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seconds", type=int, default=60, help="how long to fuzz [default: 60]")
    p.add_argument(
        "--timeout", type=int, default=10, help="seconds one input may take before it is a hang [default: 10]"
    )
    p.add_argument("--rss-mb", type=int, default=2048, help="memory before it is a finding [default: 2048]")
    p.add_argument("--seed", type=int, help="libFuzzer's random seed [default: a new one each run]")
    p.add_argument(
        "--target",
        choices=("checkpoint", "pt", "resume", "cache"),
        default="checkpoint",
        help="what to fuzz (see above)",
    )
    p.add_argument("--out", type=Path, default=OUT, help=f"corpus and log [default: {OUT.relative_to(HERE.parent)}]")
    p.add_argument("--findings", type=Path, help="[default: OUT/findings]")
    p.add_argument(
        "--make-seeds", action="store_true", help=f"write the seed checkpoints to {SEEDS.relative_to(HERE.parent)}"
    )
    p.add_argument("--replay", type=Path, nargs="+", metavar="FILE", help="run these inputs once, and stop")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.target != "checkpoint" and args.out == OUT:  # each target grows its own corpus
        args.out = OUT / args.target
    args.findings = (args.findings or args.out / "findings").resolve()
    args.out = args.out.resolve()
    if args.make_seeds:
        make_seeds()
        return 0
    if args.replay:
        return replay(args)
    if args.child:
        child(args)
        return 0
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
