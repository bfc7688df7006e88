"""charlm compress: int8/int4 weights within half a step of the originals (checked in numpy, apart from the
code), read back by the same safe loader; a compressed run opens in every command; dropped heads cost what lab
ablate says; dropped units are exactly units held at zero; crafted compressed files refused with one line."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli, one_line_error, stored_payload

from charlm.commands.compress import compress
from charlm.compress import drop_units, log_probs, scored_text, unit_importance
from charlm.data import bits_per_char
from charlm.models import build_model
from charlm.models.inspect import knockouts, nats
from charlm.models.rnn import gate_rows
from charlm.options import CompressOptions
from charlm.storage import checkpoint, quantized
from charlm.storage.checkpoint import BEST


def numpy_dequantize(e: dict, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights, the step of each weight) from the format as storage/quantized.py's docstring describes it."""
    values, scales = np.asarray(e["values"]), np.asarray(e["scales"], dtype=np.float64)
    if e["bits"] == 8:
        step = np.repeat(scales[:, None], cols, axis=1)
        return values.astype(np.float64) * step, step
    codes = np.empty((values.shape[0], values.shape[1] * 2), dtype=np.int64)
    codes[:, 0::2], codes[:, 1::2] = values & 0x0F, values >> 4
    assert (codes[:, cols:] == 8).all()  # the last group's padding holds zeros
    step = np.repeat(scales, 32, axis=1)[:, :cols]
    return (codes[:, :cols] - 8) * step, step


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", [(5, 37), (3, 64), (1, 1), (4, 100)])
def test_quantize_dequantize_error_is_at_most_half_a_step(bits, shape):
    gen = np.random.default_rng(sum(shape) + bits)
    w = gen.normal(0, 0.05, shape).astype(np.float32)
    w[0, 0] = 3.0  # an outlier: its row (int8) or group (int4) gets a coarse step, the others keep theirs
    if shape[0] > 2:
        w[2] = 0.0  # a row of zeros: scale 0, no division by it
    e = quantized.quantize(w, bits)
    got, step = numpy_dequantize(e, shape[1])
    assert (np.abs(w - got) <= step / 2 * (1 + 1e-6) + 1e-12).all()
    if bits == 4:  # a group away from the outlier keeps a fine step: per group, not per row
        assert shape[1] <= 32 or step[0, -1] < step[0, 0]


def test_the_loader_dequantizes_what_numpy_does(view_runs, tmp_path):
    for bits in (8, 4):
        compress(str(view_runs["tf"]), CompressOptions(to=str(tmp_path / f"q{bits}"), bits=bits, tokens=256))
        raw = stored_payload(tmp_path / f"q{bits}" / BEST)
        loaded = checkpoint.read(tmp_path / f"q{bits}")
        assert raw["quantized"] and set(raw["quantized"]) | set(raw["model"]) == set(loaded.model)
        for name, e in raw["quantized"].items():
            want, _ = numpy_dequantize(
                {k: v.numpy() if hasattr(v, "numpy") else v for k, v in e.items()}, loaded.model[name].shape[1]
            )
            np.testing.assert_allclose(loaded.model[name].numpy(), want, rtol=1e-6, atol=1e-7)
        assert all(t.dtype == torch.float32 for t in raw["model"].values())  # norms stay float32


@pytest.fixture(scope="module")
def compressed(view_runs, tmp_path_factory):
    """A 2-layer transformer at int4 with one head of each layer dropped; an LSTM at int8 with 8 units dropped."""
    root = tmp_path_factory.mktemp("compressed")
    r = cli(
        "compress",
        view_runs["tf"],
        "--to",
        root / "tf",
        "--bits",
        "4",
        "--drop-heads",
        "1",
        "--tokens",
        "512",
        "--json",
    )
    assert r.exit_code == 0, r.output
    r2 = cli(
        "compress", view_runs["lstm"], "--to", root / "lstm", "--bits", "8", "--drop-units", "8", "--tokens", "512"
    )
    assert r2.exit_code == 0, r2.output
    return {"tf": root / "tf", "lstm": root / "lstm", "tf_json": json.loads(r.stdout)}


