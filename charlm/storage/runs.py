"""Run directories: where a new run goes, which run `--resume` continues, the lock that keeps a second
training out of a directory in use, THE rule for what a resumed run may change, and what runs there are
(`charlm runs`, `charlm plot`). The rule is read from the config fields (settings.flag(resumable=...)), so a
new setting states whether it may change on resume where it is defined."""

from __future__ import annotations

import fcntl
import json
import math
import os
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path

from charlm import files
from charlm.config import ModelConfig, TrainConfig
from charlm.errors import CheckpointError, ConfigError
from charlm.settings import flag_name

RUNS = Path("checkpoints")


def _base(corpus: str, kind: str, tokenizer: str) -> str:
    return f"{Path(corpus).stem or 'corpus'}-{kind}-{tokenizer}"


def default_out(corpus: str, kind: str, tokenizer: str) -> Path:
    """checkpoints/<corpus>-<model>-<tokenizer>, numbered when that name is taken."""
    from charlm.storage.checkpoint import last_of  # (lazy: what the CLI imports to start stays small)

    base = RUNS / _base(corpus, kind, tokenizer)
    out, n = base, 2
    while last_of(out):
        out, n = base.with_name(f"{base.name}-{n}"), n + 1
    return out


def latest_run(corpus: str, kind: str, tokenizer: str) -> Path:
    from charlm.storage.checkpoint import LAST, last_of

    base = _base(corpus, kind, tokenizer)
    runs = [p for p in RUNS.glob(f"{base}*") if last_of(p)]
    if not runs:
        raise ConfigError(f"--resume found no run {RUNS}/{base}*/{LAST}: name the run with --out DIR")
    return max(runs, key=lambda p: last_of(p).lstat().st_mtime)


def check_writable(out: Path) -> None:
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"cannot write to {out}: {probe} is a file, not a directory")
    try:  # really try: os.access says yes to root, and knows nothing of read-only mounts or ACLs
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(
            f"cannot write to {out}: {probe} is not writable ({files.reason(e)}); choose another --out"
        ) from None


LOCK = ".lock"


def _in_use(out: Path, what: str = "charlm train") -> str:
    try:
        holder = files.read_bounded(out / LOCK, 64, "lock").decode("utf-8", errors="replace").strip()
    except ValueError:
        holder = ""
    by = f"another {what} (pid {holder})" if holder.isdigit() else f"another {what}"
    return f"{out} is in use by {by}: wait for it to finish, or choose another --out"


def check_free(out: Path) -> None:
    """Refuse a run directory that another process holds (see RunLock), without taking it."""
    try:
        fd = files.open_regular(out / LOCK, os.O_RDONLY)
    except OSError:  # no file (a holder keeps it until it lets go), no directory, or no lock of ours
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(_in_use(out)) from None
    finally:
        os.close(fd)


class RunLock:
    """Holds a run directory for this process: a second training into it is refused while this one runs.
    The lock is flock(2) on out/.lock, so the kernel drops it when the process ends, however it ends: a crash
    never leaves a run locked. Directories it had to create are removed on release if nothing was written
    into them (a refused run leaves nothing behind)."""

    def __init__(self, out: Path, what: str = "charlm train"):
        self.out, self.path = out, out / LOCK
        self.created = next(p for p in [out, *out.parents] if p.parent.exists()) if not out.exists() else None
        out.mkdir(parents=True, exist_ok=True)
        while True:
            try:  # never through a link (one planted there would have us truncate its target), never a FIFO
                f = open(files.open_regular(self.path, os.O_RDWR | os.O_CREAT), "r+b")
            except OSError as e:
                self._remove_created()
                raise ConfigError(
                    f"{self.path} is not a lock file charlm can use ({files.reason(e)}): remove it, or choose another --out"
                ) from None
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                self._remove_created()
                raise ConfigError(_in_use(out, what)) from None
            # the holder before us may have removed the file between our open and our flock: then we hold
            # the lock of a file nobody else opens, and must lock the new one
            if self.path.exists() and os.lstat(self.path).st_ino == os.fstat(f.fileno()).st_ino:
                break
            f.close()
        self.file = f
        try:
            f.truncate(0)
            f.write(str(os.getpid()).encode())  # for the message a second process prints
            f.flush()
        except OSError:  # a full disk: the lock holds all the same, the message just names no pid
            pass

    def release(self) -> None:
        if self.file.closed:
            return
        try:
            self.path.unlink(missing_ok=True)  # before letting go, so that the next holder's file is its own
        except OSError:  # a directory made read-only meanwhile: the error that matters is the run's, not this
            pass
        self.file.close()
        self._remove_created()

    def _remove_created(self) -> None:
        if self.created is None:
            return
        for d in [self.out, *self.out.parents]:
            try:
                d.rmdir()
            except OSError:  # not empty: the run wrote into it
                return
            if d == self.created:
                return


