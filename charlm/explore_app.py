"""`charlm explore`'s full-screen app (Textual): a text with a cursor, shaded by where the cursor token looked
(a Transformer's heads) or by a unit's gates (an LSTM/GRU), beside a head grid or a units × tokens heat map
and a side panel. Every number comes from charlm.commands.explore, computed once per text; a key press only
looks numbers up and redraws. Only this command imports Textual.

Over ~450 lines on purpose: ExploreApp is one Textual App, and its key bindings, actions and redraws read
best as one class; its widgets and shades are in charlm/explore_widgets.py."""

from __future__ import annotations

import asyncio
import math
import sys

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Input, Static

from charlm.commands import explore as ex
from charlm.errors import ConfigError
from charlm.explore_widgets import (
    CURSOR_COLUMN,
    NEWLINE,
    RISE_STOPS,
    RNN_KEYS,
    SCORE,
    SHORT_ROLE,
    TRANSFORMER_KEYS,
    UNSEEN,
    Keys,
    Lines,
    TextPane,
    num,
    shade,
)
from charlm.tokenizer import UnknownCharactersError
from charlm.views.heatmap import HEAT_STOPS, NEG_STOPS, POS_STOPS, SIGNED_RAMPS, UNICODE_RAMP, token_label
from charlm.views.text import safe_text


