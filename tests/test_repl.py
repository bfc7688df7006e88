"""`charlm chat` driven through a real pseudo-terminal (pexpect), and with piped stdin."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pexpect
import pytest
from conftest import (
    charlm_pty,
    cli,
    strip_ansi,
)
from rich.console import Console

from charlm.generate import SampleConfig, Streamer
from charlm.settings import unescape
from charlm.storage import checkpoint
from charlm.views.repl import CLEAR_MARK, CLEAR_SCREEN
from charlm.views.text import safe_text

MEMORISED = "But soft, what light through yonder window breaks?"
VISIBLE_ESCAPES = r"[bold]red[/bold] \x1b]0;pwned\x07 \x1b[31mred\x1b[0m"


NO_CACHE = {"CHARLM_CACHE": None}  # the history must follow XDG_CACHE_HOME


def env(tmp_path) -> dict:
    """The environment of a piped chat: no CHARLM_CACHE, so that the history follows XDG_CACHE_HOME."""
    e = {k: v for k, v in os.environ.items() if k != "CHARLM_CACHE"}
    return e | {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TERM": "xterm-256color", "PYTHONIOENCODING": "utf-8"}


def spawn(run, tmp_path, *args) -> pexpect.spawn:
    child = charlm_pty(tmp_path, "chat", run, *args, size=(220, 50), env=NO_CACHE)
    child.expect_exact(">>> ")
    return child


def say(child: pexpect.spawn, line: str, raw: bool = False) -> str:
    """Type a line, wait for the next prompt, return what the screen showed in between (without the
    terminal's styling codes and carriage returns, unless raw)."""
    child.sendline(line)
    child.expect_exact(">>> ")
    return child.before if raw else plain(child.before)


def plain(screen: str) -> str:
    return strip_ansi(screen)


def start(chat_pty, run, *args) -> pexpect.spawn:
    child = chat_pty(run, *args)
    child.expect_exact(">>> ")
    return child


def leave(child: pexpect.spawn) -> None:
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before


def test_a_prompt_streams_the_model_text_safely_then_a_status_line(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--seed", "1")
    assert "temperature = 0" in say(child, "/set temperature 0")
    raw = say(child, "window breaks?", raw=True)
    assert (
        "\x1b]" not in raw and "\x07" not in raw and "\x1b[31m" not in raw
    )  # the model's escapes never reach the terminal
    screen = plain(raw)
    assert "[bold]red[/bold]" in screen  # markup shown literally, never applied
    assert VISIBLE_ESCAPES in screen  # escapes shown as visible text
    assert re.search(
        r"200 tokens · [\d,]+ tokens/s · first token \d+ ms · context: the last 48 of 2\d\d tokens", screen
    )
    leave(child)


def test_show_lists_the_settings_and_reset_empties_the_running_text(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--seed", "1", "--temperature", "0", "--max-tokens", "5")
    say(child, "ROMEO:")
    screen = say(child, "/show")
    for row in ("temperature", "0.0", "max_tokens", "5", "seed", "1", "transformer (1 layer × 48", "mode", "fresh"):
        assert row in screen
    assert re.search(r"running text\s+11 tokens", screen)  # 6 prompt tokens + 5 new ones
    assert "empty" in say(child, "/reset")
    assert re.search(r"running text\s+0 tokens", say(child, "/show"))
    leave(child)


def test_bad_commands_and_values_get_a_one_line_hint_and_the_repl_goes_on(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"])
    for line, hint in (
        ("/bogus", "unknown command /bogus"),
        ("/set temperature warm", "bad value for temperature"),
        ("/set top_p 2", "top-p must be in (0, 1]"),
        ("/set colour red", "usage: /set KEY VALUE"),
        ("/mode sideways", "/mode fresh or /mode continue"),
        ("/gates", "has no gates"),
        ("/attn", "no text yet"),
    ):
        screen = say(child, line)
        assert hint in " ".join(screen.split()) and "Traceback" not in screen
        # the echoed command + one hint (wrapped at a space where it is longer than the terminal's 100 columns)
        lines = [l for l in screen.splitlines() if l.strip()]
        assert len(lines) == 2 or len(lines) == 3 and len(lines[1]) > 80, screen
    assert "temperature = 0.5" in say(child, "/set temperature 0.5")  # still alive
    leave(child)


def test_continue_mode_carries_the_running_text_into_the_next_prompt_and_the_viewer(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--temperature", "0", "--max-tokens", "20")
    say(child, "/mode continue")
    first = say(child, "ROMEO:")
    assert MEMORISED[:19] in first
    assert "context 26/48" in first  # 6 prompt tokens + 20 new ones
    screen = say(child, "/attn")
    assert "tokens 0..25 of 26" in screen and "Traceback" not in screen  # the viewer got the running text
    assert "context 46/48" in say(child, "")  # Enter alone goes on from the running text
    leave(child)


def test_triple_quotes_make_a_multi_line_prompt(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--temperature", "0", "--max-tokens", "20")
    child.sendline('"""')
    child.expect_exact("... ")
    child.sendline("JULIET:")
    child.expect_exact("... ")
    child.sendline('O Romeo"""')
    child.expect_exact(">>> ")
    assert "Romeo! wherefore" in plain(child.before)
    leave(child)


def test_tab_completes_a_command(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"])
    child.send("/sh\t")  # "/sh" + Tab completes to "/show "
    child.expect_exact("/show ")
    child.sendline("")
    child.expect_exact(">>> ")
    assert "max_tokens" in plain(child.before)
    leave(child)


def test_save_writes_the_raw_transcript(gen_runs, chat_pty, tmp_path):
    child = start(chat_pty, gen_runs["tf"], "--temperature", "0", "--max-tokens", "60")
    say(child, "window breaks?")
    say(child, "ROMEO:")
    transcript = tmp_path / "talk.txt"
    assert "saved 2 turns" in say(child, f"/save {transcript}")
    saved = transcript.read_text(encoding="utf-8")
    assert saved.startswith(">>> window breaks?\nwindow breaks?\n[bold]red[/bold] \x1b]0;pwned\x07")  # the raw text
    assert "\n>>> ROMEO:\nROMEO:\nBut soft" in saved
    leave(child)


def test_ctrl_c_stops_a_long_generation_and_the_repl_goes_on(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--temperature", "0", "--max-tokens", "100000000")
    child.sendline("ROMEO:")
    child.expect_exact("wherefore")
    child.sendintr()
    child.expect(r"stopped · [\d,]+ tokens")
    child.expect_exact(">>> ")
    assert "Traceback" not in child.before
    assert "temperature = 0.5" in say(child, "/set temperature 0.5")
    leave(child)


def test_ctrl_c_drops_a_half_typed_line_and_ctrl_d_leaves_keeping_the_history(gen_runs, tmp_path):
    child = spawn(gen_runs["tf"], tmp_path, "--max-tokens", "5")  # not chat_pty: the history must follow XDG_CACHE_HOME
    say(child, "/set temperature 0")
    say(child, "ROMEO:")
    child.send("half a lin")
    child.expect_exact("half a lin")
    child.sendintr()
    child.expect_exact(">>> ")
    assert "temperature = 0.5" in say(child, "/set temperature 0.5")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    history = (tmp_path / "xdg" / "charlm" / "chat_history").read_text()
    assert "/set temperature 0" in history and "ROMEO:" in history and "half a lin" not in history


def test_ctrl_c_twice_stops_the_reply_then_says_how_to_leave_and_keeps_the_session(gen_runs, chat_pty):
    """Regression (issue 13): the second Ctrl-C, at the empty prompt, quit and lost the running text and settings."""
    child = start(chat_pty, gen_runs["tf"], "--max-tokens", "100000000")
    say(child, "/set temperature 0")
    say(child, "/mode continue")
    child.sendline("ROMEO:")
    child.expect_exact("wherefore")
    child.sendintr()  # one: stops the reply
    child.expect(r"stopped · [\d,]+ tokens")
    child.expect_exact(">>> ")
    child.sendintr()  # two, at the empty prompt: a hint, and the same prompt again
    child.expect_exact("Ctrl-D or /bye leaves")
    child.expect_exact(">>> ")
    screen = say(child, "/show")
    assert re.search(r"temperature\s+0\.0", screen) and re.search(r"mode\s+continue", screen)
    assert not re.search(r"running text\s+0 tokens", screen)  # the text is still there
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before


def test_a_bracketed_paste_of_several_lines_is_one_prompt(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--temperature", "0", "--max-tokens", "20")
    child.send("\x1b[200~JULIET:\nO Romeo\x1b[201~")  # what a terminal sends for a pasted "JULIET:\nO Romeo"
    child.send("\r")
    child.expect_exact(">>> ")
    assert child.before.endswith("\x1b[?2004h")  # the terminal is asked to bracket pastes (CPython turns it off)
    screen = plain(child.before)
    assert screen.count("tokens/s") == 1  # one reply, not one per pasted line
    assert "JULIET:\nO Romeo, Romeo! wherefore" in screen  # the model continued both lines together
    assert "unknown command" not in screen
    leave(child)


def test_ollama_habits_bye_clear_set_parameter_and_question_mark(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--max-tokens", "5", "--mode", "continue")
    assert "temperature = 0.5" in say(child, "/set parameter temperature 0.5")
    assert "/load CKPT" in say(child, "/?") and "/bye" in say(child, "/?")
    say(child, "ROMEO:")
    assert "empty" in say(child, "/clear")
    assert re.search(r"running text\s+0 tokens", say(child, "/show"))
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before


def test_load_switches_the_model_and_keeps_the_settings(gen_runs, chat_pty, tmp_path):
    child = start(chat_pty, gen_runs["tf"], "--max-tokens", "5")
    say(child, "/set temperature 0")
    say(child, "ROMEO:")
    screen = " ".join(say(child, f"/load {tmp_path / 'nothing'}").split())  # (a long hint wraps at a space)
    assert "no such checkpoint" in screen and f"still talking to {gen_runs['tf'].name}" in screen
    screen = say(child, f"/load {gen_runs['lstm']}")
    assert f"loaded {gen_runs['lstm'].name} (lstm" in screen
    screen = say(child, "/show")
    assert "lstm (1 layer × 48" in screen and re.search(r"temperature\s+0\.0", screen)
    assert re.search(r"running text\s+0 tokens", screen)
    assert "state after 6 tokens (no context limit)" in say(child, "R")  # the LSTM answers now
    leave(child)


def test_the_prompt_is_shown_as_the_model_got_it(gen_runs, chat_pty):
    child = start(chat_pty, gen_runs["tf"], "--temperature", "0", "--max-tokens", "3", "--unknown", "drop")
    screen = say(child, "ROMüEO:")
    assert "dropped 1 character the model never saw: 'ü'" in screen
    echoed = screen.split("'ü'", 1)[1]  # after the hint: the prompt the model got, then its reply
    assert "ROMEO:" in echoed and "ROMüEO" not in echoed
    leave(child)


def chat_piped(run, tmp_path, lines: list[str], *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "charlm", "chat", str(run), *args],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env(tmp_path),
        timeout=120,
    )


def test_piped_stdin_is_scriptable(gen_runs, tmp_path):
    """Each line a prompt; stdout holds only the continuations (one per prompt, plain, no styling),
    hints go to stderr; unknown characters get a one-line warning and are dropped."""
    out = chat_piped(
        gen_runs["tf"],
        tmp_path,
        [
            "/set temperature 0",
            "/set max_tokens 51",
            "ROMEO:",
            "/bogus",
            "window breaks?",
            "ROMEO:ü",
            "/set stop t, w",
            "ROMEO:",
            '"""/bogus"""',
            "/quit",
            "never read",
        ],
        "--unknown",
        "drop",
    )
    assert out.returncode == 0
    ck = checkpoint.load(gen_runs["tf"])  # the library's greedy continuation of "/bogus", shown safely
    fenced_bogus = safe_text(
        Streamer(ck.model, ck.tokenizer).complete(
            ck.tokenizer.encode("/bogus"), SampleConfig(temperature=0, max_tokens=51)
        )
    )
    # each continuation (51 tokens, starting with the newline after the prompt), then one newline
    assert out.stdout == (
        f"\n{MEMORISED}\n"
        f"\n{VISIBLE_ESCAPES}\nJULIET:\nO\n"  # styled by nothing, escapes made visible
        f"\n{MEMORISED}\n"  # ROMEO:ü with the ü dropped
        "\nBut sof\n"  # cut at the stop string "t, w"
        f"{fenced_bogus}\n"
    )  # between \"\"\" marks, /bogus is a prompt, not a command
    errors = out.stderr.strip().splitlines()
    assert errors == [
        "temperature = 0.0",
        "max_tokens = 51",
        "unknown command /bogus: /help lists them (text starting with /: a space first)",
        "dropped 1 character the model never saw: 'ü'",
        "stop = 't, w'",
    ]


def test_lstm_has_gates_not_attention(gen_runs, tmp_path):
    out = chat_piped(gen_runs["lstm"], tmp_path, ["/attn", "/set max_tokens 5", "hello", "/gates help"])
    assert out.returncode == 0
    assert "this lstm has no attention; /gates shows its gates" in out.stderr
    help_text = " ".join(out.stdout.split())
    assert "units N How many units" in help_text and "or which: 3,17,42" in help_text  # /gates help: its words
    assert "Traceback" not in out.stderr + out.stdout


def test_help_and_show_print_brackets_literally(gen_runs, tmp_path):
    """Regression: /help lost "[args]" and /show a stop string like "[red]x": plain str table cells
    were parsed as Rich markup."""
    out = chat_piped(gen_runs["lstm"], tmp_path, ["/help", "/set stop [red]x", "/show"])
    assert out.returncode == 0
    assert "/attn [args]" in out.stdout and "'[red]x'" in out.stdout
    assert "lstm (1 layer × 48, context 48)" in out.stdout


def test_unescape():
    assert unescape(r"a\nb\tc\\n") == "a\nb\tc\\n"


def test_ctrl_d_typed_while_chat_loads_leaves_once_it_has_loaded(gen_runs, tmp_path):
    """Issue 28: Ctrl-D typed while `charlm chat` was still loading was lost (the terminal's line discipline ate it,
    and a NUL reached readline), so the chat stayed open; ollama leaves. Type-ahead still waits for the prompt."""
    child = charlm_pty(tmp_path, "chat", gen_runs["tf"], size=(80, 24), env=NO_CACHE)
    child.expect("loading")
    child.sendeof()  # before the banner
    child.expect_exact(">>> ")
    assert "charlm chat · " in plain(child.before)  # the banner, then the prompt, then it leaves
    child.expect(pexpect.EOF, timeout=10)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before


def test_attn_in_chat_shows_the_whole_running_text_and_says_what_the_model_sees(view_runs):
    """Issue 28: /attn counted only the streamer's window (the last `context` tokens), so after 66 tokens it
    numbered them 0-47 and said nothing of the rest; the status line said 66."""
    import io

    from rich.console import Console

    from charlm.commands.chat import Chat

    screen = io.StringIO()
    chat = Chat(
        checkpoint.load(view_runs["tf"]),
        SampleConfig(max_tokens=60, seed=1),
        Console(file=screen, width=120),
        interactive=True,
    )
    chat.handle("ROMEO:")
    assert chat.total == 66 and "context: the last 48 of 66 tokens" in " ".join(screen.getvalue().split())
    screen.seek(0), screen.truncate()
    chat.handle("/attn")
    shown = strip_ansi(screen.getvalue())
    assert "(the model sees the last 48 of 66 tokens)" in shown
    rows = [int(m.group(1)) for m in re.finditer(r"^\s*(\d+) \S", shown, flags=re.M)]
    assert rows and max(rows) == 65, shown  # each row numbered in the whole text


def test_the_status_line_breaks_between_its_parts_on_a_real_terminal(view_runs, tmp_path):
    """Issue 28: at 60 columns the status line wrapped mid-number (`context 42/6⏎4`). In a real terminal of 60×20 and
    80×24 its lines fit (the streamed model text is the terminal's to fold), and each part of the status (a count,
    a speed, what the model sees) stays whole on one line: it broke inside 'context: the last 48 of 127 tokens'
    and 'state after 34 tokens (no context limit)'."""
    cases = [
        ("tf", 100, (60, 20), "context: the last 48 of 127 tokens"),
        ("lstm", 7, (80, 24), "state after 34 tokens"),
    ]
    for run, n, (cols, rows), last in cases:
        child = charlm_pty(tmp_path, "chat", view_runs[run], "-n", n, "--seed", 1, size=(cols, rows), env=NO_CACHE)
        child.expect_exact(">>> ")
        screen = say(child, "ROMEO: But soft, what light").replace("\r", "")
        leave(child)
        lines = screen.split("\n")
        status = lines[lines.index(next(line for line in lines if re.match(r"[\d,]+ tokens · ", line))) :]
        assert all(len(line) <= cols for line in status), screen
        assert re.match(rf"{n} tokens · [\d,]+ tokens/s · first token \d+ ms ·", status[0]), screen
        assert any(last in line for line in status), screen


def test_a_viewer_the_model_cannot_show_names_the_other_only_where_it_has_it(view_runs):
    """Issue 27: /attn on a model without attention always pointed to /gates (and /gates to /attn), which a model
    family with neither capability does not have either."""
    import io

    from rich.console import Console

    from charlm.commands.chat import Chat

    screen = io.StringIO()
    chat = Chat(checkpoint.load(view_runs["lstm"]), SampleConfig(), Console(file=screen, width=200), interactive=True)
    chat.handle("/attn")
    assert "this lstm has no attention; /gates shows its gates" in screen.getvalue()
    screen.seek(0), screen.truncate()
    chat.ckpt.model.capabilities = ()  # a family that shows neither
    chat.handle("/gates")
    chat.handle("/attn")
    assert screen.getvalue().splitlines() == ["this lstm has no gates", "this lstm has no attention"]


def test_set_num_ctx_says_in_one_line_what_the_model_sees(gen_runs):
    """Issue 37: `/set num_ctx 32` (ollama's context length) suggested num_predict. A charlm model's context
    is fixed by its training: the hint says what this model sees, and suggests nothing else."""
    import io

    from rich.console import Console

    from charlm.commands.chat import open_chat

    for kind, says in (("tf", "sees the last 48 tokens"), ("lstm", "reads the whole running text")):
        console = Console(file=io.StringIO(), width=200)
        chat = open_chat(str(gen_runs[kind]), SampleConfig(), console=console, interactive=True)
        for line in ("/set num_ctx 32", "/set parameter num_ctx 32"):
            chat.handle(line)
        out = console.file.getvalue()
        lines = out.strip().splitlines()
        assert len(lines) == 2 and all(line.startswith("num_ctx: ") and says in line for line in lines), out
        assert "num_predict" not in out and chat.settings == SampleConfig()


@pytest.mark.parametrize("term", ["xterm-256color", None])
def test_ctrl_l_clears_the_screen_and_keeps_the_line(gen_runs, tmp_path, term):
    """Issue 37: Ctrl-L printed a new blank prompt and cleared nothing where TERM says nothing of clearing
    (unset or dumb: readline's clear-screen needs it). It now clears the screen, draws the prompt at its top
    with the half-typed line, and that line is not in the history."""
    child = charlm_pty(tmp_path, "chat", gen_runs["tf"], size=(80, 24), env={**NO_CACHE, "TERM": term})
    child.expect_exact(">>> ")
    child.send("/sh\x0c")
    child.expect_exact(CLEAR_SCREEN)  # the screen cleared ...
    child.expect_exact(">>> /sh")  # ... then the prompt at its top, with what was typed
    child.send("ow\r")  # the line given back is the line sent
    child.expect_exact(">>> ")
    assert "temperature" in plain(child.before) and "unknown command" not in plain(child.before)
    child.sendeof()
    child.expect(pexpect.EOF)
    history = (tmp_path / "xdg" / "charlm" / "chat_history").read_text(encoding="utf-8")
    assert "/show" in history and CLEAR_MARK not in history


def test_chat_save_onto_a_fifo_is_refused(gen_runs, tmp_path):
    import os
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = cli("chat", gen_runs["lstm"], "-n", "2", input=f"/save {fifo}\n")
    assert "not a regular file" in r.output, r.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_keys_typed_while_chat_loads_wait_for_the_prompt(view_runs, tmp_path):
    """Found: `hellocharlm chat · …`: keys typed before the banner printed above it."""
    child = charlm_pty(tmp_path, "chat", view_runs["tf"], "-n", "3", size=(80, 24))
    child.expect("loading")
    child.send("hello")  # while the model loads
    child.expect_exact(">>> ")
    assert "hello" not in strip_ansi(child.before)  # not above the banner
    child.expect_exact("hello")  # readline shows it at the prompt
    child.sendline("")
    child.expect_exact(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_ctrl_c_leaves_no_caret_c_inside_the_model_text(view_runs, tmp_path):
    """Found: `AUMENI^CUS:`: the terminal echoed ^C into the streamed text."""
    child = charlm_pty(tmp_path, "chat", view_runs["tf"], "-n", "100000000", "--seed", "1", size=(120, 40))
    child.expect_exact(">>> ")
    child.sendline("ROMEO:")
    child.expect("[a-z]{3}")  # it is streaming
    child.sendintr()
    child.expect(r"stopped · [\d,]+ tokens")
    assert "^C" not in child.before
    child.expect_exact(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)


@pytest.fixture
def chat_session(view_runs):
    """A Chat on the char Transformer, drawing into a string; said(line) -> what it printed."""
    from charlm.commands.chat import Chat
    from charlm.config import SampleConfig
    from charlm.storage import checkpoint

    screen = io.StringIO()
    session = Chat(checkpoint.load(view_runs["tf"]), SampleConfig(), Console(file=screen, width=200), interactive=True)

    def said(line: str) -> str:
        screen.seek(0), screen.truncate()
        session.handle(line)
        return screen.getvalue()

    said.session = session
    return said


@pytest.mark.parametrize(
    "line,setting,value",
    [
        ("/set num_predict 50", "max_tokens", 50),
        ("/set parameter num_predict 50", "max_tokens", 50),
        ("/set repeat_penalty 1.1", "repetition_penalty", 1.1),
        ("/set temp 0.5", "temperature", 0.5),
        ("/set parameter temperature 0.3", "temperature", 0.3),
        ('/set stop "\\n"', "stop", ["\n"]),
        ("/set stop '\\n\\n'", "stop", ["\n\n"]),
        ('/set parameter stop "ROMEO:"', "stop", ["ROMEO:"]),
    ],
)
def test_set_takes_ollamas_words_and_quoted_values(chat_session, line, setting, value):
    """Found: /set num_predict 50, repeat_penalty, temp and /set parameter num_predict all got the same usage line;
    /set stop "\\n" kept the quotes (stop = '"\\n"')."""
    chat_session(line)
    assert getattr(chat_session.session.settings, setting) == value


@pytest.mark.parametrize(
    "line,meant",
    [
        ("/set temprature 0.5", "temperature"),
        ("/set repetiton_penalty 1.2", "repetition_penalty"),
        ("/shwo", "/show"),
        ("/mode contineu", "continue"),
        ("/attn overveiw", "overview"),
        ("/gates", None),  # a transformer has none: says which viewer it has
    ],
)
def test_every_repl_word_mistyped_says_what_it_may_have_meant(chat_session, line, meant):
    out = chat_session(line)
    if meant:
        assert f"did you mean {meant}?" in out, out
    else:
        assert "/attn" in out
    assert len(out.strip().splitlines()) == 1


def test_load_takes_a_run_name(chat_session, view_runs, tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(view_runs["lstm"], tmp_path / "checkpoints" / "rhymes-lstm-char")
    assert chat_session("/load rhymes-lstm-char").startswith("loaded ")
    assert chat_session.session.ckpt.model_config.kind == "lstm"


def test_a_prompt_longer_than_the_context_is_cut_with_a_word_and_the_counter_is_honest(chat_session, view_runs):
    """Found: sample and chat cut a prompt longer than the context without a word; chat showed `context 65/64`
    and /show `running text 65 tokens` after a 146-token turn."""
    long = "ROMEO: " + "But soft, what light through yonder window breaks? " * 2  # 109 chars; context 48
    chat_session("/set max_tokens 5")
    out = chat_session(long)
    assert "the prompt is 109 tokens: the model sees its last 48 (its context)" in out
    assert "context: the last 48 of 114 tokens" in " ".join(out.split())
    assert re.search(r"running text\s+114 tokens \(the model sees the last 48\)", chat_session("/show"))
    short = chat_session("ROMEO:")
    assert "context 11/48" in short and "sees its last" not in short
    r = cli("sample", view_runs["tf"], long, "-n", "3")
    assert r.exit_code == 0 and "the prompt is 109 tokens: the model sees its last 48" in r.stderr
    assert "sees its last" not in cli("sample", view_runs["tf"], "ROMEO:", "-n", "3").stderr
