"""`charlm info`, `charlm runs` and `charlm plot` as functions: what run directories and checkpoints hold,
read without torch (checkpoint.read_header) and without building a model."""

from __future__ import annotations

from pathlib import Path

from charlm.errors import CheckpointError, ConfigError
from charlm.storage import checkpoint, runs


def info(path: str | Path) -> dict:
    """What a checkpoint (a file, or a run directory's best.safetensors, else last.safetensors) holds, as plain values."""
    p = checkpoint.resolve(path)
    return {"path": str(p), **checkpoint.read_header(p).summary()}


def missing(what: str) -> tuple[str, list[Path]]:
    """What to say to a command given no run (`charlm chat` alone): the error, and up to five runs to choose
    from, newest first."""
    found = runs.find_runs() if runs.RUNS.is_dir() else []
    if not found:
        return f"missing {what}; there are no runs in {runs.RUNS}/ yet: train one with charlm train FILE", []
    return (
        f"missing {what}, such as one of the runs in {runs.RUNS}/ (newest first; charlm runs shows them all):",
        found[:5],
    )


def list_runs(directory: Path | None = None) -> tuple[Path, list[dict]]:
    """(the folder, its runs newest first): each run's summary, or its error (an unreadable last.safetensors)."""
    root = directory or runs.RUNS
    if not root.is_dir():
        if directory is None:
            raise ConfigError(
                f"no {runs.RUNS}/ folder here yet: train a model with charlm train FILE, or give a DIRECTORY"
            )
        raise ConfigError(f"no directory {directory}: give a folder that holds run directories")
    return root, [runs.describe(run, root) for run in runs.find_runs(root)]


def curves(paths: list[str], missing_ok: bool = False, notes: list[str] | None = None) -> dict[str, list[dict]]:
    """Each run's metrics.jsonl rows, by a label: the directory's name, or the path given where names repeat.
    A run with no evaluations is an error, or left out (missing_ok). What could not be read (a torn or binary
    line) is skipped, and said in `notes`."""
    dirs = [Path(p) if not Path(p).is_file() else Path(p).parent for p in paths]
    names = [d.resolve().name for d in dirs]
    out = {}
    for given, d, name in zip(paths, dirs, names):
        if not d.is_dir():
            raise ConfigError(
                f"no run directory {given}: give a run directory (charlm runs lists them) or a checkpoint in one"
            )
        try:
            metrics = runs.read_metrics(d)
        except ConfigError:
            if missing_ok:
                continue
            raise
        points = metrics.rows
        if metrics.note and notes is not None:
            notes.append(metrics.note)
        if not points and missing_ok:
            continue
        if not points:
            raise ConfigError(f"{given} has no evaluations yet: plot it after its first one")
        out[name if names.count(name) == 1 else str(given)] = points
    return out


def model_path(name: str) -> str:
    """A checkpoint as the user named it: a path that exists, or a run in checkpoints/ as `charlm runs` prints
    it ("tt-int4", "lab/copy-transformer-s0"), or by its folder's own name ("copy-transformer-s0"), or the only
    run whose name starts with it. A path that does not exist and names no run is returned as it is, for the
    loader to say so; several runs it could be are a one-line error."""
    if Path(name).expanduser().exists() or not name or not runs.RUNS.is_dir():
        return name
    found = {runs.run_name(r): r for r in runs.find_runs(runs.RUNS)}
    picked = (
        [n for n in found if n == name]
        or [n for n in found if found[n].name == name]
        or [n for n in found if n.startswith(name) or found[n].name.startswith(name)]
    )
    if len(picked) > 1:
        names = ", ".join(sorted(picked))
        raise CheckpointError(f"'{name}' could be {len(picked)} runs in {runs.RUNS}/: {names}; give one whole name")
    if picked:
        return str(found[picked[0]])
    if "/" in name:  # a path after all: the loader names what is missing
        return name
    raise CheckpointError(f"no such checkpoint or run: {name} (charlm runs lists the runs in {runs.RUNS}/)")
