"""`charlm attn` and `charlm gates` as functions: the numbers the viewers draw, read off a model's own forward
pass (models/probes.py), for a text and the view options (options.AttnConfig / GatesConfig). Chat's /attn and
/gates call the same functions on its running text."""

from __future__ import annotations

import difflib

from charlm.errors import ConfigError
from charlm.models import lacks
from charlm.models.probes import (
    DEFAULT_UNITS,
    Attention,
    Gates,
    capture_attention,
    choose_units,
    head_stats,
    trace_gates,
)
from charlm.options import AttnConfig, GatesConfig, LookOptions
from charlm.views.heatmap import token_label


def load_text(ckpt: str, where: LookOptions):
    """(the checkpoint, its tokens of the text the options name) for a viewer."""
    from charlm.commands.generate import read_prompt
    from charlm.storage import checkpoint

    text = read_prompt(where)
    if where.prompt == "":
        raise ConfigError("--prompt is empty: give the text to look at")
    if not text:
        raise ConfigError("no text to look at: give --prompt TEXT or --prompt-file FILE, or pipe the text in")
    ck = checkpoint.load(ckpt)
    if not (ids := ck.tokenizer.encode(text, unknown=where.unknown)):
        raise ConfigError("--prompt has no characters the model knows")
    return ck, ids


def attention(model, tokenizer, ids: list[int], opts: AttnConfig) -> Attention:
    """The attention of model (a checkpoint's, in eval mode) on the text ids, with the choices in opts."""
    if "attention" not in model.capabilities:
        if "gates" in model.capabilities:
            raise ConfigError(
                f"this {model.cfg.kind.upper()} has no attention; charlm gates (/gates in chat) shows its gates"
            )
        raise ConfigError(f"attn: {lacks(model, 'attention')}")
    cfg = model.cfg
    layer = cfg.n_layers - 1 if opts.layer is None else opts.layer
    if not 0 <= layer < cfg.n_layers:
        raise ConfigError(f"layer {layer} is out of range: this model has layers 0..{cfg.n_layers - 1}")
    if opts.head is not None and not 0 <= opts.head < cfg.n_heads:
        raise ConfigError(f"head {opts.head} is out of range: each layer has heads 0..{cfg.n_heads - 1}")
    offset, weights = capture_attention(model, ids)  # (a bad choice fails above, before the forward pass)
    focus = None if opts.focus is None else focus_position(tokenizer, ids, offset, opts.focus)
    return Attention(ids, offset, weights, head_stats(weights), layer, opts.head, focus)


def gates(model, ids: list[int], opts: GatesConfig, fits=None) -> Gates:
    """One layer's gates of model (an LSTM's or GRU's) over the text ids, with the choices in opts.
    fits(trace) -> how many units fit the screen, when opts does not say (None: the default number)."""
    if "gates" not in model.capabilities:
        if "attention" in model.capabilities:
            raise ConfigError(f"a {model.cfg.kind} has no gates; charlm attn (/attn in chat) shows its attention")
        raise ConfigError(f"gates: {lacks(model, 'gates')}")
    if not ids:
        raise ConfigError("there is no text to look at yet: give a prompt first")
    cfg = model.cfg
    layer = cfg.n_layers - 1 if opts.layer is None else opts.layer
    if not 0 <= layer < cfg.n_layers:
        raise ConfigError(f"layer {layer} is out of range: this model has layers 0..{cfg.n_layers - 1}")
    offset, traces = trace_gates(model, ids)
    trace = traces[layer]
    units = opts.units
    if units is None and fits is not None and (room := fits(trace)) is not None:  # no more than fit the screen
        units = min(DEFAULT_UNITS, trace.h.shape[-1], room)
    return Gates(ids, offset, cfg.kind, layer, trace, choose_units(trace, units), isinstance(units, list))


