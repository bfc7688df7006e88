"""`?` in `charlm explore` (charlm/explore/app.py): two pages, the keys and a legend that says what every label,
colour and number on the screen means and how it was measured. Textual, imported by that command only."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from charlm.commands import explore as ex
from charlm.models.inspect import INDUCTION, LOCAL, PREVIOUS

TRANSFORMER_KEYS = [
    ("← →", "move the cursor a token (Home, End: the ends; or click a token)"),
    ("↑ ↓", "the layer"),
    ("[ ]", "the head (or click a cell of the grid)"),
    ("a", "the mean of the layer's heads"),
    ("d", "direction: where the cursor token looked / which tokens looked at it"),
    ("s", "shade by surprisal (bits) instead; s again: back"),
    ("x", "knock out the selected head: bits/char change, shading where the loss rose; x again or Esc: back"),
    ("e", "edit the text and re-run"),
    ("?", "this help (Tab: the other page)"),
    ("q", "quit (or Ctrl-C)"),
]
RNN_KEYS = [
    ("← →", "move the cursor a token (Home, End: the ends; or click a token)"),
    ("↑ ↓", "the unit (next in the order of the last search)"),
    ("[ ]", "the layer"),
    ("g", "what shades the text: each gate, the cell state, the hidden state"),
    ("/", "search units by behaviour: " + ", ".join(ex.BEHAVIOURS) + " (newline = line)"),
    ("s", "shade by surprisal (bits) instead; s again: back"),
    ("x", "zero the unit: bits/char change, shading where the loss rose; x again or Esc: back"),
    ("e", "edit the text and re-run"),
    ("?", "this help (Tab: the other page)"),
    ("q", "quit (or Ctrl-C)"),
]

COMMON = [
    (
        "title",
        "the run · the model · tokens explored · bits/char: the model's surprisal of every token after the "
        "first, summed in bits, over the characters of those tokens (lower: it predicts the text better)",
    ),
    ("cursor", "the reversed, underlined token; the panel beside the grid describes it"),
    (
        "surprisal",
        "-log2 p(token | the tokens before), in bits; `s` shades every token by it (dark to yellow, "
        "scaled to the text's 95th percentile)",
    ),
    ("next:", "the model's five likeliest next tokens after the cursor, with their probabilities"),
    (
        "red shading",
        "after x: how many bits each token's surprisal rose without the part knocked out (dark to "
        "bright red, scaled to the largest rise); 'without …: B bits/char (+Δ)' is the text's new bits/char",
    ),
]
TRANSFORMER_LEGEND = [
    (
        "text colour",
        "attention of the cursor token (d: to the cursor token) in the selected head, each token's "
        "weight scaled to the largest: dark purple (little) to yellow (most); grey: tokens it cannot see",
    ),
    (
        "windows of C",
        "the text is longer than the model's context C: it is read in windows of C tokens that "
        "advance by C/2 (as charlm eval reads), so every token sees between C/2 and C tokens before it",
    ),
    (
        "grid",
        "rows L0, L1…: the layers; columns H0, H1…: the heads of a layer; each cell: the head's role and "
        "how many tokens back it looks (its attention-weighted mean distance, over every token of this text)",
    ),
    (
        "roles",
        f"lab heads' rule on scores measured on this text: induct (induction, ind ≥ {INDUCTION}), prev "
        f"(previous-token, prev ≥ {PREVIOUS}), local (looks at most {LOCAL} tokens back), global (attention "
        "spread: entropy at least half a uniform row's), distant (focused, far back); off N: distant, but its "
        "strongest key is N tokens back for most tokens",
    ),
    ("colours", "cyan prev, magenta induct, green local, grey global, yellow distant; reversed: the selection"),
    ("prev", "the head's mean weight on the token just before (1.0: it always looks one back)"),
    (
        "ind",
        "its mean weight on the tokens that followed earlier occurrences of the current token (what an "
        "induction head copies), over the tokens that have one",
    ),
    ("ent", "the mean entropy of its attention rows, in bits (0: one token; log2 n: spread evenly over n)"),
    (
        "looked at",
        "the five tokens the cursor token attended to most: 'token'@position weight; sees a..i: the "
        "tokens its window shows it",
    ),
]
RNN_LEGEND = [
    (
        "heat map",
        "units (rows, u12) × tokens (columns, the cursor's column lit): the unit's gate or state at "
        "each token; glyph height and colour: its size (gates 0 to 1: dark purple to yellow)",
    ),
    (
        "gates",
        "LSTM: input (how much new is written), forget (how much of the cell state is kept: 1 keeps "
        "all), cell (the candidate written), output (how much of the cell state is shown); GRU: reset, update "
        "(how much of the old state is kept), new (the candidate)",
    ),
    (
        "cell state",
        "the LSTM's memory (hidden: what it shows the next layer): orange above 0, blue below 0, "
        "brightness its size scaled to the unit's largest on this text",
    ),
    ("text colour", "the selected unit's quantity (g cycles it) at each token, as in the heat map"),
    (
        "#k by …",
        "the unit's rank by the last search, and its score: spread (changes: the sum over its gates of "
        "their standard deviation over the text), share (saturated: how often its gates are under 0.1 or over "
        "0.9), gap/sd (quotes, brackets: mean memory inside minus outside, over its standard deviation), |r| "
        "(line: its memory's correlation with the characters since the last newline)",
    ),
    (
        "quotes",
        "inside any of ' \" “ ” ‘ ’ « » as the text uses them (' between two letters is an apostrophe); "
        "brackets: inside ( ) [ ] { } < >",
    ),
    ("zero", "x holds the unit's hidden state at 0 at every step (lab ablate's intervention) and re-reads"),
]


def page(title: str, rows: list[tuple[str, str]]) -> Group:
    """A title, then a key or label beside what it means (wrapped with a hanging indent)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(justify="right", style="bold", no_wrap=True)
    table.add_column(ratio=1)
    for key, what in rows:
        table.add_row(key, what)
    return Group(Text(title, style="bold"), table)


class Help(ModalScreen):
    """`?`: the keys, Tab: the legend; ↑↓ PgUp PgDn scroll, any other key closes it."""

    DEFAULT_CSS = """
    Help { align: center middle; }
    Help > VerticalScroll { width: 110; max-width: 96%; height: auto; max-height: 96%; border: round $accent;
        background: $surface; }
    Help Static { width: 100%; padding: 0 1; }
    """
    SCROLL = {"up": "scroll_up", "down": "scroll_down", "pageup": "page_up", "pagedown": "page_down",
              "home": "scroll_home", "end": "scroll_end"}  # fmt: skip

    def __init__(self, rnn: bool):
        super().__init__()
        keys = RNN_KEYS if rnn else TRANSFORMER_KEYS
        legend = COMMON + (RNN_LEGEND if rnn else TRANSFORMER_LEGEND)
        self.pages = [
            page("Keys (Tab: what every label means; any other key closes this)", keys),
            page("What you see, and how it was measured (Tab: keys; ↑↓ scroll)", legend),
        ]
        self.shown = 0

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.pages[0])

    def on_key(self, event) -> None:
        event.stop()
        if self.app.screen is not self:  # a second key queued before the first one closed it
            return
        if event.key in ("tab", "question_mark"):
            self.shown = 1 - self.shown
            self.query_one(Static).update(self.pages[self.shown])
            self.query_one(VerticalScroll).scroll_home(animate=False)
        elif event.key in self.SCROLL:
            getattr(self.query_one(VerticalScroll), self.SCROLL[event.key])(animate=False)
        else:
            self.dismiss()
