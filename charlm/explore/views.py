"""The two views of `charlm explore`'s app (charlm/explore/app.py): HeadView, a Transformer's layers × heads
grid and what the cursor token looked at; UnitView, an LSTM/GRU's units × tokens heat map and the selected
unit's gates. Each holds its selection as reactive state (Textual's `var`: a change redraws the app) and
answers the app's questions alike: what shades the text, its grid, its panel line, what `x` takes out, its
keys, its notes and its legend (help.py). Textual, imported by that command only."""

from __future__ import annotations

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.reactive import var

from charlm.commands import explore as ex
from charlm.errors import ConfigError
from charlm.explore.widgets import CURSOR_COLUMN, SCORE, SHORT_ROLE, UNSEEN, Lines, num, shade
from charlm.views.heatmap import HEAT_STOPS, NEG_STOPS, POS_STOPS, SIGNED_RAMPS, UNICODE_RAMP, token_label

SIGNED = ("cell state", "hidden", "cell", "new")  # quantities with a sign: orange above 0, blue below
ROLE_COLOURS = {
    "previous-token": "cyan",
    "induction": "magenta",
    "local": "green",
    "global": "grey50",
    "distant": "yellow",
}


class View(Lines):
    """What both views share: the scene and tokenizer, and a change of selection redrawing the app."""

    def __init__(self, scene, tokenizer, **kw):
        super().__init__(**kw)
        self.scene, self.tokenizer = scene, tokenizer
        self.note: Text | None = None  # a finding worth a line of its own (the app shows it under the grid)
        self.columns = 100  # the terminal's width (the app sets it on every resize)

    def _changed(self) -> None:
        if self.is_mounted:
            self.app.selection_changed()

    def label(self, token: int) -> str:
        return token_label(self.tokenizer, self.scene.ids[token])

    def width(self) -> int:
        """Columns of the grid or heat map (and its panel takes the rest)."""
        return max(20, self.columns * 6 // 10)


# ---- a Transformer's heads ----------------------------------------------------------------------------------


class HeadView(View):
    """The layers × heads grid (each head's role and how far back it looks); the text shaded by where the
    cursor token looked (`d`: which tokens looked at it) in the selected head, or the layer's mean."""

    layer_no = var(0)  # the selected layer (Widget.layer is Textual's own)
    head: int | None = var(0)  # None: the mean of the layer's heads
    looking = var("to")  # "to": where the cursor token looked; "from": which tokens looked at it
    watch_layer_no = watch_head = watch_looking = View._changed

    def __init__(self, scene, tokenizer, **kw):
        super().__init__(scene, tokenizer, **kw)
        self.set_scene(scene)
        self.layer_no = scene.layers - 1

    def set_scene(self, scene) -> None:
        self.scene = scene
        self.note = self.missing_roles()

    def validate_layer_no(self, layer: int) -> int:
        return max(0, min(self.scene.layers - 1, layer))

    def missing_roles(self) -> Text | None:
        """A pointer to lab runs when this text shows no previous-token or induction head (issue 37)."""
        roles = {lab.role for lab in self.scene.labels}
        missing = [r for r in ("previous-token", "induction") if r not in roles]
        if not missing or len(self.scene.ids) < 2:
            return None
        text = Text(f"No {' or '.join(missing)} head on this text. ", style="yellow")
        text.append("Lab runs have them: charlm lab induction (or lab copy --quick), then charlm explore ")
        text.append("checkpoints/lab/induction-transformer-s0 (or copy-transformer-s0)")
        return text

    def width(self) -> int:
        most = super().width()
        return min(most, max(4 + self.scene.heads * self.cell_width(), 44) + 2)

    def cell_width(self) -> int:
        return max(6, min(13, (max(20, self.columns * 6 // 10 - 2) - 4) // self.scene.heads))

    def values(self, cursor: int) -> np.ndarray:
        """(n,) the attention the text is shaded by: the cursor token's row, or its column with `d`."""
        s = self.scene
        if self.looking == "to":
            return s.looked_at(cursor, self.layer_no, self.head)
        return s.looked_from(cursor, self.layer_no, self.head)

    def shading(self, cursor: int) -> np.ndarray:
        w = self.values(cursor)
        return w / w.max() if w.max() > 0 else w

    def token_styles(self, cursor: int) -> list[Style]:
        styles = [shade(x) for x in self.shading(cursor)]
        if self.looking == "to":
            for t in range(int(self.scene.seen_from[cursor])):  # before what the cursor token sees
                styles[t] = UNSEEN
        return styles

    def draw(self) -> Text:
        """Every layer × head: its role and how far back it looks (tokens); the selected one reversed."""
        s = self.scene
        cell = self.cell_width()
        room = cell - 6  # characters of a role's name in a cell
        out = Text("heads: role · tokens back\n", style="bold")
        out.append("   " + "".join(f" {'H' + str(h):<{cell - 1}}" for h in range(s.heads)) + "\n", style="dim")
        for layer in range(s.layers):
            out.append(f"L{layer:<2}", style="bold" if layer == self.layer_no else "dim")
            for head in range(s.heads):
                lab = s.label(layer, head)
                name = short_name(lab)[:room]
                back = f"{lab.distance:.1f}" if lab.distance < 100 else f"{lab.distance:.0f}"
                body = f"{name:<{room}} {back:>4}"
                chosen = layer == self.layer_no and (self.head is None or self.head == head)
                style = Style(reverse=True, bold=True) if chosen else Style(color=ROLE_COLOURS.get(lab.role))
                out.append(" ")
                out.append(f"{body:<{cell - 1}}", style)
            out.append("\n")
        if self.head is None:
            out.append("mean of the layer's heads", style="bold")
            return out
        lab = s.label(self.layer_no, self.head)
        out.append(f"L{self.layer_no}H{self.head}", style="bold")
        used = len(out.plain.rsplit("\n", 1)[-1])
        for part in (lab.name, f"· prev {num(lab.previous)}", f"ind {num(lab.induction)}", f"ent {lab.entropy:.1f}b"):
            fits = used + 1 + len(part) <= self.width() - 2  # (its padding) a label never parted from its value
            out.append(f" {part}" if fits else f"\n{part}")
            used = used + 1 + len(part) if fits else len(part)
        return out

    def click(self, x: int, y: int) -> None:
        """A click on the grid selects that layer and head (rows 0 and 1 are its title and header)."""
        layer, head = y - 2, (x - 4) // self.cell_width() if x >= 4 else -1
        if 0 <= layer < self.scene.layers and 0 <= head < self.scene.heads:
            self.layer_no, self.head = layer, head

    def panel(self, cursor: int) -> Text:
        s = self.scene
        out = Text()
        if self.looking == "to":
            head = "mean" if self.head is None else f"H{self.head}"
            out.append(
                f"looked at (L{self.layer_no} {head}, sees {int(s.seen_from[cursor])}..{cursor}): ", style="bold"
            )
            keys = s.top_keys(cursor, self.layer_no, self.head)
        else:
            w = self.values(cursor)
            keys = [(int(j), float(w[j])) for j in np.argsort(-w, kind="stable")[: ex.TOP] if w[j] > 0]
            out.append(f"looked at it (L{self.layer_no}): ", style="bold")
        out.append("  ".join(f"'{self.label(j)}'@{j} {num(w)}" for j, w in keys))
        return out

    def target(self) -> tuple[int, int] | str:
        """(layer, head) that `x` takes out, or why there is none."""
        if self.head is None:
            return "choose one head to knock out ([ or ])"
        return self.layer_no, self.head

    def part_name(self, k: ex.Knockout) -> str:
        return f"L{k.layer}H{k.part}"

    # keys (the app binds them and calls these)

    def vertical(self, step: int) -> None:
        self.layer_no += step

    def bracket(self, step: int) -> None:
        head = (-1 if step > 0 else self.scene.heads) if self.head is None else self.head
        self.head = max(0, min(self.scene.heads - 1, head + step))

    def mean(self) -> None:
        self.head = None if self.head is not None else 0

    def direction(self) -> None:
        self.looking = "from" if self.looking == "to" else "to"

    def footer(self) -> list[tuple[str, str]]:
        way = "looked at" if self.looking == "to" else "looked at it"
        return [("←→", "token"), ("↑↓", "layer"), ("[]", "head"), ("a", "mean"), ("d", way), ("s", "surprisal"),
                ("x", "knock out"), ("e", "edit")]  # fmt: skip


def short_name(lab: ex.HeadLabel) -> str:
    """A head's name in a grid cell: the role's short form ('off 12' for a head at a fixed offset)."""
    if lab.name.startswith("offset"):
        return f"off {lab.offset}"
    return SHORT_ROLE.get(lab.role, lab.role)


# ---- an LSTM's or GRU's units -----------------------------------------------------------------------------


class UnitView(View):
    """The units × tokens heat map of one layer, in the order of the last search (`/`); the text shaded by the
    selected unit's gate or state (`g` picks which)."""

    layer_no = var(0)  # the selected layer (Widget.layer is Textual's own)
    unit = var(0)
    quantity = var("update")
    watch_unit = watch_quantity = View._changed

    def __init__(self, scene, tokenizer, **kw):
        super().__init__(scene, tokenizer, **kw)
        self.behaviour = "changes"
        self.order: list[int] = []
        self.scores = np.zeros(0)  # each unit's score by the behaviour
        self.quantity = "forget" if "forget" in scene.quantities else "update"
        self.set_reactive(UnitView.layer_no, scene.layers - 1)  # (its watcher would rank the units a second time)
        self.rank()

    def set_scene(self, scene) -> None:
        self.scene = scene
        try:
            self.rank()
        except ConfigError as e:  # the new text has nothing the last search ranked by: back to the first order
            self.note = Text(f"{e}; units by changes", style="yellow")
            self.rank("changes")

    def validate_layer_no(self, layer: int) -> int:
        return max(0, min(self.scene.layers - 1, layer))

    def watch_layer_no(self) -> None:
        self.rank()
        self._changed()

    def rank(self, behaviour: str | None = None) -> None:
        """Order the layer's units by a behaviour (ConfigError, and the order kept, when the text has nothing
        to rank them by: no quotes, say)."""
        order, scores = self.scene.rank_units(self.layer_no, behaviour or self.behaviour)
        self.order, self.scores, self.behaviour = order, scores, behaviour or self.behaviour
        self.unit = order[0]

    def search(self, query: str) -> str:
        """Units ranked by the behaviour the query names; the best selected. Returns what they are ranked by."""
        behaviour = ex.find_behaviour(query)
        self.rank(behaviour)
        if behaviour in ("quotes", "brackets", "line"):  # found by its memory: show that
            self.quantity = "cell state" if self.scene.has_cell else "hidden"
        self.note = Text(f"units by: {ex.BEHAVIOURS[behaviour]}{self.scene.found(behaviour)}")
        self._changed()
        return behaviour

    def shading(self, cursor: int) -> np.ndarray:
        v = self.scene.values(self.layer_no, self.quantity)[:, self.unit]
        if self.quantity in SIGNED:  # signed: scaled by the largest size
            return v / max(np.abs(v).max(), 1e-9)
        return v

    def token_styles(self, cursor: int) -> list[Style]:
        if self.quantity in SIGNED:
            return [shade(abs(x), POS_STOPS if x >= 0 else NEG_STOPS) for x in self.shading(cursor)]
        return [shade(x) for x in self.shading(cursor)]

    def draw(self) -> Text:
        """Units × tokens around the cursor, in the order of the last search; the selected unit marked."""
        s, cursor = self.scene, self.app.cursor
        cols = max(5, self.width() - 2 - 7)
        a = max(0, min(cursor - cols // 2, len(s.ids) - cols))
        b = min(len(s.ids), a + cols)
        values = s.values(self.layer_no, self.quantity)
        signed = self.quantity in SIGNED
        k = self.order.index(self.unit)
        rows = self.order[max(0, k - 2) : max(0, k - 2) + 6]
        out = Text(f"L{self.layer_no} {self.quantity}, units by {self.behaviour}\n", style="bold")
        out.append(" " * 7)
        for t in range(a, b):
            out.append((self.label(t) + " ")[0], Style(reverse=True) if t == cursor else Style(dim=True))
        out.append("\n")
        steps = len(UNICODE_RAMP)
        for u in rows:
            out.append(f"{'▸' if u == self.unit else ' '}u{u:<4} ", style="bold" if u == self.unit else "")
            top = max(np.abs(values[:, u]).max(), 1e-9) if signed else 1.0
            x = values[a:b, u] / top
            levels = np.where(np.abs(x) > 0.02, 1 + np.minimum(steps - 2, (np.abs(x) * (steps - 1)).astype(int)), 0)
            run, run_style = "", None
            for j, (level, negative) in enumerate(zip(levels.tolist(), (x < 0).tolist())):
                stops = (NEG_STOPS if negative else POS_STOPS) if signed else HEAT_STOPS
                style = shade(level / (steps - 1), stops, background=False)  # one colour a glyph: long runs
                if a + j == cursor:
                    style += CURSOR_COLUMN
                if style is not run_style and run:
                    out.append(run, run_style)
                    run = ""
                run_style = style
                run += SIGNED_RAMPS[False][1][level] if signed and negative else UNICODE_RAMP[level]
            out.append(run, run_style)
            out.append("\n")
        return out

    def click(self, x: int, y: int) -> None:
        pass

    def values_at(self, cursor: int) -> dict[str, float]:
        """The selected unit's value of every gate and state at the cursor token."""
        return {q: float(self.scene.values(self.layer_no, q)[cursor, self.unit]) for q in self.scene.quantities}

    def panel(self, cursor: int) -> Text:
        out = Text(f"L{self.layer_no} unit {self.unit} ", style="bold")
        out.append(f"(#{self.order.index(self.unit) + 1} by {self.behaviour}: {SCORE[self.behaviour]} ")
        out.append(f"{self.scores[self.unit]:.2f}): ")
        out.append(
            "  ".join(f"{q} {v:+.2f}" if q in SIGNED else f"{q} {v:.2f}" for q, v in self.values_at(cursor).items())
        )
        return out

    def target(self) -> tuple[int, int] | str:
        return self.layer_no, self.unit

    def part_name(self, k: ex.Knockout) -> str:
        return f"unit {k.part} of L{k.layer}"

    # keys

    def vertical(self, step: int) -> None:
        k = self.order.index(self.unit) + step
        self.unit = self.order[max(0, min(len(self.order) - 1, k))]

    def bracket(self, step: int) -> None:
        self.layer_no += step

    def cycle(self) -> None:
        q = self.scene.quantities
        self.quantity = q[(q.index(self.quantity) + 1) % len(q)]

    def footer(self) -> list[tuple[str, str]]:
        return [("←→", "token"), ("↑↓", "unit"), ("[]", "layer"), ("g", self.quantity), ("/", "search"),
                ("s", "surprisal"), ("x", "zero"), ("e", "edit")]  # fmt: skip