def check_world_size(out: Path, trained_on: int, world_size: int) -> None:
    if trained_on != world_size:  # each rank's batches are part of the run
        raise ConfigError(
            f"--resume: {out} was trained with {trained_on} process(es), not {world_size}; resume it "
            f"with --nproc {trained_on} (or torchrun --nproc-per-node {trained_on})"
        )


def given_settings(typed: set[str], preset: bool) -> set[str]:
    """The settings a user typed (the names of their flags' fields) as resume_configs takes them: a model
    field as "model.<field>"; a --preset stands for every size it holds ("preset:<field>")."""
    model_fields = {f.name for f in fields(ModelConfig) if flag_name(f)}  # (--vocab-size is TrainConfig's)
    given = {"model." + n if n in model_fields else n for n in typed}
    if preset:
        given |= {
            "preset:" + f.name
            for cls in (ModelConfig, TrainConfig)
            for f in fields(cls)
            if f.metadata.get("from_preset")
        }
    return given


def _as_typed(f, value, flag: bool = True) -> str:
    """A setting as a user types it: --layers 2 (or just 2 with flag=False), and a switch as --smear or --no-smear."""
    name = flag_name(f) or f.name
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {value}" if flag else str(value)


def resume_configs(
    out: Path, saved, model_cfg: ModelConfig, train_cfg: TrainConfig, world_size: int = 1, given: set[str] | None = None
) -> tuple[ModelConfig, TrainConfig]:
    """The configs a resumed run continues with: the saved ones, with the settings the user gave applied
    where the field says it may change (resumable), and a one-line error where it may not.

    saved: the checkpoint.Saved of its last checkpoint. given: the field names the user set (a --preset counts
    as setting every size it holds, "preset:<field>"; model fields are "model.<field>"); None means every
    field of the configs passed in (a caller that builds configs in code, as the Trainer's own check does)."""
    check_world_size(out, saved.world_size, world_size)
    old_model, old_train = saved.model_config, saved.train_config
    typed = given  # None: configs built in code, where every field is set whether it applies or not
    if given is None:
        given = {f.name for f in fields(TrainConfig)} | {"model." + f.name for f in fields(ModelConfig)}
    if "model.kind" in given and model_cfg.kind != old_model.kind:
        raise ConfigError(
            f"--resume: this run is a {old_model.kind}, not a {model_cfg.kind}; use another --out for a new run"
        )
    for cls, prefix, run_is in ((ModelConfig, "model.", old_model.kind), (TrainConfig, "", old_train.tokenizer)):
        for f in fields(cls):  # typed flags only: a --preset sets sizes such as --heads for every model kind
            applies_to = f.metadata.get("applies_to")
            if applies_to and applies_to != run_is and typed and prefix + f.name in typed:
                raise ConfigError(
                    f"--resume: --{flag_name(f)} applies to {applies_to} runs only, and this run is {run_is}; drop it"
                )
    for f in fields(ModelConfig):
        if f.name in ("kind", "vocab_size"):  # the tokenizer sets vocab_size
            continue
        new, old = getattr(model_cfg, f.name), getattr(old_model, f.name)
        if ("model." + f.name in given or "preset:" + f.name in given) and new != old:
            source = " (from --preset)" if "model." + f.name not in given else ""
            raise ConfigError(
                f"--resume: this run was trained with {_as_typed(f, old)}, not {_as_typed(f, new, flag=False)}{source}; "
                "drop the flag, or start a new run with another --out"
            )
    if "teacher" in given and train_cfg.teacher is not None and old_train.teacher_sha256 is not None:
        # a teacher named again is the recorded one if it is the same file, however it is named from here
        train_cfg = replace(train_cfg, teacher=teacher_file(train_cfg.teacher))
    changes = {}
    for f in fields(TrainConfig):
        if (f.name not in given and "preset:" + f.name not in given) or f.metadata.get("recorded"):
            continue  # (a recorded field is the run's own: distill records its teacher's hash)
        new, old = getattr(train_cfg, f.name), getattr(old_train, f.name)
        if f.metadata.get("resumable"):
            changes[f.name] = new
        elif new != old:
            raise ConfigError(
                f"--resume: this run was trained with {_as_typed(f, old)}, not {_as_typed(f, new, flag=False)}; only "
                f"{', '.join('--' + flag_name(r) for r in fields(TrainConfig) if r.metadata.get('resumable'))} may change"
            )
    if given & {"steps", "max_time"}:  # a new budget replaces the old one: --steps alone means no time limit
        changes["steps"], changes["max_time"] = train_cfg.steps, train_cfg.max_time
    new_train = replace(old_train, **changes)
    if saved.step >= new_train.steps:
        raise ConfigError(f"--resume: {out} is already at step {saved.step}; give a larger --steps to train on")
    if new_train.max_time and saved.train_seconds >= new_train.max_time:
        raise ConfigError(
            f"--resume: {out} has already trained for {saved.train_seconds:.0f}s; "
            "give a larger --max-time (the total) or --steps to train on"
        )
    return old_model, new_train