class ExploreApp(App):
    """The explorer on one model and one text. model, tokenizer: a loaded checkpoint's; name: what the title
    calls it; unknown: how an edited text's unknown characters are handled (the tokenizer's encode)."""

    TITLE = "charlm explore"
    AUTO_FOCUS = None  # the keys go to the app; the input line takes focus only while it is open
    CSS = """
    Screen { layout: vertical; }
    #title { height: 1; background: $boost; }
    #bottom { height: 9; }
    #grid { width: 60%; height: 100%; padding: 0 1; }
    #panel { width: 1fr; height: 100%; padding: 0 1; }
    #keys { height: 1; color: $text-muted; }
    #input { display: none; }
    """
    BINDINGS = [
        Binding("left", "move(-1)", show=False),
        Binding("right", "move(1)", show=False),
        Binding("home", "move_end(0)", show=False),
        Binding("end", "move_end(1)", show=False),
        Binding("up", "vertical(-1)", show=False),
        Binding("down", "vertical(1)", show=False),
        Binding("left_square_bracket", "bracket(-1)", show=False),
        Binding("right_square_bracket", "bracket(1)", show=False),
        Binding("a", "mean", show=False),
        Binding("d", "direction", show=False),
        Binding("g", "quantity", show=False),
        Binding("s", "surprisal", show=False),
        Binding("x", "knock", show=False),
        Binding("e", "edit", show=False),
        Binding("slash", "search", show=False),
        Binding("question_mark", "keys", show=False),
        Binding("q", "quit", show=False),
    ]

    def __init__(self, model, tokenizer, ids: list[int], name: str = "", unknown: str = "drop", keep=None):
        super().__init__()
        self.model, self.tokenizer, self.run_name, self.unknown = model, tokenizer, name, unknown
        self.scene = ex.scene(model, tokenizer, ids, keep)  # keep: a lab run's trained positions (ex.trained)
        self.rnn = isinstance(self.scene, ex.GateScene)
        self.cursor = len(self.scene.ids) - 1  # the model's "now": the last token
        self.layer = self.scene.layers - 1
        self.head: int | None = 0  # None: the mean of the layer's heads
        self.looking = "to"  # "to": where the cursor token looked; "from": which tokens looked at it
        self.mode = "attention"  # or "surprisal", "knockout"; an RNN's "attention" is its unit's quantity
        self.knocked: ex.Knockout | None = None
        self.behaviour = "changes"
        self.quantity = "forget" if self.rnn and "forget" in self.scene.quantities else "update"
        self.order: list[int] = []
        self.scores = np.zeros(0)  # each unit's score by the behaviour
        self.unit = 0
        self.prompting = ""  # "edit" or "search" while the input line is open
        self._shown: dict[str, Text] = {}  # what each Static shows now (redrawn only when it changes)
        if self.rnn:
            self._rank()

    # -- layout

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield TextPane(id="text")
        with Horizontal(id="bottom"):
            yield Lines(id="grid")
            yield Static(id="panel")
        yield Input(id="input")
        yield Static(id="keys")

    def on_mount(self) -> None:
        pane = self.query_one(TextPane)
        pane.set_text(self._texts())
        pane.styles_of = self.text_styles
        self.on_resize()

    def on_resize(self, event=None) -> None:
        """Fixed sizes for the bottom row (a key press then repaints without a new layout)."""
        width, height = self.size
        lines = 9 if self.rnn else max(10, self.scene.layers + 3)
        self.query_one("#bottom").styles.height = max(4, min(lines, height // 2))
        self.query_one("#grid").styles.width = self.grid_width()
        self.refresh_all(layout=True)

    def grid_width(self) -> int:
        """Columns of the head grid (its cells, and room for the selected head's line) or the heat map."""
        most = max(20, self.size.width * 6 // 10)
        if self.rnn:
            return most
        return min(most, max(4 + self.scene.heads * self.cell_width(), 44) + 2)

    def cell_width(self) -> int:
        return max(6, min(12, (max(20, self.size.width * 6 // 10 - 2) - 4) // self.scene.heads))

    def _texts(self) -> list[str]:
        return [self.tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in self.scene.ids]

    # -- what is selected, as numbers (the tests read these)

    def shading(self) -> np.ndarray:
        """(n,) the value each token is shaded by, 0..1."""
        s = self.scene
        if self.mode == "surprisal":
            bits = np.nan_to_num(s.surprisal_bits(), nan=0.0)
            top = np.percentile(bits, 95) if len(bits) else 0
            return np.clip(bits / top, 0, 1) if top > 0 else bits
        if self.mode == "knockout" and self.knocked is not None:
            rise = np.concatenate([[0.0], np.clip(self.knocked.rise, 0, None)])
            return rise / rise.max() if rise.max() > 0 else rise
        if self.rnn:
            v = s.values(self.layer, self.quantity)[:, self.unit]
            if self.quantity in ("cell state", "hidden", "cell", "new"):  # signed: scale by the largest size
                return v / max(np.abs(v).max(), 1e-9)
            return v
        w = self.attention()
        return w / w.max() if w.max() > 0 else w

    def attention(self) -> np.ndarray:
        """(n,) the attention the text is shaded by: the cursor token's row, or its column with `d`."""
        s = self.scene
        if self.looking == "to":
            return s.looked_at(self.cursor, self.layer, self.head)
        return s.looked_from(self.cursor, self.layer, self.head)

    def text_styles(self) -> list[Style]:
        v = self.shading()
        signed = self.rnn and self.mode == "attention" and self.quantity in ("cell state", "hidden", "cell", "new")
        if signed:
            styles = [shade(abs(x), POS_STOPS if x >= 0 else NEG_STOPS) for x in v]
        elif self.mode == "knockout":
            styles = [shade(x, RISE_STOPS) for x in v]
        else:
            styles = [shade(x) for x in v]
        if not self.rnn and self.mode == "attention" and self.looking == "to":
            for t in range(int(self.scene.seen_from[self.cursor])):  # before what the cursor token sees
                styles[t] = UNSEEN
        return styles

    # -- drawing

    def refresh_all(self, layout: bool = False) -> None:
        """Redraw what changed; the sizes stay (a new layout only on a resize)."""
        if not self.is_mounted:
            return
        pane = self.query_one(TextPane)
        pane.cursor = self.cursor
        pane.redraw()
        parts = {
            "title": self.title_text(),
            "grid": self.heat_text() if self.rnn else self.grid_text(),
            "panel": self.panel_text(),
            "keys": self.keys_text(),
        }
        for name, text in parts.items():
            if layout or self._shown.get(name) != text:
                self.query_one(f"#{name}").update(text, layout=layout)
                self._shown[name] = text

    def title_text(self) -> Text:
        s = self.scene
        n = len(s.ids)
        kind = "Transformer" if not self.rnn else s.kind.upper()
        what = f" {safe_text(self.run_name)} ·" if self.run_name else ""
        text = Text(f"{what} {kind} · {n} tokens · {s.bpc:.3f} bits/char", style="bold")
        if s.start:
            text.append(f" · the text's last {n} tokens", style="yellow")
        if not self.rnn and n > s.context:
            text.append(f" · windows of {s.context}", style="yellow")
        return text

    def _label(self, token: int) -> str:
        return token_label(self.tokenizer, self.scene.ids[token])

    def grid_text(self) -> Text:
        """Every layer × head: its role and how far back it looks (tokens); the selected one reversed."""
        s = self.scene
        cell = self.cell_width()
        out = Text("heads: role · tokens back\n", style="bold")
        for layer in range(s.layers):
            out.append(f"L{layer:<2}", style="bold" if layer == self.layer else "dim")
            for head in range(s.heads):
                lab = s.label(layer, head)
                name = lab.name if lab.name.startswith("offset") else SHORT_ROLE.get(lab.role, lab.role)
                back = f"{lab.distance:.1f}" if lab.distance < 100 else f"{lab.distance:.0f}"
                body = f"{name[: cell - 6]:<{cell - 6}} {back:>4}"
                chosen = layer == self.layer and (self.head is None or self.head == head)
                style = Style(reverse=True, bold=True) if chosen else Style(color=ROLE_COLOURS.get(lab.role))
                out.append(" ")
                out.append(f"{body:<{cell - 1}}", style)
            out.append("\n")
        which = "mean of the layer's heads" if self.head is None else f"L{self.layer}H{self.head}"
        lab = None if self.head is None else s.label(self.layer, self.head)
        out.append(f"{which}", style="bold")
        if lab:
            scores = f" · prev {num(lab.previous)} ind {num(lab.induction)} ent {lab.entropy:.1f}b"
            name = (
                lab.name
                if len(which) + len(lab.name) + len(scores) < self.grid_width() - 2
                else SHORT_ROLE.get(lab.role, lab.role)
            )
            out.append(f" {name}{scores}")
        return out

    def heat_text(self) -> Text:
        """Units × tokens around the cursor, in the order of the last search; the selected unit marked."""
        s = self.scene
        cols = max(5, self.grid_width() - 2 - 7)
        a = max(0, min(self.cursor - cols // 2, len(s.ids) - cols))
        b = min(len(s.ids), a + cols)
        values = s.values(self.layer, self.quantity)
        signed = self.quantity in ("cell state", "hidden", "cell", "new")
        k = self.order.index(self.unit)
        rows = self.order[max(0, k - 2) : max(0, k - 2) + 6]
        out = Text(f"L{self.layer} {self.quantity}, units by {self.behaviour}\n", style="bold")
        out.append(" " * 7)
        for t in range(a, b):
            out.append((self._label(t) + " ")[0], Style(reverse=True) if t == self.cursor else Style(dim=True))
        out.append("\n")
        steps = len(UNICODE_RAMP)
        for u in rows:
            out.append(f"{'▸' if u == self.unit else ' '}u{u:<4} ", style="bold" if u == self.unit else "")
            top = max(np.abs(values[:, u]).max(), 1e-9) if signed else 1.0
            x = values[a:b, u] / top
            levels = np.where(np.abs(x) > 0.02, 1 + np.minimum(steps - 2, (np.abs(x) * (steps - 1)).astype(int)), 0)
            run, run_style = "", None
            for k, (level, negative) in enumerate(zip(levels.tolist(), (x < 0).tolist())):
                stops = (NEG_STOPS if negative else POS_STOPS) if signed else HEAT_STOPS
                style = shade(level / (steps - 1), stops, background=False)  # one colour a glyph: long runs
                if a + k == self.cursor:
                    style += CURSOR_COLUMN
                if style is not run_style and run:
                    out.append(run, run_style)
                    run = ""
                run_style = style
                run += SIGNED_RAMPS[False][1][level] if signed and negative else UNICODE_RAMP[level]
            out.append(run, run_style)
            out.append("\n")
        return out

    def panel_text(self) -> Text:
        s = self.scene
        i = self.cursor
        out = Text()
        out.append(f"token {i} ", style="bold")
        out.append(f"'{self._label(i)}'", style="bold reverse")
        bits = s.surprisal_bits()[i]
        out.append("  surprisal " + ("– (first token)" if math.isnan(bits) else f"{bits:.2f} bits") + "\n")
        if self.rnn:
            out.append(f"L{self.layer} unit {self.unit} ", style="bold")
            out.append(f"(#{self.order.index(self.unit) + 1} by {self.behaviour}: {SCORE[self.behaviour]} ")
            out.append(f"{self.scores[self.unit]:.2f}): ")
            out.append(
                "  ".join(
                    f"{q} {v:+.2f}" if q in ("cell state", "hidden", "cell", "new") else f"{q} {v:.2f}"
                    for q, v in self.unit_values().items()
                )
            )
            out.append("\n")
        else:
            seen = int(s.seen_from[i])
            if self.looking == "to":
                head = "mean" if self.head is None else f"H{self.head}"
                out.append(f"looked at (L{self.layer} {head}, sees {seen}..{i}): ", style="bold")
                out.append(
                    "  ".join(f"'{self._label(j)}'@{j} {num(w)}" for j, w in s.top_keys(i, self.layer, self.head))
                )
            else:
                w = self.attention()
                order = [int(j) for j in np.argsort(-w, kind="stable")[: ex.TOP] if w[j] > 0]
                out.append(f"looked at it (L{self.layer}): ", style="bold")
                out.append("  ".join(f"'{self._label(j)}'@{j} {num(w[j])}" for j in order))
            out.append("\n")
        out.append("next: ", style="bold")
        out.append("  ".join(f"'{token_label(self.tokenizer, t)}' {num(p)}" for t, p in s.predictions(i)))
        out.append("\n")
        if self.knocked is not None:
            k = self.knocked
            what = f"unit {k.part} of L{k.layer}" if self.rnn else f"L{k.layer}H{k.part}"
            out.append(f"without {what}: {k.bpc:.3f} bits/char ({k.change:+.3f})", style="bold red")
            if self.mode == "knockout":
                worst = int(np.argmax(k.rise)) + 1 if len(k.rise) else 0
                out.append(f"; loss rose most at '{self._label(worst)}'@{worst} (+{k.rise.max():.2f} bits)")
            out.append("\n")
        return out

    def unit_values(self) -> dict[str, float]:
        """The selected unit's value of every gate and state at the cursor token."""
        return {q: float(self.scene.values(self.layer, q)[self.cursor, self.unit]) for q in self.scene.quantities}

    def keys_text(self) -> Text:
        if self.prompting:
            return Text("Enter: run  Esc: cancel", style="dim")
        mode = {"attention": "", "surprisal": "  [surprisal]", "knockout": "  [knock-out]"}[self.mode]
        if self.rnn:
            return Text(f"←→ token ↑↓ unit [] layer g {self.quantity} / search s surprisal x zero e edit ? q{mode}")
        way = "looked at" if self.looking == "to" else "looked at it"
        return Text(f"←→ token ↑↓ layer [] head a mean d {way} s surprisal x knock out e edit ? q{mode}")

    # -- actions

    def move_to(self, token: int) -> None:
        self.cursor = max(0, min(len(self.scene.ids) - 1, token))
        self.refresh_all()

    def grid_click(self, x: int, y: int) -> None:
        """A click on the head grid selects that layer and head (row 0 is the grid's title)."""
        if self.rnn or not 1 <= y <= self.scene.layers or x < 4:
            return
        head = (x - 4) // self.cell_width()
        if head < self.scene.heads:
            self.layer, self.head = y - 1, head
            self._back_to_attention()

    def action_move(self, step: int) -> None:
        self.move_to(self.cursor + step)

    def action_move_end(self, end: int) -> None:
        self.move_to(len(self.scene.ids) - 1 if end else 0)

    def action_vertical(self, step: int) -> None:
        if self.rnn:
            k = self.order.index(self.unit) + step
            self.unit = self.order[max(0, min(len(self.order) - 1, k))]
        else:
            self.layer = max(0, min(self.scene.layers - 1, self.layer + step))
        self._back_to_attention()

    def action_bracket(self, step: int) -> None:
        if self.rnn:
            self.layer = max(0, min(self.scene.layers - 1, self.layer + step))
            self._rank()
        else:
            head = (-1 if step > 0 else self.scene.heads) if self.head is None else self.head
            self.head = max(0, min(self.scene.heads - 1, head + step))
        self._back_to_attention()

    def action_mean(self) -> None:
        if not self.rnn:
            self.head = None if self.head is not None else 0
            self._back_to_attention()

    def action_direction(self) -> None:
        if not self.rnn:
            self.looking = "from" if self.looking == "to" else "to"
            self._back_to_attention()

    def action_quantity(self) -> None:
        if self.rnn:
            q = self.scene.quantities
            self.quantity = q[(q.index(self.quantity) + 1) % len(q)]
            self._back_to_attention()

    def _back_to_attention(self) -> None:
        self.mode = "attention"
        self.knocked = None
        self.refresh_all()

    def action_surprisal(self) -> None:
        self.mode = "attention" if self.mode == "surprisal" else "surprisal"
        self.refresh_all()

    def action_knock(self) -> None:
        if self.rnn:
            self.knocked = ex.knock(self.model, self.scene, self.layer, self.unit)
        elif self.head is None:
            self.notify("choose one head to knock out ([ or ])", severity="warning")
            return
        else:
            self.knocked = ex.knock(self.model, self.scene, self.layer, self.head)
        self.mode = "knockout"
        self.refresh_all()

    def _rank(self) -> None:
        self.order, self.scores = self.scene.rank_units(self.layer, self.behaviour)
        self.unit = self.order[0]

    def action_keys(self) -> None:
        self.push_screen(Keys(RNN_KEYS if self.rnn else TRANSFORMER_KEYS))

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
            self._close_prompt()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        what, value = self.prompting, event.value
        self._close_prompt()
        try:
            if what == "edit":
                self.rerun(value.replace(NEWLINE, "\n").replace("\\n", "\n"))  # ⏎ or \n typed: a newline
            elif what == "search":
                self.search(value)
        except (ConfigError, UnknownCharactersError) as e:  # the text stays as it was
            self.notify(safe_text(str(e)), severity="error")

    def rerun(self, text: str) -> None:
        """Explore another text: every number computed again, the cursor kept where it can be."""
        ids = self.tokenizer.encode(text, unknown=self.unknown)
        if not ids:
            raise ConfigError("the text has no characters the model knows")
        self.scene = ex.scene(self.model, self.tokenizer, ids)
        self.cursor = min(self.cursor, len(self.scene.ids) - 1)
        self.knocked, self.mode = None, "attention"
        if self.rnn:
            self._rank()
        self.query_one(TextPane).set_text(self._texts())
        self.refresh_all()

    def search(self, query: str) -> None:
        """Units of the layer ranked by the behaviour whose name starts with the query; the best selected."""
        query = query.strip().lower()
        found = [b for b in ex.BEHAVIOURS if b.startswith(query)] if query else []
        if not found:
            raise ConfigError(f"no behaviour '{query}': search for one of {', '.join(ex.BEHAVIOURS)}")
        self.behaviour = found[0]
        if self.behaviour in ("quotes", "brackets", "line"):  # found by its memory: show that
            self.quantity = "cell state" if self.scene.has_cell else "hidden"
        self._rank()
        self._back_to_attention()
        self.notify(f"units by: {ex.BEHAVIOURS[self.behaviour]}", timeout=3)


ROLE_COLOURS = {
    "previous-token": "cyan",
    "induction": "magenta",
    "local": "green",
    "global": "grey50",
    "distant": "yellow",
}


def screenshot(app: ExploreApp, path: str, size: tuple[int, int]) -> None:
    """Render the app's first screen at size (columns, rows) to an SVG file, without a terminal."""

    async def shoot() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            svg = app.export_screenshot()
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg)

    asyncio.run(shoot())


def explore(ck, ids: list[int], opts) -> None:
    """`charlm explore`: the app on a loaded checkpoint and a text (opts: options.ExploreOptions)."""
    if not opts.screenshot and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ConfigError(
            "explore is a full-screen app: run it in a terminal, or draw its first screen with --screenshot FILE.svg"
        )
    keep = ex.trained(ck, ids)
    app = ExploreApp(ck.model, ck.tokenizer, ids, name=ck.path.parent.name, unknown=opts.unknown, keep=keep)
    if opts.screenshot:
        try:
            screenshot(app, opts.screenshot, opts.columns_rows)
        except OSError as e:
            raise ConfigError(f"--screenshot: cannot write {opts.screenshot} ({e.strerror})") from None
        return
    app.run()
