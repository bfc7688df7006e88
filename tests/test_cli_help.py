"""First contact (issue 13, part 1): bare `charlm` is the help; every --help groups its options, gives
each a line and ends with examples; a missing checkpoint shows the usage line and the runs there are;
`sample --stats` on a terminal starts its JSON on a line of its own."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil

import click
import pytest
from click.testing import CliRunner
from conftest import charlm_pty, cli, one_line_error

from charlm.cli import main
from charlm.presets import PRESET_TABLE
from charlm.storage.checkpoint import LAST

COMMANDS = sorted(main.commands)


def charlm(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="charlm")


def test_bare_charlm_prints_the_help_and_succeeds():
    r = charlm()
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout.startswith("Usage: charlm") and "error" not in r.stdout
    assert "charlm train corpora/tinyshakespeare.txt" in r.stdout  # where to start


def test_command_list_keeps_each_description_whole():
    """Click's list cut descriptions at ~45 characters ("…heat..."); each first sentence now wraps whole."""
    out = charlm("--help").stdout
    listing = " ".join(out.split("Commands:")[1].split())
    assert "..." not in listing
    for name in COMMANDS:
        command = main.commands[name]
        summary = " ".join((command.short_help or command.help.split("\n\n")[0].split(". ")[0]).split())
        assert f"{name} {summary}" in listing, name
    assert (
        "attn Show a transformer's attention on a text (PROMPT, --prompt, --prompt-file or stdin) as terminal heat maps "
        "(by default: the last layer, mean over heads)." in listing
    )


@pytest.mark.parametrize("name", COMMANDS)
def test_every_help_has_examples_and_a_line_for_every_option(name):
    r = charlm(name, "--help")
    assert r.exit_code == 0
    examples = r.stdout.split("Examples:\n", 1)[1]
    commands = [line.strip() for line in examples.splitlines() if line.strip().startswith("charlm ")]
    assert commands and all(c.startswith(f"charlm {name}") for c in commands), examples
    for param in main.commands[name].params:
        if isinstance(param, click.Option):
            assert param.help and param.help.strip(), (name, param.name)
            assert param.opts[0] in r.stdout, (name, param.opts[0])
    # textwrap's default breaks words at hyphens: "--max-" at a line's end and "time" on the next
    assert not [line for line in r.stdout.splitlines() if re.search(r"\w-$", line)], r.stdout


def test_every_example_uses_real_flags_and_parses():
    """examples.txt drifts from the code unless checked: each example's command parses its own line (no run
    happens: --help is appended), and every --flag in it is one of that command's options."""
    from charlm.flags import examples

    for name in COMMANDS:
        for what, line in examples(name):
            words = shlex.split(line.split("|")[-1].split(">")[0])
            args = words[words.index("charlm") + 1 :]
            options = {o for p in main.commands[name].params for o in p.opts + p.secondary_opts}
            flags = {w.split("=")[0] for w in args if w.startswith("-") and not w[1:2].isdigit()}
            assert flags <= options, (name, line)
            assert what and charlm(*args, "--help").exit_code == 0, line