def test_compress_prints_before_and_after_and_the_config_records_the_smaller_sizes(compressed, view_runs):
    done = compressed["tf_json"]
    assert done["original"]["name"] == "original" and done["compressed"]["name"] == "int4 -1 head/layer"
    assert done["compressed"]["params"] < done["original"]["params"]
    assert 4 < done["compressed"]["bits_per_weight"] < 8
    assert done["compressed"]["file_bytes"] < done["original"]["file_bytes"]
    assert 0 <= done["compressed"]["top1"] <= 1 and done["compressed"]["kl"] >= 0
    tf = checkpoint.read_header(compressed["tf"])
    assert (tf.model_config.n_heads, tf.model_config.head_dim, tf.model_config.d_model) == (1, 16, 32)
    assert checkpoint.compression_steps(tf.compressed)[-1]["bits"] == 4 and tf.optimizer is None
    lstm = checkpoint.read_header(compressed["lstm"])
    assert lstm.model_config.hidden == 24 and lstm.params < checkpoint.read_header(view_runs["lstm"]).params


def test_a_compressed_run_opens_in_every_command(compressed, view_runs, tmp_path):
    tf, lstm = compressed["tf"], compressed["lstm"]
    r = cli("sample", tf, "-p", "ROMEO:", "-n", "40", "--seed", "1")
    assert r.exit_code == 0 and r.stdout.strip(), r.output
    assert cli("sample", lstm, "-p", "ROMEO:", "-n", "40", "--seed", "1").exit_code == 0
    r = cli("eval", tf, view_runs["tf"].parent / "corpus.txt", "--json")
    assert r.exit_code == 0 and 0 < json.loads(r.stdout)["bits_per_char"] < 10, r.output
    r = cli("compare", tf, view_runs["tf"], "-p", "ROMEO:", "-n", "20", "--seed", "1")
    assert r.exit_code == 0, r.output
    r = cli("attn", tf, "-p", "ROMEO:\nBut soft", "--stats")
    assert r.exit_code == 0 and "head" in r.stdout, r.output
    r = cli("attn", tf, "--layer", "1", "--head", "0", "-p", "ROMEO:\nBut soft")
    assert r.exit_code == 0, r.output
    r = cli("attn", tf, "-p", "ROMEO:\nBut soft", "--overview")
    assert r.exit_code == 0, r.output
    r = cli("gates", lstm, "-p", "ROMEO:\nBut soft", "--units", "3", "--width", "70")
    assert r.exit_code == 0, r.output
    r = cli("info", tf)
    assert r.exit_code == 0 and "int4" in r.stdout and "1 head of each layer dropped" in r.stdout, r.output
    info = json.loads(cli("info", lstm, "--json").stdout)
    assert info["compressed"] == "int8 weights; 8 units of each layer dropped"
    chat = subprocess.run(
        [sys.executable, "-m", "charlm", "chat", str(tf), "--max-tokens", "10", "--seed", "1"],
        input="ROMEO:\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr


def test_sampling_from_a_compressed_run_is_sampling_from_its_dequantized_weights(compressed, tmp_path):
    """The loader's float model (through `charlm sample`) against a plain float32 run written with the same
    weights, dequantized in numpy."""
    raw = stored_payload(compressed["tf"] / BEST)
    saved = checkpoint.read_header(compressed["tf"])
    model = dict(raw["model"])
    shapes = {name: t.shape for name, t in build_model(saved.model_config).state_dict().items()}
    for name, e in raw["quantized"].items():
        w, _ = numpy_dequantize({k: v.numpy() if hasattr(v, "numpy") else v for k, v in e.items()}, shapes[name][1])
        model[name] = torch.from_numpy(w.astype(np.float32))
    plain = replace(checkpoint.read(compressed["tf"]), model=model, quantized=None)
    checkpoint.save(plain, tmp_path / "plain" / BEST)
    a = cli("sample", compressed["tf"], "-p", "ROMEO:", "-n", "60", "-t", "0")
    b = cli("sample", tmp_path / "plain", "-p", "ROMEO:", "-n", "60", "-t", "0")
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout and len(a.stdout) > 20


def test_dropping_the_head_ablate_calls_least_useful_costs_what_ablate_said(cmp_runs, tmp_path):
    """A 1-layer model: removing a head by slicing is knocking it out, so bits/char change by what lab ablate's
    head_knockouts measured on the same text (the compressed run is read back through the loader)."""
    ck = checkpoint.load(cmp_runs["tf"])
    text = scored_text(ck, None, 2048)
    with torch.no_grad():
        base = nats(ck.model(text.rows[:, :-1])[0], text.rows)
    knocked = {(p.layer, p.which[0]): lost for p, lost in knockouts(ck.model, text.rows[: max(1, len(text.rows) // 8)])}
    useless = min(knocked, key=knocked.get)
    done = compress(str(cmp_runs["tf"]), CompressOptions(to=str(tmp_path / "pruned"), drop_heads=1, tokens=2048))
    assert done.dropped == [useless]
    ((_, said),) = [k for k in knockouts(ck.model, text.rows) if (k[0].layer, *k[0].which) == useless]
    want = bits_per_char(said, text.chars_per_token) - bits_per_char(base, text.chars_per_token)
    got = done.result.bpc - done.original.bpc
    assert abs(got - want) < 1e-4, (got, want)


def test_dropped_units_are_units_whose_gates_are_zeroed(view_runs):
    """Slicing units out of an LSTM/GRU gives the logits of the full model with those units' gate rows zeroed
    (which holds them at 0), for both families and a unit of each layer."""
    for kind in ("lstm", "gru"):
        ck = checkpoint.load(view_runs[kind])
        text = scored_text(ck, None, 512)
        importance = unit_importance(ck.model, text.rows)
        assert importance.shape == (2, 32) and np.isfinite(importance).all() and importance.max() > 0
        cfg, state, dropped = drop_units(ck.model_config, ck.model.state_dict(), importance, 3)
        small = build_model(cfg)
        small.load_state_dict(state)
        full = build_model(ck.model_config)
        zeroed = ck.model.state_dict()
        for layer in range(cfg.n_layers):
            rows = gate_rows(ck.model_config, [u for l, u in dropped if l == layer])
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                zeroed[f"rnn.{name}_l{layer}"] = zeroed[f"rnn.{name}_l{layer}"].clone().index_fill_(0, rows, 0.0)
        full.load_state_dict(zeroed)
        torch.testing.assert_close(
            log_probs(small.eval(), text.rows), log_probs(full.eval(), text.rows), atol=1e-5, rtol=1e-5
        )
        assert cfg.hidden == 29 and len(dropped) == 6


def test_report_measures_every_method_and_names_the_best_trade(view_runs):
    r = cli("compress", view_runs["tf"], "--report", "--tokens", "256", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    names = [row["name"] for row in rep["rows"]]
    assert names[:4] == ["float32", "bf16", "int8", "int4"] and "float32 -1 head/layer" in names
    by = {row["name"]: row for row in rep["rows"]}
    assert by["float32"]["kl"] == 0 and by["float32"]["top1"] == 1
    assert by["int4"]["file_bytes"] < by["int8"]["file_bytes"] < by["bf16"]["file_bytes"] < by["float32"]["file_bytes"]
    assert by["bf16"]["bits_per_weight"] == 16 and by["float32 -1 head/layer"]["params"] < by["float32"]["params"]
    assert rep["reading"][0].startswith("smallest within +0.01 bits/char: ")
    assert "float32 -1 head/layer (random)" in names  # the baseline measured importance must beat
    assert any(line.startswith("float32 -1 head/layer: ") and "at random" in line for line in rep["reading"])
    r = cli("compress", view_runs["lstm"], "--report", "--tokens", "256")
    assert r.exit_code == 0 and "-4 units/layer" in r.stdout and "smallest within" in r.stdout, r.output


# ---- what is refused -------------------------------------------------------------------------------------


def test_bad_compress_flags_are_one_line_errors(view_runs, compressed, tmp_path):
    one_line_error(cli("compress", view_runs["tf"], "--to", tmp_path / "x", "--bits", "5"), "--bits must be one of")
    one_line_error(cli("compress", view_runs["tf"], "--report", "--to", tmp_path / "y"), "--report measures")
    one_line_error(cli("compress", view_runs["tf"], "--to", tmp_path / "z", "--drop-heads", "2"), "below the 2 heads")
    one_line_error(
        cli("compress", view_runs["lstm"], "--to", tmp_path / "w", "--drop-heads", "1"),
        "is a lstm model, which has no heads; use --drop-units",
    )
    one_line_error(
        cli("compress", view_runs["tf"], "--to", tmp_path / "v", "--drop-units", "1"),
        "is a transformer model, which has no units; use --drop-heads",
    )
    one_line_error(cli("compress", view_runs["tf"], "--to", compressed["tf"]), "already holds a run")
    one_line_error(
        cli("compress", view_runs["tf"], "--to", tmp_path / "u", "--text", tmp_path / "none.txt"), "no such file"
    )


def crafted(source, tmp_path, name: str, change) -> str:
    raw = stored_payload(source / BEST)
    change(raw)
    path = tmp_path / name / BEST
    path.parent.mkdir()
    checkpoint.save(raw, path)
    return str(path)


def _first(raw, bits=None) -> dict:
    return next(e for e in raw["quantized"].values() if bits is None or e["bits"] == bits)


CRAFTED = {
    "wrong scale shape": (
        lambda raw: _first(raw).update(scales=torch.ones(3, 2, dtype=torch.float16)),
        "scales are (3, 2)",
    ),
    "nibbles past the tensor": (
        lambda raw: _first(raw).update(values=torch.cat([_first(raw)["values"], _first(raw)["values"][:, :1]], 1)),
        "int4 values are",
    ),
    "NaN scale": (lambda raw: _first(raw)["scales"].__setitem__(0, float("nan")), "scales should be finite numbers"),
    "negative scale": (lambda raw: _first(raw)["scales"].__setitem__(0, -1.0), "scales should be finite numbers"),
    "huge scale": (lambda raw: _first(raw)["scales"].__setitem__(0, 60000.0), "between 0 and"),
    "bits 5": (lambda raw: _first(raw).update(bits=5), "is not a quantized matrix"),
    "float values": (
        lambda raw: _first(raw).update(values=_first(raw)["values"].float()),
        "should be a tensor of byte",
    ),
    "stored twice": (
        lambda raw: raw["model"].update({k: torch.zeros(1) for k in list(raw["quantized"])[:1]}),
        "unexpected",
    ),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_compressed_checkpoints_are_refused_with_one_line(compressed, tmp_path, case):
    change, words = CRAFTED[case]
    path = crafted(compressed["tf"], tmp_path, "bad", change)
    for command in (["info", path], ["sample", path, "-n", "5"]):
        one_line_error(cli(*command), words)


def test_info_and_runs_read_a_compressed_run_without_torch(compressed):
    from conftest import imported

    assert imported("info", compressed["tf"]) == []
    assert imported("runs", compressed["tf"].parent, "--json") == []


def test_an_alibi_model_keeps_its_heads():
    """ALiBi's slope of head h follows from h and the number of heads: dropping one would change the others'."""
    import numpy as np

    from charlm.compress import drop_heads
    from charlm.config import ModelConfig
    from charlm.errors import ConfigError

    cfg = ModelConfig(
        kind="transformer", vocab_size=11, n_layers=1, d_model=16, n_heads=4, context=8, positions="alibi"
    )
    with pytest.raises(ConfigError, match="cannot prune an ALiBi model"):
        drop_heads(cfg, {}, np.zeros((1, 4)), 1)


# ---- issue 38: the run lock, atomic writes, what --to and --text may be ------------------------------------


def _holding_the_lock(to: Path) -> subprocess.Popen:
    """Another process holding `to` with the run lock, as a training into it does (runs.RunLock)."""
    code = "import sys; from pathlib import Path; from charlm.storage.runs import RunLock; "
    code += "lock = RunLock(Path(sys.argv[1])); "
    code += "print('held', flush=True); sys.stdin.read()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(to)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_to_held_by_another_process_is_refused_and_left_alone(view_runs, tmp_path):
    """Issue 38: compress took no lock; into a run still training it said "written" and the trainer then wrote
    over it. Now it takes the lock train takes: refused in one line, and the holder's directory untouched."""
    to = tmp_path / "busy"
    holder = _holding_the_lock(to)
    try:
        one_line_error(cli("compress", view_runs["tf"], "--to", to, "--bits", "8", "--tokens", "256"), "is in use by")
        assert sorted(p.name for p in to.iterdir()) == [".lock"]
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    r = cli("compress", view_runs["tf"], "--to", to, "--bits", "8", "--tokens", "256")  # let go: now it may
    assert r.exit_code == 0 and (to / "best.safetensors").is_file() and not (to / ".lock").exists(), r.output


def test_a_to_that_is_a_link_or_not_a_directory_is_refused(view_runs, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    one_line_error(cli("compress", view_runs["tf"], "--to", tmp_path / "link", "--bits", "8"), "is a symbolic link")
    assert list(elsewhere.iterdir()) == []
    os.mkfifo(tmp_path / "fifo")
    one_line_error(cli("compress", view_runs["tf"], "--to", tmp_path / "fifo", "--bits", "8"), "is a FIFO")
    (tmp_path / "file").write_text("x")
    one_line_error(cli("compress", view_runs["tf"], "--to", tmp_path / "file", "--bits", "8"), "not a directory")


def _compress_process(run: Path, to: Path, tmp_path: Path, text: Path) -> subprocess.Popen:
    env = {**os.environ, "CHARLM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ["compress", str(run), "--to", str(to), "--bits", "4", "--text", str(text), "--tokens", "8192"]
    return subprocess.Popen(
        [sys.executable, "-m", "charlm", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_writing_leaves_nothing_and_a_retry_works(view_runs, tmp_path, signum):
    """Issue 38: interrupted between its two writes compress left an unscored best.pt (and a retry said "already
    holds a run"); SIGTERM or SIGHUP mid-write left a temp file in --to. Signalled while it writes (its scratch
    directory is there), it now exits 128+signal leaving --to as it was: not there, no temp file."""
    text = tmp_path / "text.txt"
    text.write_text((view_runs["tf"].parent / "corpus.txt").read_text() * 4)
    to = tmp_path / "out"
    proc = _compress_process(view_runs["tf"], to, tmp_path, text)
    while not list(to.glob(".compress-*")) and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert not to.exists() or list(to.rglob("*")) == [], list(to.rglob("*"))
    r = cli("compress", view_runs["tf"], "--to", to, "--bits", "4", "--text", text, "--tokens", "8192")
    assert r.exit_code == 0, r.output
    assert checkpoint.read_header(to).best_val_bpc is not None and sorted(p.name for p in to.iterdir()) == [
        "best.safetensors"
    ]


def test_a_full_disk_leaves_nothing_behind(view_runs, tmp_path):
    """A disk that fills while the run is written: one line saying so, and --to as it was (not there)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here: needs root")
    try:
        to = disk / "out"
        err = one_line_error(cli("compress", view_runs["tf"], "--to", to, "--tokens", "256"), "no space left")
        assert f"writing {to}:" in err and ".compress-" not in err, err  # where it went, not a scratch name
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _copy_run(run: Path, where: Path) -> Path:
    shutil.copytree(run, where, ignore=shutil.ignore_patterns("*.jsonl", ".lock"))
    return where


def test_without_to_the_run_goes_beside_the_source_never_over_a_run(view_runs, tmp_path):
    """Issue 37: --bits 4 without --to was refused; now it goes to RUN-int4 beside the run (numbered when that
    is taken) and says where."""
    run = _copy_run(view_runs["tf"], tmp_path / "tt")
    r = cli("compress", run, "--bits", "4", "--tokens", "256")
    assert r.exit_code == 0 and str(tmp_path / "tt-int4" / "best.safetensors") in r.stdout.replace("\n", ""), r.output
    r = cli("compress", run, "--bits", "4", "--tokens", "256", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["path"] == str(tmp_path / "tt-int4-2"), r.output
    r = cli("compress", run, "--bits", "8", "--drop-heads", "1", "--tokens", "256", "--json")
    assert json.loads(r.stdout)["path"] == str(tmp_path / "tt-int8-drop1h"), r.output
    assert checkpoint.read_header(tmp_path / "tt-int4").compressed  # the first is still the int4 run


def test_report_with_a_writing_flag_is_refused_in_one_short_line(view_runs):
    """Issue 37: the refusal was 94 characters, folded mid-word by an 80-column terminal."""
    for flags in (["--bits", "8"], ["--to", "x", "--bits", "4", "--drop-heads", "1", "--drop-units", "2"]):
        err = one_line_error(cli("compress", view_runs["tf"], "--report", *flags), "--report")
        assert len(err) <= 79 and "--bits" in err, err


def test_a_text_that_is_no_regular_file_or_too_short_is_refused(view_runs, tmp_path):
    """Issue 38: --text on a FIFO, /dev/zero or a directory said "no such file"; on a 2-character file it scored
    one token and --report recommended int4 with a head dropped."""
    os.mkfifo(tmp_path / "fifo")  # (opened for reading with no writer: must not wait)
    (tmp_path / "short.txt").write_text("RO")
    for text, words in (
        (tmp_path / "fifo", "is a FIFO"),
        ("/dev/zero", "is a device"),
        (tmp_path, "is a directory"),
        (tmp_path / "short.txt", "at least 64"),
    ):
        one_line_error(cli("compress", view_runs["tf"], "--to", tmp_path / "out", "--bits", "8", "--text", text), words)
        assert not (tmp_path / "out").exists()
    one_line_error(cli("compress", view_runs["tf"], "--report", "--text", tmp_path / "short.txt"), "at least 64")


# ---- the `compressed` record ---------------------------------------------------------------------------


def test_compressing_a_compressed_run_keeps_its_history(compressed, tmp_path):
    """Issue 38: info showed only the last step."""
    r = cli("compress", compressed["tf"], "--to", tmp_path / "again", "--bits", "8", "--tokens", "256")
    assert r.exit_code == 0, r.output
    steps = checkpoint.compression_steps(checkpoint.read_header(tmp_path / "again").compressed)
    assert [s["bits"] for s in steps] == [4, 8] and steps[0].get("heads_dropped") == 1
    assert steps[1]["from"] == str(compressed["tf"] / "best.safetensors")
    info = json.loads(cli("info", tmp_path / "again", "--json").stdout)
    assert info["compressed"] == "int4 (groups of 32) weights; 1 head of each layer dropped → int8 weights"


BAD_RECORDS = {
    "a flag for a count": ({"from": "x", "bits": 4, "heads_dropped": True}, "heads_dropped"),
    "a huge count": ({"from": "x", "bits": 32, "units_dropped": 10**18}, "units_dropped"),
    "bits as text": ({"from": "x", "bits": "8"}, "bits"),
    "bits 5": ({"steps": [{"from": "x", "bits": 5}]}, "bits"),
    "no source": ({"bits": 8}, "source"),
    "steps not a list": ({"steps": {"bits": 8}}, "steps"),
    "no steps": ({"steps": []}, "steps"),
    "dropped not pairs": ({"from": "x", "bits": 8, "dropped": [[0, 1, 2]]}, "dropped"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_crafted_compressed_record_is_refused_with_one_line(compressed, tmp_path, case):
    """Issue 38: a crafted record made info print "True head of each layer dropped; 1000000000000000000 units"."""
    record, words = BAD_RECORDS[case]
    path = crafted(compressed["tf"], tmp_path, "bad", lambda raw: raw.update(compressed=record))
    for command in (["info", path], ["sample", path, "-n", "5"]):
        one_line_error(cli(*command), "compressed record", words)


# ---- issue 37: progress and a table that fits the terminal ------------------------------------------------


def test_compress_reports_each_phase_and_the_view_draws_it_on_a_terminal(view_runs, tmp_path):
    import io

    from rich.console import Console

    from charlm.views.compress import CompressProgress

    calls = []
    compress(
        str(view_runs["lstm"]),
        CompressOptions(to=str(tmp_path / "out"), bits=8, drop_units=2, tokens=256),
        lambda what, done, total: calls.append((what, done, total)),
    )
    assert [done for _, done, _ in calls] == list(range(len(calls))) and all(t == len(calls) for _, _, t in calls)
    assert any("importance" in what for what, _, _ in calls) and "scoring" in calls[1][0]
    screen = io.StringIO()
    with CompressProgress(Console(file=screen, force_terminal=True, width=80)) as progress:
        progress("scoring the original on 1,024 tokens", 1, 5)
    assert "scoring the original" in screen.getvalue() and "1/5" in screen.getvalue()
    quiet = io.StringIO()
    with CompressProgress(Console(file=quiet, width=80)) as progress:  # not a terminal: nothing
        progress("scoring", 1, 5)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_report_fits_the_console_and_never_cuts_a_setting(width):
    """Issue 37: at 80 columns every cell was cut, the setting's name included (`│ int4 │ 795,9… │`)."""
    import io

    from rich.console import Console

    from charlm.commands.compress import Report
    from charlm.compress import Measured
    from charlm.views.compress import render_report

    names = ["float32", "bf16", "int8", "int4", "float32 -4 units/layer", "float32 -4 units/layer (random)"]
    rows = [
        Measured(name, 795_904 - 1000 * i, 32 / (i + 1), 3_183_616 // (i + 1), 2.1 + i / 100, 1 - i / 50, i / 900, 11e3)
        for i, name in enumerate(names)
    ]
    rep = Report(rows, "checkpoints/tt/corpus.txt (validation part)", 32768, ["a reading"], "checkpoints/tt/best.pt")
    screen = io.StringIO()
    render_report(Console(file=screen, width=width), rep)
    lines = screen.getvalue().splitlines()
    assert all(len(line) <= width for line in lines) and "…" not in screen.getvalue()
    for name in names:  # whole, on a line of its own or at the start of a table row
        assert any(line.strip() == name or line.strip().startswith(name + "  ") for line in lines), name
    for number in ("795,904", "3.18 MB (100%)", "2.1000", "+0.0500", "90.0%", "0.0056", "11,000"):
        assert any(number in line for line in lines), number


# ---- fuzzing the record (issue 38): hypothesis, with test_properties' hostile values -----------------------


def _records():
    from hypothesis import strategies as st

    from tests.test_properties import hostile

    def either(good):
        return st.one_of(good, hostile)

    pairs = st.lists(st.lists(st.integers(0, 70_000), min_size=2, max_size=2), max_size=3)
    step = st.fixed_dictionaries(
        {"from": either(st.text(max_size=8)), "bits": either(st.sampled_from([32, 16, 8, 4]))},
        optional={
            "heads_dropped": either(st.integers(0, 70_000)),
            "units_dropped": either(st.integers(0, 70_000)),
            "dropped": either(pairs),
        },
    )
    return st.one_of(hostile, step, st.fixed_dictionaries({"steps": either(st.lists(step, max_size=3))}))


def test_any_record_is_refused_in_one_line_or_described_sanely():
    """Whatever a file holds as its `compressed` record: check_compressed says what is wrong in one line, or the
    record describes itself with bits charlm writes and counts below MAX_DROPPED (no "True head ... dropped")."""
    import re

    from hypothesis import event, given

    from tests.test_properties import bounded

    @bounded(300)
    @given(_records())
    def check(record):
        problem = checkpoint.check_compressed(record)
        if problem is not None:
            assert isinstance(problem, str) and problem and "\n" not in problem and len(problem) < 200, problem
            event("refused")
            seen.add("refused")
            return
        event("accepted")
        seen.add("accepted")
        steps = checkpoint.compression_steps(record)
        described = checkpoint.describe_compressed(record)
        assert (described is None) == (not steps)
        if described:
            assert "True" not in described and "False" not in described, described
            assert all(int(n) < checkpoint.MAX_DROPPED for n in re.findall(r"\d+", described)), described
            assert described.count("→") == len(steps) - 1

    seen = set()
    check()
    assert seen == {"refused", "accepted"}


def test_a_hostile_record_in_a_real_file_is_one_line_or_read(compressed, tmp_path):
    """The same through the file: read_header either reads it (and info's summary describes it) or refuses
    it with one CheckpointError line; never another exception."""
    from hypothesis import assume, given

    from charlm.errors import CheckpointError
    from tests.test_properties import bounded

    raw = stored_payload(compressed["tf"] / "best.safetensors")
    path = tmp_path / "run" / "best.safetensors"
    path.parent.mkdir()

    @bounded(40)
    @given(_records())
    def check(record):
        try:  # a record the format cannot hold (bytes; an integer JSON refuses to read back) is no file to craft
            checkpoint.save({**raw, "compressed": record}, path)
        except (TypeError, ValueError):
            assume(False)
        try:
            summary = checkpoint.read_header(path).summary()
        except CheckpointError as e:
            assert "\n" not in str(e), str(e)
            return
        assert checkpoint.check_compressed(record) is None  # a record refused on its own is never read
        assert summary["compressed"] is None or isinstance(summary["compressed"], str)

    check()


def test_report_shows_its_progress_in_a_real_terminal(view_runs, tmp_path):
    """Issue 37: `--report` ran 6m20s with a blank terminal. In a pty (80 × 24) the phases appear while it
    measures, then the table, which fits."""
    import pexpect
    from conftest import charlm_pty, strip_ansi

    child = charlm_pty(tmp_path, "compress", view_runs["tf"], "--report", "--tokens", "256", size=(80, 24), timeout=180)
    child.expect("scoring the original on")
    child.expect("int4: writing, loading back and scoring")
    child.expect(pexpect.EOF)
    child.close()
    screen = strip_ansi(child.before)
    assert child.exitstatus == 0, screen
    assert "float32 -1 head/layer (random)" in screen and "smallest within" in screen


def test_a_hostile_quantized_matrix_is_one_line_or_loads_finite(compressed, tmp_path):
    """Fuzzing the quantized tensors: one matrix's entry of a real int4 run replaced by hostile bits, values and
    scales (dtypes, shapes, NaN, inf, negative and huge scales). checkpoint.load refuses it in one line, or gives
    a model whose weights are all finite."""
    from hypothesis import event, given
    from hypothesis import strategies as st

    from charlm.errors import CheckpointError
    from tests.test_properties import bounded

    raw = stored_payload(compressed["tf"] / "best.safetensors")
    name, entry = next(iter(raw["quantized"].items()))
    rows, cols = entry["values"].shape
    path = tmp_path / "run" / "best.safetensors"
    path.parent.mkdir()
    dtypes = st.sampled_from([torch.uint8, torch.int8, torch.float16, torch.float32, torch.int64])
    numbers = st.floats(allow_nan=True, allow_infinity=True, width=16) | st.integers(-300, 300)
    sizes = st.sampled_from([0, 1, 2, rows, cols, rows * 2, 33])

    @st.composite
    def tensors(draw, like):
        shape = draw(st.sampled_from([tuple(like.shape), (draw(sizes),), (draw(sizes), draw(sizes))]))
        fill = draw(st.lists(numbers, min_size=1, max_size=4))
        flat = torch.tensor([fill[i % len(fill)] for i in range(math.prod(shape))], dtype=torch.float64)
        return flat.reshape(shape).to(draw(dtypes)) if draw(st.booleans()) else like.clone()

    @bounded(40)
    @given(st.sampled_from([4, 8, 5, 0, True, "8", None]), tensors(entry["values"]), tensors(entry["scales"]))
    def check(bits, values, scales):
        checkpoint.save(
            {**raw, "quantized": {**raw["quantized"], name: {"bits": bits, "values": values, "scales": scales}}}, path
        )
        try:
            ck = checkpoint.load(path)
        except CheckpointError as e:
            assert "\n" not in str(e), str(e)
            event("refused")
            seen.add("refused")
            return
        event("loaded")
        seen.add("loaded")
        assert all(torch.isfinite(t).all() for t in ck.model.state_dict().values())

    seen = set()
    check()
    assert seen == {"refused", "loaded"}  # both ways were tried


def test_what_a_killed_compress_left_is_removed_by_the_next_one(view_runs, tmp_path):
    """SIGKILL cannot be handled: the scratch directory and the lock file stay in --to, but no best.pt; the next
    compress into it (the lock free: the kernel let go) removes them and writes the run."""
    text = tmp_path / "text.txt"
    text.write_text((view_runs["tf"].parent / "corpus.txt").read_text() * 4)
    to = tmp_path / "out"
    proc = _compress_process(view_runs["tf"], to, tmp_path, text)
    while not list(to.glob(".compress-*")) and proc.poll() is None:
        time.sleep(0.005)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not (to / "best.safetensors").exists()
    r = cli("compress", view_runs["tf"], "--to", to, "--bits", "4", "--text", text, "--tokens", "8192")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in to.iterdir()) == ["best.safetensors"]
