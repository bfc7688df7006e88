"""`charlm compare`: the same prompt, seed and settings through several checkpoints, side by side,
then a table; --interactive through a real pty."""

import io
import json
import re

import pexpect
import pytest
from click.testing import CliRunner
from conftest import (
    charlm_pty,
    cli,
    strip_ansi,
)
from rich.console import Console

from charlm.cli import main
from charlm.comparison import Comparison
from charlm.generate import SampleConfig, Streamer
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST
from charlm.views.compare import CompareView
from charlm.views.text import safe_text


def watch_and_show(comparison: Comparison, console: Console, prompt: str) -> None:
    """What `charlm compare` draws on console: the panels as the models run (a terminal), then the result."""
    view = CompareView(console)
    with view.generating(comparison) as on_tick:
        comparison.run(prompt, on_tick)
    view.show(comparison)


def blocks(stdout: str) -> dict[str, str]:
    """Plain output: '== run (kind · tokenizer · params) ==' then the text, per model."""
    found = re.findall(r"^== (\S+) \((.*?)\) ==\n(.*?)\n\n", stdout, flags=re.M | re.S)
    return {name: body for name, _, body in found}


def table_rows(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if cells and cells[0].startswith("cmp-") and len(cells) > 4:
            rows[cells[0]] = cells[1:]
    return rows


def test_plain_output_blocks_equal_each_model_generating_alone(cmp_runs):
    """Interleaving the models round-robin must not change what any of them writes: each block equals
    that checkpoint generating alone with the same seed and settings (with a BPE model among char models,
    -n counts characters: its first 15)."""
    r = cli(
        "compare",
        cmp_runs["lstm"],
        cmp_runs["tf"],
        cmp_runs["bpe"],
        "--prompt",
        "the cat",
        "-n",
        "15",
        "--seed",
        "7",
        "--temperature",
        "0.9",
        "--top-k",
        "10",
    )
    assert r.exit_code == 0, r.output
    got = blocks(r.stdout)
    assert list(got) == ["cmp-lstm", "cmp-tf", "cmp-bpe"]
    for name, key in (("cmp-lstm", "lstm"), ("cmp-tf", "tf"), ("cmp-bpe", "bpe")):
        ck = checkpoint.load(cmp_runs[key])
        alone = Streamer(ck.model, ck.tokenizer).complete(
            ck.tokenizer.encode("the cat"), SampleConfig(temperature=0.9, top_k=10, max_tokens=60, seed=7)
        )
        assert got[name] == safe_text("the cat" + alone[:15])
    assert "== cmp-lstm (lstm · char" in r.stdout and "== cmp-bpe (transformer · bpe · 2" in r.stdout


def test_table_shows_checkpoint_facts_eval_and_marks_the_best(cmp_runs, cmp_corpus):
    r = cli(
        "compare", cmp_runs["lstm"], cmp_runs["tf"], "--prompt", "the", "-n", "5", "--seed", "1", "--eval", cmp_corpus
    )
    assert r.exit_code == 0, r.output
    rows = table_rows(r.stdout)
    assert set(rows) == {"cmp-lstm", "cmp-tf"}
    # columns: params, steps, trained, val bpc, eval bpc, tok/s, chars/s, TTFT
    for name, key in (("cmp-lstm", "lstm"), ("cmp-tf", "tf")):
        ck = checkpoint.load(cmp_runs[key])
        params, steps, _, val, ev, tps, cps, ttft = rows[name]
        assert params == f"{ck.saved.params / 1e3:.3g}k" and steps == "30"
        assert float(val.rstrip("*")) == pytest.approx(ck.saved.best_val_bpc, abs=6e-4)
        alone = json.loads(cli("eval", cmp_runs[key], cmp_corpus, "--json").stdout)
        assert float(ev.rstrip("*")) == pytest.approx(alone["bits_per_char"], abs=6e-4)
        assert float(tps.rstrip("*").replace(",", "")) > 0 and float(ttft.rstrip("*")) > 0
        assert cps.rstrip("*") == tps.rstrip("*")  # a char model: one character per token
    for col in (3, 4):  # val bpc, eval bpc: lowest is best, marked with * in plain output
        values = {n: float(cells[col].rstrip("*")) for n, cells in rows.items()}
        starred = [n for n, cells in rows.items() if cells[col].endswith("*")]
        assert starred == [min(values, key=values.get)]
    assert "eval bpc: bits/char on rhymes.txt" in r.stdout and "seed 1" in r.stdout


def test_timings_are_starred_only_beyond_their_noise(cmp_runs):
    """Regression (issue 13): a checkpoint compared with itself always starred the second copy's speed and TTFT."""
    cks = [checkpoint.load(cmp_runs["tf"]), checkpoint.load(cmp_runs["tf"])]
    comparison = Comparison(cks, SampleConfig(max_tokens=40, seed=1))
    view = CompareView(Console(file=io.StringIO(), width=120))  # plain: the best is starred
    comparison.run("the")
    a, b = comparison.players
    assert a.output == b.output and len(a.steps) == 39  # every token after the first is timed

    def starred() -> list[str]:
        cols, cells = view.columns(comparison)
        return [
            f"{col} {k}"
            for k, row in enumerate(cells)
            for col, cell in zip(cols, row)
            if cell.plain.endswith("*") and col in ("tok/s", "chars/s", "TTFT")
        ]

    # timings with a known wobble (a real run's depends on the machine): the run's quarters at 1.0 to 1.2 ms a step
    a.steps = [(0.001 * (1 + 0.2 * (4 * i // len(a.steps)) / 3), n) for i, (_, n) in enumerate(a.steps)]
    a.seconds = sum(dt for dt, _ in a.steps)
    b.steps, b.seconds, b.ttft_ms = list(a.steps), a.seconds, a.ttft_ms * 1.4  # the same speed; TTFT 40% apart
    assert starred() == []
    b.steps = [(dt * 1.05, n) for dt, n in a.steps]  # 5% slower throughout: within a's own 20% wobble
    assert starred() == []
    b.steps, b.ttft_ms = [(dt * 10, n) for dt, n in a.steps], a.ttft_ms * 3  # ten times slower throughout
    assert starred() == ["tok/s 0", "chars/s 0", "TTFT 0"]
    assert "timings only beyond their noise" in " ".join(view.notes_lines(comparison))


def test_chars_per_second_beside_tokens_per_second(cmp_runs):
    r = cli("compare", cmp_runs["tf"], cmp_runs["bpe"], "--prompt", "the", "-n", "30", "--seed", "1", "--json")
    assert r.exit_code == 0, r.output
    tf, bpe = json.loads(r.stdout)["models"]
    for m in (tf, bpe):
        assert m["chars"] == len(m["text"]) and m["chars_per_s"] == pytest.approx(m["chars"] / m["seconds"], rel=0.01)
        assert m["tokens_per_s"] == pytest.approx(m["tokens"] / m["seconds"], rel=0.01)
    assert tf["chars"] == tf["tokens"] == 30
    assert bpe["chars"] == 30 and bpe["tokens"] < 30  # -n counted characters: a BPE token holds several


def test_the_notes_name_every_sampling_setting_changed_from_its_default(cmp_runs):
    """Read off SampleConfig's fields: a new sampling option shows up here with no edit to the view."""
    args = ["compare", cmp_runs["tf"], cmp_runs["lstm"], "-p", "the", "-n", "5", "--seed", "2"]
    plain = cli(*args).stdout
    assert "seed 2 · temperature 0.8\n" in plain and "top-k" not in plain
    changed = cli(*args, "--top-k", "5", "--repetition-penalty", "1.3", "-t", "0.5").stdout
    assert "seed 2 · temperature 0.5 · top-k 5 · repetition-penalty 1.3\n" in changed


def test_json_stop_and_repetition_penalty_match_each_model_alone(cmp_runs):
    r = cli(
        "compare",
        cmp_runs["lstm"],
        cmp_runs["bpe"],
        "--prompt",
        "the cat",
        "-n",
        "40",
        "--seed",
        "3",
        "--repetition-penalty",
        "1.3",
        "--stop",
        "the",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["prompt"] == "the cat" and out["seed"] == 3
    assert out["settings"]["repetition_penalty"] == 1.3 and out["settings"]["stop"] == ["the"]
    for m, key in zip(out["models"], ("lstm", "bpe")):
        ck = checkpoint.load(cmp_runs[key])
        alone = Streamer(ck.model, ck.tokenizer).complete(  # -n counts characters: a char and a BPE model
            ck.tokenizer.encode("the cat"), SampleConfig(max_tokens=160, seed=3, repetition_penalty=1.3, stop=["the"])
        )
        assert m["text"] == alone[:40] and "the" not in m["text"]
        assert m["run"] == f"cmp-{key}" and m["steps"] == 30 and m["best_val_bpc"] > 0
    r = cli("compare", cmp_runs["lstm"], cmp_runs["bpe"], "-i", "--json")
    assert r.exit_code != 0 and "drop --interactive or --json" in r.stderr


def test_at_60_columns_every_column_and_whole_names_are_shown(cmp_runs, tmp_path):
    names = ["tinyshakespeare-transformer-char", "tinyshakespeare-transformer-bpe"]  # as `charlm train` names runs
    cks = [checkpoint.load(cmp_runs[key]) for key in ("tf", "bpe")]
    for ck, name in zip(cks, names):
        ck.saved.run_name = name
    for width in (60, 44):
        console = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
        watch_and_show(Comparison(cks, SampleConfig(max_tokens=8, seed=1)), console, "the")
        screen = console.file.getvalue().split("\x1b[?25h")[-1]  # what is left after the live panels
        lines = screen.splitlines()
        for name in names:
            assert name in lines, (width, screen)  # each name whole, on its own line
        for col in ("params", "steps", "trained", "val bpc", "tok/s", "chars/s", "TTFT"):
            assert screen.count(col + " ") >= 2, (col, screen)  # every column, for every model
        assert all(len(line) <= width for line in lines)
        notes = " ".join(line.strip() for line in lines if line.strip() and not line.startswith(" "))
        assert (
            "timings only beyond their noise: a rate when its slowest quarter of the run beats every other's" in notes
        )


def test_a_prompt_one_char_model_cannot_encode_is_noted_for_that_model_only(cmp_runs, tmp_path):
    r = cli("compare", cmp_runs["lstm"], cmp_runs["bpe"], "--prompt", "the café", "-n", "5", "--seed", "1")
    assert r.exit_code == 0, r.output
    got = blocks(r.stdout)
    assert "never saw: 'é'" in got["cmp-lstm"] and "\n" not in got["cmp-lstm"]
    assert got["cmp-bpe"].startswith("the café")
    assert table_rows(r.stdout)["cmp-lstm"][-2:] == ["—", "—"]  # no tokens/s, no TTFT
    dropped = cli("compare", cmp_runs["lstm"], cmp_runs["bpe"], "--prompt", "the café", "-n", "5", "--unknown", "drop")
    assert blocks(dropped.stdout)["cmp-lstm"].startswith("the caf")
    # an eval file a char model cannot read: a dash and a note for it, a number for the BPE model
    (tmp_path / "accents.txt").write_text("the café sat on the mat\n", encoding="utf-8")
    r = cli("compare", cmp_runs["lstm"], cmp_runs["bpe"], "-n", "3", "--eval", tmp_path / "accents.txt")
    assert r.exit_code == 0, r.output
    rows = table_rows(r.stdout)
    assert rows["cmp-lstm"][4] == "—" and float(rows["cmp-bpe"][4].rstrip("*")) > 0
    assert "cmp-lstm: " in r.stdout and "never saw: 'é'" in r.stdout


def test_model_text_is_never_markup_and_control_characters_are_escaped(cmp_runs):
    prompt = "[bold red]x[/] \x1b[31m \x07 "
    r = cli("compare", cmp_runs["bpe"], cmp_runs["bpe"], "--prompt", prompt, "-n", "3", "--seed", "1")
    assert r.exit_code == 0, r.output
    assert "[bold red]x[/] \\x1b[31m \\x07 " in r.stdout and "\x1b" not in r.stdout and "\x07" not in r.stdout
    console = Console(file=io.StringIO(), force_terminal=True, width=120, color_system="truecolor")
    ck = checkpoint.load(cmp_runs["bpe"])
    watch_and_show(Comparison([ck, ck], SampleConfig(max_tokens=3, seed=1)), console, prompt)
    screen = console.file.getvalue()
    assert "[bold red]x[/]" in screen and "\\x1b[31m" in screen and "\x07" not in screen
    assert "\x1b[31m " not in screen  # the prompt's escape never reaches the terminal raw


def test_models_grow_together_one_step_each_per_tick(cmp_runs):
    cks = [checkpoint.load(cmp_runs["lstm"]), checkpoint.load(cmp_runs["tf"])]
    comparison = Comparison(cks, SampleConfig(max_tokens=12, seed=3))
    counts = []
    comparison.run("the", on_tick=lambda: counts.append([p.tokens for p in comparison.players]))
    assert counts[:12] == [[n, n] for n in range(1, 13)]  # char models: one token per step


def test_side_by_side_on_a_wide_terminal_stacked_on_a_narrow_one(cmp_runs):
    cks = [checkpoint.load(cmp_runs["lstm"]), checkpoint.load(cmp_runs["tf"])]
    for width, side_by_side in ((120, True), (70, False)):
        console = Console(file=io.StringIO(), force_terminal=True, width=width)
        watch_and_show(Comparison(cks, SampleConfig(max_tokens=8, seed=1)), console, "the")
        lines = console.file.getvalue().splitlines()
        both = [ln for ln in lines if "cmp-lstm" in ln and "cmp-tf" in ln]
        assert bool(both) == side_by_side, width
        assert any("lstm · char · " in ln for ln in lines) and any("transformer · char · " in ln for ln in lines)


def test_user_errors_are_one_line_and_name_the_checkpoint(cmp_runs, tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint at all")
    cases = [
        (("compare", cmp_runs["lstm"], tmp_path / "missing"), ["no such checkpoint", "missing"]),
        (("compare", cmp_runs["lstm"], broken), ["broken.pt", "charlm checkpoint"]),
        (("compare", cmp_runs["lstm"]), ["at least two"]),
        (("compare", cmp_runs["lstm"], cmp_runs["tf"], "--top-p", "2"), ["--top-p"]),
        (("compare", cmp_runs["lstm"], cmp_runs["tf"], "--eval", tmp_path / "nope.txt"), ["no such file", "nope.txt"]),
    ]
    for args, words in cases:
        r = cli(*args)
        assert r.exit_code != 0 and "Traceback" not in r.output, args
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, r.stderr)
        assert all(w in lines[0] for w in words), (args, lines[0])


def test_interactive_reads_prompts_from_a_pipe_until_eof(cmp_runs):
    r = CliRunner().invoke(
        main,
        ["compare", str(cmp_runs["lstm"]), str(cmp_runs["tf"]), "--interactive", "-n", "5", "--seed", "2"],
        input="the cat\n/bogus\n\nthe dog\n",
    )
    assert r.exit_code == 0, r.output
    assert r.stdout.count("== cmp-lstm") == 2 and r.stdout.count("== cmp-tf") == 2
    assert "the cat" in r.stdout and "the dog" in r.stdout
    assert "unknown command /bogus" in r.stderr and "unknown command" not in r.stdout  # hints: stderr, as in chat


def test_interactive_in_a_real_terminal(cmp_runs, tmp_path):
    child = charlm_pty(
        tmp_path, "compare", cmp_runs["lstm"], cmp_runs["bpe"], "-i", "-n", "8", "--seed", "5", size=(120, 40)
    )
    try:
        child.expect(">>> ")
        child.sendline("the cat")
        child.expect("tok/s")  # the table after the panels
        screen = child.before
        child.expect(">>> ")
        assert "cmp-lstm" in screen and "cmp-bpe" in screen and "lstm · char" in screen
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    # Ctrl-C stops a long generation and returns to the prompt; Ctrl-C at an empty prompt says how to leave
    child = charlm_pty(tmp_path, "compare", cmp_runs["lstm"], cmp_runs["tf"], "-i", "-n", "1000000", size=(120, 40))
    try:
        child.expect(">>> ")
        child.sendline("the")
        child.expect("cmp-tf")  # the panels are streaming
        child.sendintr()
        child.expect("stopped")
        child.expect(">>> ")
        child.sendintr()
        child.expect_exact("Ctrl-D or /bye leaves")
        child.expect(">>> ")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    # and Ctrl-D leaves too
    child = charlm_pty(tmp_path, "compare", cmp_runs["lstm"], cmp_runs["tf"], "-i", size=(120, 40))
    try:
        child.expect(">>> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def compare_pty(cmp_runs, tmp_path, *args) -> pexpect.spawn:
    child = charlm_pty(tmp_path, "compare", cmp_runs["lstm"], cmp_runs["tf"], "-i", *args, size=(120, 40))
    child.expect_exact(">>> ")
    return child


def ask(child: pexpect.spawn, line: str) -> str:
    child.sendline(line)
    child.expect_exact(">>> ")
    return strip_ansi(child.before)


def test_interactive_set_changes_the_next_prompts_settings_and_is_not_sent_as_a_prompt(cmp_runs, tmp_path):
    child = compare_pty(cmp_runs, tmp_path, "-n", "4", "--seed", "5")
    try:
        screen = ask(child, "/set temperature 0")
        assert "temperature = 0.0" in screen and "tok/s" not in screen  # a setting, not a prompt for the models
        assert "seed = 9" in ask(child, "/set seed 9")
        assert "bad value for top_p" in ask(child, "/set top_p 2")
        caption = " ".join(ask(child, "the cat").split())  # the table's caption (wrapped): the settings this run used
        assert "seed 9 · temperature 0 best of each column" in caption and "chars/s" in caption
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_interactive_help_lists_the_shared_commands_and_chat_only_ones_get_a_hint(cmp_runs, tmp_path):
    child = compare_pty(cmp_runs, tmp_path)
    try:
        screen = ask(child, "/help")
        assert "/set KEY VALUE: temperature" in screen and "/bye" in screen and '"""' in screen
        assert "/attn" not in screen and "/mode" not in screen
        for command in ("/attn", "/gates 0", "/mode continue", "/load x", "/clear"):
            screen = ask(child, command)
            assert "works on one model's running text: use it in 'charlm chat CKPT'" in screen, command
            assert "tok/s" not in screen and "Traceback" not in screen
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_json_with_an_eval_file_a_model_cannot_read_prints_only_json(cmp_runs, tmp_path):
    """Found in the one-call rework: the note for a model that cannot score the --eval file went to stdout, before
    the JSON, so `compare --json --eval` printed no valid JSON; the note is in the JSON (eval_note)."""
    (tmp_path / "accents.txt").write_text("the café sat on the mat\n", encoding="utf-8")
    r = cli("compare", cmp_runs["lstm"], cmp_runs["bpe"], "-n", "3", "--eval", tmp_path / "accents.txt", "--json")
    assert r.exit_code == 0, r.output
    lstm, bpe = json.loads(r.stdout)["models"]
    assert "never saw: 'é'" in lstm["eval_note"] and lstm["eval_bpc"] is None and bpe["eval_bpc"] > 0


def test_compare_labels_best_and_last_of_one_run_apart(gen_runs):
    """Regression (item 22): `compare runs/x/best.pt runs/x/last.pt` labelled both rows by the run's name only."""
    run = gen_runs["tf"]
    r = cli("compare", run / BEST, run / LAST, "-n", "3", "-p", "RO", "--seed", "0")
    assert r.exit_code == 0, r.output
    assert f"{run.name} ({BEST})" in r.output and f"{run.name} ({LAST})" in r.output


def test_compare_of_char_and_bpe_writes_texts_as_long_and_says_what_n_counts(cmp_runs):
    """Found: -n counts tokens, so compare of a char and a BPE model showed panels of very different lengths. When
    the models' tokens differ, -n counts characters (compare --help and the notes say so); otherwise tokens."""
    import json

    mixed = json.loads(cli("compare", cmp_runs["tf"], cmp_runs["bpe"], "-p", "the cat", "-n", "20", "--json").stdout)
    assert [m["chars"] for m in mixed["models"]] == [20, 20] and mixed["max_tokens_counts"] == "characters"
    tf, bpe = mixed["models"]
    assert tf["tokens"] == 20 and bpe["tokens"] < 20  # a BPE token holds several characters
    r = cli("compare", cmp_runs["tf"], cmp_runs["bpe"], "-p", "the cat", "-n", "20", "--seed", "1")
    notes = " ".join(r.stdout.split())
    assert "--max-tokens 20 counts characters here (the models' tokens differ in size)" in notes
    same = cli("compare", cmp_runs["tf"], cmp_runs["lstm"], "-p", "the cat", "-n", "20", "--seed", "1", "--json")
    assert json.loads(same.stdout)["max_tokens_counts"] == "tokens" and "counts" not in same.stderr
    assert "--max-tokens counts characters" in " ".join(cli("compare", "--help").stdout.split())