def test_train_help_groups_its_options_and_explains_the_presets():
    out = charlm("train", "--help").stdout
    headings = [line for line in out.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert headings[:4] == ["Model:", "Data:", "Optimisation:", "Run:"]

    def section(title: str) -> str:
        return out.split(f"\n{title}:\n")[1].split("\n\n")[0]

    assert "--d-model" in section("Model") and "--dropout" in section("Model") and "--lr" not in section("Model")
    assert "--tokenizer" in section("Data") and "--vocab-size" in section("Data")
    assert "--lr " in section("Optimisation") and "--weight-decay" in section("Optimisation")
    assert "--max-time" in section("Run") and "--seed" in section("Run") and "--device" in section("Run")
    presets = " ".join(out.split("Presets")[1].split("Examples:")[0].split())
    for name in ("tiny", "small", "medium"):
        tf, rnn = PRESET_TABLE["transformer"][name], PRESET_TABLE["lstm"][name]
        qk = ", QK-norm" * tf["qk_norm"] + ", smear" * tf["smear"] + ", untied head" * (not tf["tied"])
        assert (
            f"{name} for" in presets
            and f"transformer {tf['n_layers']} layers × {tf['d_model']}, {tf['n_heads']} heads, MLP ×{tf['mlp_ratio']}"
            f"{qk}, context {tf['context']}"
            in presets
            and f"lstm/gru {rnn['n_layers']} layers × {rnn['d_model']}" in presets
        )
    assert "the default on CPU" in presets and "the default on CUDA" in presets


def test_missing_checkpoint_shows_usage_and_lists_the_runs(gen_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = charlm("chat")
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "Usage: charlm chat [OPTIONS] CKPT"
    assert lines[1].startswith("error: missing CKPT") and "no runs in checkpoints/ yet" in lines[1]
    for name in ("tf", "lstm"):  # two real runs, the LSTM newer
        shutil.copytree(gen_runs[name], tmp_path / "checkpoints" / f"shakespeare-{name}")
    os.utime(tmp_path / "checkpoints" / "shakespeare-tf" / LAST, (1e9, 1e9))
    for command in ("chat", "sample", "info"):
        r = charlm(command)
        assert r.exit_code == 2 and "Traceback" not in r.output
        lines = r.stderr.strip().splitlines()
        assert lines[0].startswith(f"Usage: charlm {command} [OPTIONS] CKPT")  # (sample: then [PROMPT])
        assert lines[1].startswith("error: missing CKPT") and "charlm runs" in lines[1]
        assert [line.strip() for line in lines[2:]] == ["checkpoints/shakespeare-lstm", "checkpoints/shakespeare-tf"]


def test_sample_stats_on_a_terminal_starts_on_its_own_line(gen_runs, tmp_path):
    """Regression: the text's last newline sat in the stream buffer while the stats went to stderr,
    so a terminal showed `…To fi{"tokens": …`."""
    for _ in range(3):  # the buffer's flush depends on timing: try it more than once
        child = charlm_pty(tmp_path, "sample", gen_runs["tf"], "-p", "ROMEO:", "-n", "40", "--seed", "1", "--stats")
        out = child.read()
        child.close()
        assert child.exitstatus == 0, out
        stats = re.search(r"(^|\r\n)(\{\"tokens\".*\})\r\n", out)
        assert stats, repr(out)
        assert json.loads(stats.group(2))["tokens"] == 40


@pytest.mark.parametrize("width", [60, 80, 120])
def test_every_help_fits_its_terminal_and_examples_fold_between_words(width):
    """Issue 37: examples were written verbatim, so at 80 columns the terminal broke a long command line
    mid-token. Each now folds at its own spaces with the shell's " \\" and a copy of the lines runs the same
    command."""
    from charlm.flags import examples

    for name in COMMANDS:
        r = CliRunner().invoke(main, [name, "--help"], prog_name="charlm", terminal_width=width)
        assert r.exit_code == 0
        assert max(len(line) for line in r.stdout.splitlines()) <= width, (name, width)
        shown = r.stdout.split("Examples:\n", 1)[1]
        joined = re.sub(r" \\\n\s+", " ", shown)  # what the shell reads
        for _, line in examples(name):
            assert f"  {line}\n" in joined, (name, line)


def test_chat_help_lists_the_words_of_the_repl():
    """Issue 37: `charlm help chat` did not list the REPL's / words."""
    from charlm.commands.words import CHAT_COMMANDS

    for args in (["help", "chat"], ["chat", "--help"]):
        out = charlm(*args).stdout
        inside = out.split("Inside the chat", 1)[1].split("Examples:")[0]
        for word in [*CHAT_COMMANDS, "/attn", "/set", "Ctrl-C"]:
            assert re.search(rf"^  {re.escape(word)}\s", inside, re.M), word


def test_help_command_and_dash_v():
    """Found: `charlm help train` -> "No such command"; `charlm -V` -> "No such option"."""
    r = cli("help", "train")
    assert r.exit_code == 0 and r.stdout == cli("train", "--help").stdout
    assert cli("help").stdout == cli("--help").stdout
    assert cli("-V").exit_code == 0 and cli("-V").stdout == cli("--version").stdout
    one_line_error(cli("help", "trian"), "No such command", "train", code=2)


def test_compare_prompt_help_says_its_default_once():
    """Found: compare -p's help said `[default: none]. [default: ""]`."""
    out = " ".join(cli("compare", "--help").stdout.split())
    assert "[default: none]." in out and '[default: ""]' not in out


def test_sample_attn_and_gates_print_json(view_runs):
    """Found: --json was missing for sample, attn and gates (eval, compare, lab and runs have it)."""
    import json

    r = cli("sample", view_runs["tf"], "ROMEO:", "-n", "12", "--seed", "4", "--num-samples", "2", "--json")
    got = json.loads(r.stdout)
    plain = cli("sample", view_runs["tf"], "ROMEO:", "-n", "12", "--seed", "4", "--num-samples", "2").stdout
    assert got["prompt"] == "ROMEO:" and [s["tokens"] for s in got["samples"]] == [12, 12]
    assert plain == "".join(f"ROMEO:{s['text']}\n" + ("---\n" if i == 0 else "") for i, s in enumerate(got["samples"]))

    att = json.loads(cli("attn", view_runs["tf"], "ROMEO: But", "--json").stdout)
    assert "".join(att["tokens"]) == "ROMEO: But" and len(att["weights"]) == len(att["tokens"])
    for row in att["weights"]:  # each query's weights over the tokens it could see sum to 1
        assert sum(row) == pytest.approx(1, abs=1e-3)
    assert len(att["heads"]) == 2 * 2  # 2 layers × 2 heads

    g = json.loads(cli("gates", view_runs["lstm"], "ROMEO: But", "--units", "3", "--json").stdout)
    assert len(g["units"]) == 3 and set(g["values"]) >= {"forget", "input", "output", "cell_state"}
    for name in ("forget", "input", "output"):  # sigmoids: between 0 and 1
        assert all(0 <= v <= 1 for unit in g["values"][name] for v in unit)
        assert all(len(unit) == len(g["tokens"]) for unit in g["values"][name])
