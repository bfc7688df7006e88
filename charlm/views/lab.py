"""Draw a lab result: its table, its chart and its reading. Numbers in, text out."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm.views.plot import line_chart

HIDDEN = ("run", "head_id", "train_seconds")  # record keys the table leaves to --json (and the chart): a rerun
# with the same seeds prints the same table, so no timings in it


def _cell(v) -> str:
    if isinstance(v, list):  # e.g. every seed's score
        return " ".join(_cell(x) for x in v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "—" if v is None else str(v)


def results_table(records: list[dict], title: str) -> Table:
    keys = [k for k in dict.fromkeys(k for r in records for k in r) if k not in HIDDEN]
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    for k in keys:
        table.add_column(k.replace("_", " "), justify="left" if isinstance(records[0].get(k), str) else "right")
    for r in records:
        table.add_row(*(_cell(r.get(k)) for k in keys))
    return table


def chart_text(result, width: int, color: bool) -> str | None:
    c = result.chart
    if c is None:
        return None
    series: dict[str, tuple[list, list]] = {}
    keys = c.y if isinstance(c.y, tuple) else (c.y,)
    for r in result.results:  # one line per value of c.series for the first y key, one per other y key
        for y in keys:
            if r.get(y) is None or r.get(c.x) is None:
                continue
            shared = c.series is not None and y != keys[0]  # a baseline beside every series: one line
            name = str(r[c.series]) if c.series and not shared else y.replace("_", " ")
            xs, ys = series.setdefault(name, ([], []))
            if shared and r[c.x] in xs:
                continue
            xs.append(r[c.x])
            ys.append(r[y])
    if not series:
        return None
    return line_chart(
        series, width=min(width, 90), height=16, xlabel=c.xlabel, ylabel=c.ylabel, xlog=c.xlog, ylog=c.ylog, color=color
    )


def render_lab(console: Console, result, color: bool = True, views=None) -> None:
    """An experiment's tables, chart and reading; with views (commands.lab.LabRun's), why it came out so."""
    console.print(results_table(result.results, f"charlm lab {result.experiment}"))
    if result.details.get("summary"):  # one row per model or size, read off the records
        console.print(results_table(result.details["summary"], "summary"))
    chart = chart_text(result, console.width, color)
    if chart:
        console.print(Text.from_ansi(chart) if color else Text(chart), no_wrap=True, overflow="crop")
    console.print()
    console.print(Text(result.reading))
    if result.runs:
        console.print(Text(f"models: {', '.join(result.runs)} ({result.seconds:.0f} s in all)", style="dim"))
    elif result.seconds:
        console.print(Text(f"({result.seconds:.0f} s)", style="dim"))
    if views is not None:
        from charlm.views.heatmap import Screen

        render_copy_views(console, result.details, *views, Screen.of(console, not color))


def render_list(console: Console, experiments: dict[str, str]) -> None:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    for name, summary in experiments.items():
        table.add_row(Text(name, style="bold"), summary)
    console.print(Text("charlm lab NAME: small controlled experiments on the two kinds of memory", style="bold"))
    console.print(table)


def render_copy_views(console: Console, details: dict, attention, gates, screen) -> None:
    """Why copy comes out as it does: the Transformer's copy head on one example (the offset diagonal), then
    the LSTM's gates on the same example, drawn by the attention and gate viewers. attention, gates:
    (tokenizer, commands.look.Attention / Gates) of the runs named in details, on its example."""
    from charlm.options import AttnConfig, GatesConfig
    from charlm.views.attention import draw_attention
    from charlm.views.gates import draw_gates

    head = details["copy_head"]
    console.print()
    console.print(
        Text(
            f"Why — the Transformer's layer {head['layer']} head {head['head']} on one held-out line "
            f"(N={details['length']}; one model learned every length): where the copied half looks",
            style="bold",
        )
    )
    tokenizer, att = attention
    draw_attention(console, tokenizer, att, AttnConfig(layer=head["layer"], head=head["head"]), screen)
    console.print()
    console.print(
        Text(
            "… and the LSTM's gates on the same example: everything to copy must pass through its cell state",
            style="bold",
        )
    )
    tokenizer, g = gates
    draw_gates(console, tokenizer, g, GatesConfig(), screen)
    console.print(
        Text(
            f"(again: charlm attn {details['transformer_run']} --layer {head['layer']} --head {head['head']} "
            f"--prompt TEXT · charlm gates {details['lstm_run']} --prompt TEXT)",
            style="dim",
        )
    )
