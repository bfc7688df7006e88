"""The widgets of `charlm explore`'s app (charlm/explore/app.py): the text pane shaded by attention or gates,
the grid and heat-map lines, the key help, and the shades they draw with. Textual, imported by that command
only."""

from __future__ import annotations

from functools import cache

from rich.cells import cell_len
from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from charlm.views.heatmap import HEAT_STOPS
from charlm.views.text import safe_text

SHORT_ROLE = {
    "previous-token": "prev",
    "induction": "induct",
    "local": "local",
    "global": "global",
    "distant": "distant",
}
RISE_STOPS = [(70, 20, 20), (250, 60, 60)]  # where the loss rose after a knock-out: dark to bright red
UNSEEN = Style(color="grey42")  # tokens the cursor token does not see (outside its window)
SCORE = {"changes": "spread", "saturated": "share", "quotes": "gap/sd", "brackets": "gap/sd", "line": "|r|"}
CURSOR_COLUMN = Style(bgcolor="grey30")
CURSOR = Style(reverse=True, bold=True, underline=True)
NEWLINE = "⏎"  # a newline in the one-line editor


LEVELS = 32  # shades of a scale: a key press looks its styles up instead of building thousands


def blend(stops, t: float) -> Color:
    t = min(max(t, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    return Color.from_rgb(*(round(a + (b - a) * f) for a, b in zip(stops[i], stops[i + 1])))


@cache
def _shade(level: int, stops: tuple, background: bool) -> Style:
    t = level / (LEVELS - 1)
    if background:
        return Style(bgcolor=blend(stops, t), color="black" if t > 0.55 else "white")
    return Style(color=blend(stops, t))


def shade(value: float, stops=HEAT_STOPS, background: bool = True) -> Style:
    """A background for a value in 0..1 (nothing below 0.02), with a readable foreground; or, not
    background, the value's colour for a glyph."""
    if not value > 0.02:
        return Style()
    return _shade(round(min(value, 1.0) * (LEVELS - 1)), tuple(stops), background)


def num(p: float) -> str:
    """A weight or probability in 3 characters: .62, 1.0"""
    return f"{p:.2f}"[1:] if p < 0.995 else "1.0"


def token_text(text: str) -> str:
    """A token as the text pane writes it: control characters escaped, a newline shown as ⏎ (the pane then
    breaks the line), a tab as ⇥."""
    return safe_text(text.replace("\n", "⏎\n").replace("\t", "⇥"))


# ---- the text pane ------------------------------------------------------------------------------------


class TextPane(Widget):
    """The text, token by token, wrapped to the pane's width; shows the lines around the cursor (windowing).
    A click moves the cursor to the token under it."""

    DEFAULT_CSS = "TextPane { height: 1fr; min-height: 3; padding: 0 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.texts: list[str] = []
        self.styles_of = lambda: [Style()] * len(self.texts)
        self.cursor = 0
        self.top = 0
        self._layout: tuple[int, list] | None = None  # (width, lines of (token, piece))
        self._frame: tuple | None = None  # ((width, height), the visible lines as strips)

    def set_text(self, texts: list[str]) -> None:
        self.texts = [token_text(t) for t in texts]
        self._layout = None
        self._frame = None
        self.top = 0

    def lines(self, width: int) -> list[list[tuple[int, str]]]:
        """Every line of the wrapped text: (token index, piece of its text) segments."""
        if self._layout and self._layout[0] == width:
            return self._layout[1]
        lines, line, used = [], [], 0
        for t, text in enumerate(self.texts):
            for k, part in enumerate(text.split("\n")):
                if k:  # the token held a newline: break after its ⏎
                    lines.append(line)
                    line, used = [], 0
                while part:
                    room = width - used
                    if room <= 0:
                        lines.append(line)
                        line, used = [], 0
                        continue
                    piece, n = "", 0
                    for ch in part:  # as many characters as fit
                        w = cell_len(ch)
                        if n + w > room:
                            break
                        piece, n = piece + ch, n + w
                    if not piece:  # a wide character at a line's end
                        lines.append(line)
                        line, used = [], 0
                        continue
                    line.append((t, piece))
                    used += n
                    part = part[len(piece) :]
            if not text:
                line.append((t, "∅"))
                used += 1
        lines.append(line)
        self._layout = (width, lines)
        return lines

    def line_of(self, lines, token: int) -> int:
        for y, line in enumerate(lines):
            if any(t == token for t, _ in line):
                return y
        return 0

    def redraw(self) -> None:
        """The cursor or the shading changed: lay out the visible lines again on the next paint."""
        self._frame = None
        self.refresh()

    def frame(self) -> list[Strip]:
        """The visible lines as strips (Textual's line API: no markup or wrapping pass on a key press)."""
        width, height = max(1, self.content_size.width), max(1, self.content_size.height)
        if self._frame is not None and self._frame[0] == (width, height):
            return self._frame[1]
        lines = self.lines(width)
        y = self.line_of(lines, self.cursor)
        if y < self.top:
            self.top = y
        elif y >= self.top + height:
            self.top = y - height + 1
        self.top = max(0, min(self.top, max(0, len(lines) - height)))
        styles = self.styles_of()
        strips = []
        for line in lines[self.top : self.top + height]:
            segments = [Segment(piece, styles[t] + CURSOR if t == self.cursor else styles[t]) for t, piece in line]
            strips.append(Strip(segments).extend_cell_length(width).crop(0, width))
        self._frame = ((width, height), strips)
        return strips

    def render_line(self, y: int) -> Strip:
        strips = self.frame()
        return strips[y] if y < len(strips) else Strip.blank(max(1, self.content_size.width))

    def text(self) -> str:
        """What the pane shows, as plain text (for tests)."""
        return "\n".join(strip.text for strip in self.frame())

    def token_at(self, x: int, y: int) -> int | None:
        lines = self.lines(max(1, self.content_size.width))
        row = self.top + y
        if not 0 <= row < len(lines):
            return None
        used = 0
        for t, piece in lines[row]:
            used += cell_len(piece)
            if x < used:
                return t
        return lines[row][-1][0] if lines[row] else None

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is not None and (t := self.token_at(offset.x, offset.y)) is not None:
            self.app.move_to(t)


class Lines(Widget):
    """Rich Text drawn line by line, cropped, never wrapped (Textual's line API: a key press repaints it
    without a markup or wrapping pass; a view breaks its own long lines). The head grid and the units x tokens
    map."""

    DEFAULT_CSS = "Lines { height: 100%; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self._text = Text()
        self._strips: list[Strip] | None = None

    def update(self, text: Text, layout: bool = False) -> None:
        self._text, self._strips = text, None
        self.refresh(layout=layout)

    def render(self) -> Text:  # (what tests read: the text shown)
        return self._text

    def render_line(self, y: int) -> Strip:
        width = max(1, self.content_size.width)
        if self._strips is None:
            segments = self._text.render(self.app.console, end="")
            self._strips = [Strip(line).crop_extend(0, width, None) for line in Segment.split_lines(segments)]
        return self._strips[y] if y < len(self._strips) else Strip.blank(width)

    def on_resize(self, event) -> None:
        self._strips = None

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is not None:
            self.app.grid_click(offset.x, offset.y)
