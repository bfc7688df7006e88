"""`charlm sample`: through Click's CliRunner, through a real pipe, and on a real terminal (pty)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pexpect
import pytest
from click.testing import CliRunner
from conftest import (
    charlm_pty,
    cli,
    one_line_error,
)

from charlm.cli import main
from charlm.errors import ConfigError
from charlm.generate import SampleConfig, Streamer
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST

MEMORISED = "But soft, what light through yonder window breaks?\n"
ESCAPES = "[bold]red[/bold] \x1b]0;pwned\x07 \x1b[31mred\x1b[0m\n"
BEFORE_ESCAPES = "window breaks?\n"  # a prompt the model continues with ESCAPES


def run(*args, input=None, code=0):
    """`charlm sample ARGS`, checked to exit with `code`: two failed runs never pass as equal output."""
    r = CliRunner().invoke(main, ["sample", *map(str, args)], input=input)
    assert r.exit_code == code, (r.exit_code, r.output)
    return r


def engine(ckpt, prompt: str, **settings) -> str:
    """What sample should print: the prompt, then the continuation straight from the library, ending
    with a newline."""
    ck = checkpoint.load(ckpt)
    text = prompt + Streamer(ck.model, ck.tokenizer).complete(ck.tokenizer.encode(prompt), SampleConfig(**settings))
    return text if text.endswith("\n") else text + "\n"


def test_greedy_sample_is_the_prompt_and_the_engines_continuation(gen_runs):
    r = run(gen_runs["tf"], "-p", "ROMEO:", "-n", 60, "-t", 0)
    assert r.exit_code == 0, r.output
    assert r.stdout == engine(gen_runs["tf"], "ROMEO:", temperature=0, max_tokens=60)
    assert r.stdout.startswith("ROMEO:\n" + MEMORISED)  # the model has learnt its text
    assert run(gen_runs["tf"], "-p", "ROMEO:", "-n", 60, "-t", 0, "--no-echo").stdout == r.stdout[len("ROMEO:") :]


def test_same_seed_same_samples_and_num_samples(gen_runs):
    args = (gen_runs["tf"], "-p", "JULIET:", "-n", 40, "-t", 1.5, "--seed", 7)
    one, again = run(*args), run(*args)
    assert one.exit_code == 0 and one.stdout == again.stdout
    assert one.stdout == engine(gen_runs["tf"], "JULIET:", temperature=1.5, max_tokens=40, seed=7)
    two = run(*args, "--num-samples", 2)
    second = run(gen_runs["tf"], "-p", "JULIET:", "-n", 40, "-t", 1.5, "--seed", 8)
    assert two.stdout == one.stdout + "---\n" + second.stdout  # sample i uses seed + i


def test_cache_and_no_cache_give_the_same_text(gen_runs):
    args = (gen_runs["tf"], "-p", "ROMEO:", "-n", 120, "-t", 0)
    assert run(*args).stdout == run(*args, "--no-cache").stdout


def test_stop_string_cuts_the_text(gen_runs):
    r = run(gen_runs["tf"], "-p", "ROMEO:", "-n", 200, "-t", 0, "--stop", "light")
    assert r.stdout == "ROMEO:\nBut soft, what \n"
    r = run(gen_runs["tf"], "-p", "ROMEO:\n", "-n", 200, "-t", 0, "--stop", r"\n")  # escapes: \n is a newline
    assert r.stdout == "ROMEO:\n" + MEMORISED


def test_stats_is_one_json_line_on_stderr(gen_runs):
    r = run(gen_runs["tf"], "-p", "ROMEO:", "-n", 30, "--seed", 1, "--stats")
    assert r.exit_code == 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    stats = json.loads(lines[0])
    assert stats["tokens"] == 30 and stats["prompt_tokens"] == 6 and stats["cache"] is True
    assert stats["seconds"] > 0 and stats["tokens_per_s"] > 0 and stats["ttft_ms"] > 0
    assert "{" not in r.stdout


def test_prompt_from_stdin_and_from_a_file(gen_runs, tmp_path):
    want = run(gen_runs["tf"], "-p", "JULIET:", "-n", 20, "-t", 0).stdout
    assert run(gen_runs["tf"], "-n", 20, "-t", 0, input="JULIET:").stdout == want
    (tmp_path / "p.txt").write_text("JULIET:", encoding="utf-8")
    assert run(gen_runs["tf"], "--prompt-file", tmp_path / "p.txt", "-n", 20, "-t", 0).stdout == want


def test_unknown_characters(gen_runs):
    r = run(gen_runs["tf"], "-p", "ROMEO ü€", "-n", 5, code=1)
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "never saw" in r.stderr and "--unknown" in r.stderr
    assert "Traceback" not in r.output
    dropped = run(gen_runs["tf"], "-p", "ROMEO:ü", "-n", 30, "-t", 0, "--unknown", "drop")
    assert dropped.exit_code == 0 and dropped.stdout == run(gen_runs["tf"], "-p", "ROMEO:", "-n", 30, "-t", 0).stdout
    replaced = run(gen_runs["tf"], "-p", "ROMEOü", "-n", 5, "-t", 0, "--unknown", "replace")
    assert replaced.exit_code == 0 and replaced.stdout.startswith("ROMEO ")  # the prompt echoed as the model read it


@pytest.mark.parametrize(
    "args,message",
    [
        (["-t", "-1"], "temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-k", "-2"], "--top-k"),
        (["--repetition-penalty", "0"], "--repetition-penalty"),
        (["-n", "-5"], "--max-tokens"),
        (["--num-samples", "0"], "--num-samples"),
        (["--stop", ""], "stop"),
        (["-p", "x", "--prompt-file", "f.txt"], "not both"),
        (["--prompt-file", "/no/such/file.txt"], "no such file"),
    ],
)
def test_bad_flags_are_one_line_errors(gen_runs, args, message):
    r = run(gen_runs["tf"], *args, code=1)
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.output


def test_bad_checkpoint_is_a_one_line_error(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    for path in (tmp_path / "missing", tmp_path / "junk.pt"):
        r = run(path, "-p", "x", code=1)
        assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.output


def _env(tmp_path):
    return dict(os.environ, CHARLM_CACHE=str(tmp_path / "cache"), PYTHONIOENCODING="utf-8")


def test_a_real_pipe_gets_exactly_the_text(gen_runs, tmp_path):
    cmd = [sys.executable, "-m", "charlm", "sample", str(gen_runs["tf"]), "-p", BEFORE_ESCAPES, "-n", "90", "-t", "0"]
    out = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, env=_env(tmp_path), timeout=120)
    assert out.returncode == 0 and out.stderr == b""
    text = out.stdout.decode("utf-8")
    # exactly the model's text: no colour, no spinner, its own escapes untouched (a pipe is not a screen)
    assert text == engine(gen_runs["tf"], BEFORE_ESCAPES, temperature=0, max_tokens=90)
    assert text.startswith(BEFORE_ESCAPES + ESCAPES)


def test_a_reader_that_stops_early_is_no_error(gen_runs, tmp_path):
    """`charlm sample ... | head`: the reader leaves early; no traceback, no error message."""
    cmd = f"'{sys.executable}' -m charlm sample '{gen_runs['tf']}' -p ROMEO: -t 0 -n 100000 | head -c 20"
    out = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, stdin=subprocess.DEVNULL, env=_env(tmp_path), timeout=120
    )
    assert out.stdout.decode() == ("ROMEO:\n" + MEMORISED)[:20]
    assert out.stderr == b""


def test_a_terminal_sees_escapes_as_harmless_text(gen_runs, tmp_path):
    child = charlm_pty(tmp_path, "sample", gen_runs["tf"], "-p", BEFORE_ESCAPES, "-n", "60", "-t", "0", size=(200, 40))
    child.expect(pexpect.EOF)
    child.close()
    screen = child.before
    assert child.exitstatus == 0
    assert r"\x1b]0;pwned\x07" in screen and r"\x1b[31mred\x1b[0m" in screen  # visible, as text
    assert "\x1b]" not in screen and "\x07" not in screen and "\x1b[31m" not in screen  # never sent raw
    assert "[bold]red[/bold]" in screen  # markup is shown, not applied


def test_sample_is_a_plain_function_whose_options_are_the_flags(gen_runs):
    """commands.generate.sample from Python, with the configs the flags fill: the same samples as the CLI."""
    from charlm.commands.generate import sample
    from charlm.options import SampleOptions

    settings, opts = SampleConfig(max_tokens=30, seed=7), SampleOptions(num_samples=2, no_cache=True)
    texts = [c.prompt + "".join(c.pieces) for c in sample(gen_runs["tf"], "ROMEO:", settings, opts)]
    r = run(gen_runs["tf"], "-p", "ROMEO:", "-n", 30, "--seed", 7, "--num-samples", 2, "--no-cache")
    assert len(texts) == 2 and r.stdout == "---\n".join(t if t.endswith("\n") else t + "\n" for t in texts)
    second = run(gen_runs["tf"], "-p", "ROMEO:", "-n", 30, "--seed", 8).stdout  # sample i uses seed + i
    assert second == (texts[1] if texts[1].endswith("\n") else texts[1] + "\n")
    with pytest.raises(ConfigError, match="--num-samples must be at least 1"):
        next(sample(gen_runs["tf"], "ROMEO:", settings, SampleOptions(num_samples=0)))


def test_sample_of_a_run_whose_best_pt_is_damaged_points_at_last_pt(gen_runs, tmp_path):
    """Regression (item 21): a damaged best.pt beside a good last.pt said "train again", with no word of
    last.pt (which `sample RUN` passes over for best.pt)."""
    run = tmp_path / "run"
    shutil.copytree(gen_runs["lstm"], run)
    (run / BEST).write_bytes(b"PK\x03\x04 damaged")
    one_line_error(cli("sample", run, "-n", "2"), f"{run / LAST} may be intact: use it, or move {BEST} away")
    assert cli("sample", run / LAST, "-n", "2").exit_code == 0


def test_endless_prompts_end_in_one_line(gen_runs, tmp_path):
    """Regression (item 20): `sample --prompt-file /dev/zero` and `yes | charlm sample` read until memory ran
    out. A prompt is read up to 16 MB (far beyond any context), then refused in one line."""
    one_line_error(cli("sample", gen_runs["lstm"], "--prompt-file", "/dev/zero"), "more than 16 MB")
    one_line_error(cli("attn", gen_runs["tf"], "--prompt-file", "/dev/zero"), "more than 16 MB")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(
        f"yes | {shlex.quote(sys.executable)} -m charlm sample {shlex.quote(str(gen_runs['lstm']))}",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "more than 16 MB" in r.stderr, r.stderr


def test_the_prompt_may_be_an_argument(view_runs):
    """Found: `charlm sample CKPT "ROMEO:"` -> "Got unexpected extra argument (ROMEO:)"."""
    by_flag = cli("sample", view_runs["tf"], "-p", "ROMEO:", "-n", "20", "--seed", "3")
    by_argument = cli("sample", view_runs["tf"], "ROMEO:", "-n", "20", "--seed", "3")
    assert by_argument.exit_code == 0 and by_argument.stdout == by_flag.stdout
    assert cli("attn", view_runs["tf"], "ROMEO:", "--width", "80").exit_code == 0
    assert cli("gates", view_runs["lstm"], "ROMEO:", "--width", "80").exit_code == 0
    one_line_error(cli("sample", view_runs["tf"], "ROMEO:", "-p", "JULIET:"), "give the text once")