def teacher_file(name: str) -> str:
    """The checkpoint file a --teacher names, as a distilled run records it: absolute and free of links."""
    from charlm.storage import checkpoint  # (as in describe: only this needs it)

    return str(checkpoint.resolve(name).resolve())


# ---- listing (`charlm runs`) ---------------------------------------------------------------------


DEPTH = 6  # folders below the root searched for runs: lab runs sit at checkpoints/lab/<run>, compress --to anywhere


def checkpoints() -> tuple[str, ...]:
    """The files that make a folder a run: training writes last and best, compress only best (an older
    charlm's .pt names after)."""
    from charlm.storage.checkpoint import BEST, LAST, OLD_BEST, OLD_LAST  # (lazy, as in describe)

    return (LAST, BEST, OLD_LAST, OLD_BEST)


def checkpoint_of(run: Path) -> Path:
    """The file a run's listing reads: its last checkpoint (where training left off), else its best (a
    compressed run)."""
    names = checkpoints()
    return next((run / n for n in names if (run / n).is_file()), run / names[0])


def find_runs(root: Path = RUNS) -> list[Path]:
    """Every run directory under root (root itself when it is one): trained, compressed or pruned (compress
    --to), lab runs (checkpoints/lab/...), at any depth up to DEPTH; newest checkpoint first. A link to a run
    is listed, but no link is searched below (a link to a parent would loop)."""
    found = []
    for folder, subfolders, _ in os.walk(root, onerror=lambda e: None):
        here = Path(folder)
        if _holds_a_run(here):
            found.append(here)
        # a link to a run is listed (os.walk lists it, and does not go in): never searched below
        found += [here / d for d in subfolders if (here / d).is_symlink() and _holds_a_run(here / d)]
        if len(here.relative_to(root).parts) >= DEPTH:
            subfolders.clear()
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
    return sorted(found, key=lambda p: checkpoint_of(p).stat().st_mtime, reverse=True)


def _holds_a_run(folder: Path) -> bool:
    return any((folder / n).is_file() for n in checkpoints())


def run_name(run: Path, root: Path = RUNS) -> str:
    """A run's name as `charlm runs` prints it and every command takes it: its path below root
    ("lab/copy-transformer-s0"), or the folder's own name when it is root itself or not under root."""
    try:
        rel = run.relative_to(root)
    except ValueError:
        return run.name
    return rel.as_posix() if rel.parts else run.name


