"""`charlm explore`'s full-screen app (Textual): a text with a cursor, shaded by where the cursor token looked
(a Transformer's heads) or by a unit's gates (an LSTM/GRU), beside a head grid or a units × tokens heat map
and a side panel. Every number comes from charlm.commands.explore, computed once per text; a key press only
looks numbers up and redraws. Only this command imports Textual.

The app holds what both kinds share (the cursor, the shading mode, a knock-out, the text and its editing, the
layout); the model's own view (views.py: HeadView or UnitView) holds its selection and draws its grid;
widgets.py has the text pane and the shades, help.py the keys and the legend (`?`)."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import numpy as np
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.reactive import var
from textual.widgets import Input, Static

from charlm import files
from charlm.commands import explore as ex
from charlm.errors import ConfigError
from charlm.explore.help import Help
from charlm.explore.views import HeadView, UnitView
from charlm.explore.widgets import NEWLINE, RISE_STOPS, TextPane, num, shade
from charlm.tokenizer import UnknownCharactersError
from charlm.views.heatmap import token_label
from charlm.views.text import safe_text

MODES = {"attention": "", "surprisal": "[surprisal: s off]", "knockout": "[knock-out: x or Esc off]"}


class ExploreApp(App):
    """The explorer on one model and one text. model, tokenizer: a loaded checkpoint's; name: what the title
    calls it; unknown: how an edited text's unknown characters are handled (the tokenizer's encode)."""

    TITLE = "charlm explore"
    AUTO_FOCUS = None  # the keys go to the app; the input line takes focus only while it is open
    CSS = """
    Screen { layout: vertical; }
    #title { height: auto; max-height: 3; background: $boost; }
    #bottom { height: 9; }
    #grid { width: 60%; height: 100%; padding: 0 1; }
    #panel { width: 1fr; height: 100%; padding: 0 1; }
    #note { height: auto; max-height: 4; padding: 0 1; }
    #keys { height: 1; color: $text-muted; }
    #input { display: none; }
    """
    BINDINGS = [
        Binding("left", "move(-1)", show=False),
        Binding("right", "move(1)", show=False),
        Binding("home", "move_end(0)", show=False),
        Binding("end", "move_end(1)", show=False),
        Binding("up", "view('vertical', -1)", show=False),
        Binding("down", "view('vertical', 1)", show=False),
        Binding("left_square_bracket", "view('bracket', -1)", show=False),
        Binding("right_square_bracket", "view('bracket', 1)", show=False),
        Binding("a", "view('mean')", show=False),
        Binding("d", "view('direction')", show=False),
        Binding("g", "view('cycle')", show=False),
        Binding("s", "surprisal", show=False),
        Binding("x", "knock", show=False),
        Binding("escape", "back", show=False),
        Binding("e", "edit", show=False),
        Binding("slash", "search", show=False),
        Binding("question_mark", "help", show=False),
        Binding("q", "quit", show=False),
        Binding("ctrl+c", "quit", show=False, priority=True),  # not Textual's "press ctrl+q to quit"
    ]
    cursor = var(0)
    mode = var("attention")  # or "surprisal", "knockout"

    def __init__(self, model, tokenizer, ids: list[int], name: str = "", unknown: str = "drop", trained=None):
        super().__init__()
        self.ready = False  # mounted: there is a screen to draw on
        self.model, self.tokenizer, self.run_name, self.unknown = model, tokenizer, name, unknown
        self.trained = trained or (lambda ids: None)  # ids -> a lab run's trained positions in them (ex.trained)
        scene = ex.scene(model, tokenizer, ids, self.trained(ids))
        self.rnn = isinstance(scene, ex.GateScene)
        self.view = (UnitView if self.rnn else HeadView)(scene, tokenizer, id="grid")
        self.cursor = len(scene.ids) - 1  # the model's "now": the last token
        self.knocked: ex.Knockout | None = None
        self.message: Text | None = None  # the answer to the last key (an error, a refusal), under the grid
        self.prompting = ""  # "edit" or "search" while the input line is open
        self._shown: dict[str, Text] = {}  # what each Static shows now (redrawn only when it changes)

    @property
    def scene(self):
        return self.view.scene

    def watch_cursor(self) -> None:
        self.refresh_all()

    def watch_mode(self) -> None:
        self.refresh_all()

    # -- layout

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield TextPane(id="text")
        with Horizontal(id="bottom"):
            yield self.view
            yield Static(id="panel")
        yield Static(id="note")
        yield Input(id="input")
        yield Static(id="keys")

    def on_mount(self) -> None:
        self.ready = True
        pane = self.query_one(TextPane)
        pane.set_text(self._texts())
        pane.styles_of = self.text_styles
        self.on_resize()

    def on_resize(self, event=None) -> None:
        """Sizes for the bottom row from the terminal's (a key press then repaints without a new layout)."""
        width, height = event.size if event is not None else self.size
        lines = 9 if self.rnn else max(10, self.scene.layers + 4)
        self.query_one("#bottom").styles.height = max(4, min(lines, height // 2))
        self.view.columns = width
        self.view.styles.width = self.view.width()
        self.refresh_all(layout=True, width=width)

    def _texts(self) -> list[str]:
        return [self.tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in self.scene.ids]

    # -- what is selected, as numbers (the tests read these)

    def shading(self) -> np.ndarray:
        """(n,) the value each token is shaded by, 0..1 (signed for a unit's state)."""
        s = self.scene
        if self.mode == "surprisal":
            bits = np.nan_to_num(s.surprisal_bits(), nan=0.0)
            top = np.percentile(bits, 95) if len(bits) else 0
            return np.clip(bits / top, 0, 1) if top > 0 else bits
        if self.mode == "knockout" and self.knocked is not None:
            rise = np.concatenate([[0.0], np.clip(self.knocked.rise, 0, None)])
            return rise / rise.max() if rise.max() > 0 else rise
        return self.view.shading(self.cursor)

    def text_styles(self) -> list:
        if self.mode == "attention":
            return self.view.token_styles(self.cursor)
        return [shade(x, RISE_STOPS) if self.mode == "knockout" else shade(x) for x in self.shading()]

    # -- drawing

    def refresh_all(self, layout: bool = False, width: int | None = None) -> None:
        """Redraw what changed; the sizes stay (a new layout only on a resize)."""
        if not self.ready:
            return
        pane = self.query_one(TextPane)
        pane.cursor = self.cursor
        pane.redraw()
        parts = {
            "title": self.title_text(),
            "grid": self.view.draw(),
            "panel": self.panel_text(),
            "note": self.note_text(),
            "keys": self.keys_text(width or self.size.width),
        }
        for name, text in parts.items():
            if layout or self._shown.get(name) != text:
                self.query_one(f"#{name}").update(text, layout=layout or name in ("note", "title"))
                self._shown[name] = text
        self.query_one("#note").display = bool(parts["note"])

    def title_text(self) -> Text:
        s = self.scene
        n = len(s.ids)
        kind = "Transformer" if not self.rnn else s.kind.upper()
        name = safe_text(self.run_name)
        name = name if len(name) <= 40 else name[:18] + "…" + name[-18:]
        text = Text(f"{name} · " if name else "", style="bold")
        bpc = f"{s.bpc:.3f} bits/char" if n > 1 else "one token: nothing to predict"
        text.append(f"{kind} · {n} tokens · {bpc}", style="bold")
        if getattr(s, "scored", None) == "trained positions":  # a lab run on its own corpus (models/inspect)
            text.append(" · scored on the positions it was trained to predict", style="yellow")
        if s.start:
            text.append(f" · the text's last {n} tokens", style="yellow")
        if not self.rnn and n > s.context:
            text.append(f" · windows of {s.context}", style="yellow")
        return text

    def panel_text(self) -> Text:
        s, i = self.scene, self.cursor
        out = Text()
        out.append(f"token {i} ", style="bold")
        out.append(f"'{token_label(self.tokenizer, s.ids[i])}'", style="bold reverse")
        bits = s.surprisal_bits()[i]
        out.append("  surprisal " + ("– (first token)" if math.isnan(bits) else f"{bits:.2f} bits") + "\n")
        out.append_text(self.view.panel(i))
        out.append("\nnext: ", style="bold")
        out.append("  ".join(f"'{token_label(self.tokenizer, t)}' {num(p)}" for t, p in s.predictions(i)))
        return out

    def note_text(self) -> Text:
        """Full width, wrapped: a knock-out's result, the answer to the last key, or what the view found."""
        out = Text()
        if self.knocked is not None:
            k = self.knocked
            out.append(f"without {self.view.part_name(k)}: {k.bpc:.3f} bits/char ({k.change:+.3f})", style="bold red")
            if self.mode == "knockout" and len(k.rise):
                worst = int(np.argmax(k.rise)) + 1
                label = token_label(self.tokenizer, self.scene.ids[worst])
                out.append(f"; loss rose most at '{label}'@{worst} (+{k.rise.max():.2f} bits)")
        # while a knock-out's result shows, the view's own note waits (it returns with x or Esc): the line holds 4
        for line in (self.message, self.view.note if self.knocked is None else None):
            if line:
                out.append("\n" if out else "")
                out.append_text(line)
        return out

    def keys_text(self, width: int) -> Text:
        """The footer: `?` and `q` first, then the mode, then the view's keys as many as fit."""
        if self.prompting:
            return Text("Enter: run  Esc: cancel", style="dim")
        out = Text()
        out.append("? ", style="bold")
        out.append("help  ")
        out.append("q ", style="bold")
        out.append("quit")
        if MODES[self.mode]:
            out.append(f"  {MODES[self.mode]}", style="bold yellow")
        for key, what in self.view.footer():
            if len(out) + len(key) + len(what) + 3 > width:
                break
            out.append(f"  {key} ", style="bold")
            out.append(what)
        return out

    # -- actions

    def selection_changed(self) -> None:
        """The view's selection moved: back to its shading, the knock-out dropped."""
        self.knocked, self.message = None, None
        if self.mode == "knockout":
            self.mode = "attention"
        self.refresh_all()

    def move_to(self, token: int) -> None:
        self.cursor = max(0, min(len(self.scene.ids) - 1, token))

    def grid_click(self, x: int, y: int) -> None:
        self.view.click(x, y)

    def action_move(self, step: int) -> None:
        self.move_to(self.cursor + step)

    def action_move_end(self, end: int) -> None:
        self.move_to(len(self.scene.ids) - 1 if end else 0)

    def action_view(self, what: str, *args) -> None:
        """A key of the view (HeadView, UnitView); keys the other kind of model has do nothing."""
        if hasattr(self.view, what):
            getattr(self.view, what)(*args)

    def action_surprisal(self) -> None:
        self.mode = "attention" if self.mode == "surprisal" else "surprisal"

    def action_knock(self) -> None:
        """x: take the selected head or unit out and shade where the loss rose; x again (or Esc): back."""
        if self.mode == "knockout":
            return self.action_back()
        target = self.view.target()
        if len(self.scene.ids) < 2:
            target = "one token: nothing is predicted, so nothing to knock out (e: a longer text)"
        if isinstance(target, str):
            self.message = Text(target, style="yellow")
            return self.refresh_all()
        self.knocked = ex.knock(self.model, self.scene, *target)
        self.message = None
        self.mode = "knockout"
        self.refresh_all()

    def action_back(self) -> None:
        """Esc: the knock-out (or the surprisal shading) off, back to the view's own shading."""
        self.knocked, self.message = None, None
        self.mode = "attention"
        self.refresh_all()

    def action_help(self) -> None:
        self.push_screen(Help(self.rnn))

    def _prompt(self, what: str, value: str, placeholder: str) -> None:
        self.prompting = what
        box = self.query_one(Input)
        box.value, box.placeholder = value, placeholder
        box.display = True
        box.focus()
        self.refresh_all()

    def action_edit(self) -> None:
        text = self.tokenizer.decode(self.scene.ids).replace("\n", NEWLINE)  # one line: newlines shown as ⏎
        self._prompt("edit", text, f"the text to explore ({NEWLINE} or \\n: a new line; Enter: run, Esc: cancel)")

    def action_search(self) -> None:
        if self.rnn:
            self._prompt("search", "", "units that are: " + " | ".join(ex.BEHAVIOURS))

    def _close_prompt(self) -> None:
        self.prompting = ""
        box = self.query_one(Input)
        box.display = False
        self.set_focus(None)
        self.refresh_all()

    def on_key(self, event) -> None:
        if self.prompting and event.key == "escape":
            event.stop()
            self.message = None
            self._close_prompt()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        what, value = self.prompting, event.value
        self._close_prompt()
        try:
            if what == "edit":
                self.rerun(value.replace(NEWLINE, "\n").replace("\\n", "\n"))  # ⏎ or \n typed: a newline
            else:
                self.view.search(value)
                self.message = None
        except UnknownCharactersError as e:  # the typed text stays in the editor, to be put right
            shown = " ".join(safe_text(repr(c)) for c in e.chars[:10])
            self.message = Text(f"the model never saw {shown}: change or remove it (Enter runs, Esc keeps the ")
            self.message.append("text as it was)")
            self._prompt("edit", value, "")
        except ConfigError as e:  # the text and the order stay as they were
            self.message = Text(safe_text(str(e)), style="yellow")
        self.refresh_all()

    def rerun(self, text: str) -> None:
        """Explore another text: every number computed again, the cursor kept where it can be."""
        ids = self.tokenizer.encode(text, unknown=self.unknown)
        if not ids:
            raise ConfigError("the text has no characters the model knows")
        scene = ex.scene(self.model, self.tokenizer, ids, self.trained(ids))
        self.ready = False  # no redraw half-way: the view, the text and the cursor change together
        try:
            self.view.set_scene(scene)
            self.knocked, self.message, self.mode = None, None, "attention"
            self.query_one(TextPane).set_text(self._texts())
            self.cursor = min(self.cursor, len(scene.ids) - 1)
        finally:
            self.ready = True
        self.refresh_all()


def screenshot(app: ExploreApp, path: str, size: tuple[int, int]) -> None:
    """Render the app's first screen at size (columns, rows) to an SVG file, without a terminal, through
    files.atomic_write (never through a link, never onto a FIFO or a device)."""

    async def shoot() -> str:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return app.export_screenshot()

    try:
        files.check_regular(Path(path))  # before the work, and never blocking on a FIFO
        svg = asyncio.run(shoot())
        files.atomic_write(path, lambda f: f.write(svg.encode("utf-8")))
    except files.WriteError as e:
        raise ConfigError(f"--screenshot: {e}") from None


def explore(ck, ids: list[int], opts) -> str | None:
    """`charlm explore`: the app on a loaded checkpoint and a text (opts: options.ExploreOptions); with
    --screenshot, the path of the SVG written."""
    if not opts.screenshot and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ConfigError(
            "explore is a full-screen app: run it in a terminal, or draw its first screen with --screenshot FILE.svg"
        )
    trained = lambda ids: ex.trained(ck, ids)  # noqa: E731
    app = ExploreApp(ck.model, ck.tokenizer, ids, name=ck.path.parent.name, unknown=opts.unknown, trained=trained)
    if opts.screenshot:
        screenshot(app, opts.screenshot, opts.columns_rows)
        return opts.screenshot
    app.run()
    return None