def focus_position(tokenizer, ids: list[int], offset: int, focus: str) -> int:
    """The position `focus` names: a number (negative: from the end), a token's text (as shown, e.g.
    '␣what', or as written, ' what'), else a piece of the text: the token holding its last character, in
    its last occurrence the model sees. On a miss, the error lists the nearest tokens."""
    if focus == "":
        return len(ids) - 1
    try:
        pos = int(focus)
    except ValueError:
        for p in range(len(ids) - 1, offset - 1, -1):  # the last token with that text
            text = tokenizer.token_bytes(ids[p]).decode("utf-8", errors="replace")
            if focus in (text, token_label(tokenizer, ids[p]), token_label(tokenizer, ids[p], ascii=True)):
                return p
        pieces = [tokenizer.token_bytes(t) for t in ids[offset:]]
        at = b"".join(pieces).rfind(focus.encode("utf-8"))
        if at >= 0:
            last, end = at + len(focus.encode("utf-8")) - 1, 0
            for p, piece in enumerate(pieces):
                end += len(piece)
                if end > last:
                    return offset + p
        if offset and focus.encode("utf-8") in b"".join(tokenizer.token_bytes(t) for t in ids):
            raise ConfigError(
                f"'{focus}' is only in the text before the last {len(ids) - offset} tokens, which the "
                f"model sees: give a position ({offset}..{len(ids) - 1}) or later text"
            ) from None
        shown = sorted({token_label(tokenizer, t) for t in ids[offset:]})
        near = difflib.get_close_matches(focus, shown, n=5, cutoff=0.3)
        hint = f"; nearest tokens: {', '.join(repr(t) for t in near)}" if near else ""
        raise ConfigError(
            f"no '{focus}' in the text the model sees{hint}; or give a position ({offset}..{len(ids) - 1})"
        ) from None
    pos = pos if pos >= 0 else len(ids) + pos
    if not offset <= pos < len(ids):
        raise ConfigError(f"focus position {focus} is outside the text the model sees ({offset}..{len(ids) - 1})")
    return pos


def copy_views(details: dict) -> tuple[tuple, tuple]:
    """Why `charlm lab copy` comes out as it does, as numbers for views.lab.render_copy_views: the
    Transformer's copy head and the LSTM's gates on the example the experiment chose (its details)."""
    from charlm.storage import checkpoint

    tf, lstm = checkpoint.load(details["transformer_run"]), checkpoint.load(details["lstm_run"])
    text, head = "\n" + details["example"], details["copy_head"]
    att = AttnConfig(layer=head["layer"], head=head["head"])
    return (
        (tf.tokenizer, attention(tf.model, tf.tokenizer, tf.tokenizer.encode(text), att)),
        (lstm.tokenizer, gates(lstm.model, lstm.tokenizer.encode(text), GatesConfig())),
    )


# ---- --json: the numbers the maps draw ------------------------------------------------------------


def _tokens(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in ids]


def attention_summary(tokenizer, att: Attention) -> dict:
    """`charlm attn --json`: the text the model sees, the chosen layer's weights (one head's, or their mean;
    weights[i][j]: how much token i looked at token j), every head's statistics, and the focus position."""
    return {
        "tokens": _tokens(tokenizer, att.ids[att.offset :]),
        "offset": att.offset,
        "layer": att.layer,
        "head": att.head,
        "weights": [[round(float(w), 5) for w in row[: i + 1]] for i, row in enumerate(att.chosen)],
        "heads": [
            {
                "layer": s.layer,
                "head": s.head,
                "entropy_bits": round(s.entropy, 4),
                "distance": round(s.distance, 4),
                "top_offset": s.offset,
                "top_offset_share": round(s.offset_share, 4),
            }
            for s in att.stats
        ],  # fmt: skip
        "focus": att.focus,
    }


def gates_summary(tokenizer, g: Gates) -> dict:
    """`charlm gates --json`: the text, the chosen units, and each gate's values (and the LSTM's cell state)
    per unit and token: values[name][k][t] is unit units[k] at token t."""
    series = {name: g.trace.gates[name] for name in g.trace.gates}
    if g.trace.c is not None:
        series["cell_state"] = g.trace.c
    return {
        "tokens": _tokens(tokenizer, g.ids[g.offset :]),
        "offset": g.offset,
        "kind": g.kind,
        "layer": g.layer,
        "units": list(g.units),
        "values": {
            name: [[round(float(v), 5) for v in t[0, :, u].tolist()] for u in g.units] for name, t in series.items()
        },
    }
