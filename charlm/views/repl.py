"""The line reader of `charlm chat` and `compare -i`: what the user types, as lines. What each line does is
charlm.commands.repl (the shared REPL) and commands.chat / commands.compare.

On a terminal: readline's line editing and history (the history file lives in the charlm cache directory),
tab completion of /commands and their first word, a multi-line paste as one prompt (readline's bracketed
paste), multi-line input between \"\"\" marks, Ctrl-C drops a half-typed line (it never leaves), Ctrl-L
clears the screen and keeps the line, Ctrl-D leaves. With stdin not a terminal, every input line is a prompt (\"\"\" blocks joined): scriptable.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

FENCE = '"""'
PROMPT, MORE = ">>> ", "... "
LEAVE_HINT = "Ctrl-D or /bye leaves"
# what Ctrl-L types at the start of the line before sending it (see _setup_readline): never a prompt
CLEAR_MARK = "\u240c"  # ␌, the symbol for form feed
CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase the screen (every terminal emulator speaks it)


class LineReader:
    """Input lines as (line, fenced) pairs. On a terminal: readline editing, tab completion of `commands`
    (and of the first word after one of `completions`' keys), history in the cache directory, a paste as one
    line (newlines kept), \"\"\" multi-line prompts, Ctrl-C drops a half-typed line (at an empty prompt it says
    how to leave), Ctrl-D leaves. Otherwise: each line of stdin (\"\"\" blocks joined)."""

    def __init__(
        self,
        console: Console,
        interactive: bool,
        commands: dict[str, str],
        completions: dict[str, list[str]] | None = None,
    ):
        self.console, self.interactive, self.commands = console, interactive, commands
        self.completions = completions or {}
        self.history: Path | None = None

    def __iter__(self):
        if not self.interactive:
            yield from self._piped_lines()
            return
        self._setup_readline()
        try:
            yield from self._terminal_lines()
        finally:
            self._save_history()

    def _terminal_lines(self):
        while True:
            try:
                line = input(PROMPT)
            except EOFError:  # Ctrl-D
                self.console.print()
                return
            except KeyboardInterrupt:  # Ctrl-C drops the line; at an empty prompt it says how to leave
                typed = _line_buffer()
                self.console.print()
                if not typed.strip():
                    self.console.print(Text(f"({LEAVE_HINT})", style="dim"))
                continue
            if line.startswith(CLEAR_MARK):
                self._clear_screen(line[len(CLEAR_MARK) :])
                continue
            fenced = line.lstrip().startswith(FENCE)
            if fenced:
                try:
                    line = self._fenced(line, self._more)
                except KeyboardInterrupt:  # Ctrl-C inside a multi-line prompt drops that prompt
                    self.console.print()
                    continue
            yield line, fenced

    def _more(self) -> str:
        """A line of a multi-line prompt (Ctrl-L clears the screen there too, keeping the line)."""
        while (line := input(MORE)).startswith(CLEAR_MARK):
            self._clear_screen(line[len(CLEAR_MARK) :])
        return line

    def _clear_screen(self, typed: str) -> None:
        """Ctrl-L: a clear screen, the prompt at its top and the line as it was typed (not in the history)."""
        import readline

        n = readline.get_current_history_length()
        if n and readline.get_history_item(n) == CLEAR_MARK + typed:
            readline.remove_history_item(n - 1)
        self.console.file.write(CLEAR_SCREEN)
        self.console.file.flush()

        def give_back() -> None:
            readline.set_pre_input_hook(None)
            readline.insert_text(typed)
            readline.redisplay()

        if typed:
            readline.set_pre_input_hook(give_back)

    def _piped_lines(self):
        lines = (line.rstrip("\n") for line in sys.stdin)
        for line in lines:
            fenced = line.lstrip().startswith(FENCE)
            if fenced:
                line = self._fenced(line, lambda: next(lines))
            yield line, fenced

    def _fenced(self, first: str, read) -> str:
        """Multi-line input: from a line starting with \"\"\" to the next \"\"\"."""
        rest = first.lstrip()[len(FENCE) :]
        if FENCE in rest:
            return rest[: rest.index(FENCE)]
        parts = [rest] if rest else []
        while True:
            try:
                line = read()
            except (StopIteration, EOFError):  # the input ended: send what there is
                break
            if FENCE in line:
                parts.append(line[: line.index(FENCE)])
                break
            parts.append(line)
        return "\n".join(parts)

    def _setup_readline(self) -> None:
        try:
            import readline
        except ImportError:  # e.g. Windows without pyreadline: plain input() still works
            return
        from charlm import files
        from charlm.data import cache_dir

        readline.set_completer(self._complete)
        readline.set_completer_delims(" \t\n")
        if "libedit" in (readline.__doc__ or ""):
            readline.parse_and_bind("bind ^I rl_complete")
        else:
            readline.parse_and_bind("tab: complete")
            # CPython turns bracketed paste off (for its own >>> prompt); on, readline inserts a paste, newlines
            # and all, as one edit: several pasted lines become one prompt, sent with Enter
            readline.parse_and_bind("set enable-bracketed-paste on")
            # Ctrl-L: readline's own clear-screen needs the terminal description's "clear", which a missing or
            # dumb TERM lacks (it then prints a new blank prompt and clears nothing): instead, type a mark at
            # the line's start and send it; the loop clears the screen and gives the line back
            readline.parse_and_bind(f'"\\C-l": "\\C-a{CLEAR_MARK}\\n"')
        self.history = cache_dir() / "chat_history"
        readline.set_history_length(1000)
        if files.not_regular(self.history):  # a FIFO would block readline's open for ever, a link be followed
            self.history = None
            return
        try:
            readline.read_history_file(self.history)
        except OSError:  # no history yet, or unreadable: start without
            pass

    def _save_history(self) -> None:
        if self.history is None:
            return
        import readline

        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(self.history)
        except OSError:  # a read-only cache dir costs the history, not the session
            pass

    def _complete(self, text: str, state: int) -> str | None:
        """readline's completer: a /command, then the first word after it (/set's keys, /mode's values)."""
        import readline

        words = readline.get_line_buffer().lstrip().split(" ")
        if len(words) <= 1:
            options = [c + " " for c in self.commands if c.startswith(text)]
        elif len(words) == 2:
            options = [w for w in self.completions.get(words[0], ()) if w.startswith(text)]
        else:
            options = []
        return options[state] if state < len(options) else None


def _line_buffer() -> str:
    """What is typed at the prompt so far ("" without readline)."""
    try:
        import readline
    except ImportError:
        return ""
    return readline.get_line_buffer()