def describe(run: Path, root: Path | None = None) -> dict:
    """What `charlm runs` shows of one run (found in root), read from its last or best checkpoint (plain values: a
    table row or JSON)."""
    # runs.py sits below checkpoint for training/resume.py's sake; only listing needs it
    from charlm.storage import checkpoint

    path = checkpoint_of(run)
    name = run_name(run, root) if root is not None else run.name
    row = {"run": name, "path": str(run), "modified": path.stat().st_mtime}
    try:
        saved = checkpoint.read_header(path)
    except CheckpointError as e:
        return {**row, "error": str(e)}
    return {**saved.summary(), **row}  # the directory's name, whatever the file calls its run


@dataclass
class Metrics:
    """A run's evaluations, read from its metrics.jsonl, and the lines that were not one."""

    path: Path
    rows: list[dict]  # in order (a resumed run continues the file)
    skipped: int = 0  # lines cut short by a crash, damaged on disk or edited by hand
    left_out: int = 0  # bytes at the start of a file larger than METRICS_READ, not read

    @property
    def note(self) -> str | None:
        """The line to show when some lines were skipped, or the start of a huge file left out."""
        notes = []
        if self.left_out:
            notes.append(
                f"read only the last {METRICS_READ >> 20} MB of {self.path} ({self.left_out >> 20} MB left out)"
            )
        if self.skipped:
            notes.append(f"skipped {self.skipped} unreadable line{'s' * (self.skipped > 1)} of {self.path}")
        return "; ".join(notes) or None


METRICS_READ = 16 << 20  # bytes of metrics.jsonl read at most: ~120,000 evaluations (a run makes ~20)

# what the trainer writes on each line: a step, and the numbers plot and info draw
METRICS = ("step", "train_loss", "val_loss", "val_bpc", "elapsed")


def read_metrics(run: Path) -> Metrics:
    """The evaluations the trainer appended to run/metrics.jsonl. A line that is not one (not UTF-8, not JSON,
    not an object with a whole-number step and finite, non-negative numbers) is skipped and counted."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{run} has no metrics.jsonl: it is not a run directory, or it was never evaluated")
    try:
        with files.open_read(path, "metrics") as f:  # a regular file, or a link to one; never /dev/zero
            size = os.fstat(f.fileno()).st_size
            if size > METRICS_READ:  # the latest evaluations only: a file this large is no run's own
                f.seek(size - METRICS_READ)
                f.readline()  # the rest of a line cut by the seek
            lines = f.read(METRICS_READ).splitlines()
    except files.ReadError as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {files.reason(e)}") from None
    metrics = Metrics(path, [], left_out=max(0, size - METRICS_READ))
    for line in lines:
        if not line.strip():
            continue
        row = _evaluation(line)
        if row is None:
            metrics.skipped += 1
        else:
            metrics.rows.append(row)
    return metrics


def _evaluation(line: bytes) -> dict | None:
    try:
        row = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if not isinstance(row, dict) or not all(k in row for k in METRICS):
        return None
    numbers = [row[k] for k in METRICS]
    if not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in numbers
    ):
        return None
    return row if isinstance(row["step"], int) else None


def usual_speed(key: str, tokens_per_s: float | None, path: Path) -> float | None:
    """The fastest this machine has trained `key` (a model, its batch, device and threads) before, from path
    (JSON: key -> tokens/s), which then records this run's speed. None the first time. A damaged or
    unwritable file starts afresh: a speed record is never worth an error."""
    try:
        best = json.loads(files.read_bounded(path, 16 << 20, "speed record", links=False))
    except (ValueError, RecursionError):  # (read_bounded's errors are ValueErrors)
        best = {}
    best = best if isinstance(best, dict) else {}
    before = best.get(key)
    before = float(before) if isinstance(before, (int, float)) and math.isfinite(before) and before > 0 else None
    if tokens_per_s is not None and math.isfinite(tokens_per_s) and tokens_per_s > 0:
        best[key] = max(tokens_per_s, before or 0.0)
        try:  # (atomic_write: never through a link planted at a guessable temp name)
            files.atomic_write(path, lambda f: f.write(json.dumps(best).encode("utf-8")), parents=True)
        except files.WriteError:
            pass
    return before
