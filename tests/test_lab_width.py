"""lab width: every width of both families scored at every P beside 1/P, the budget each used, and a break point
read as a limit only where the models stopped on a plateau."""

from charlm.lab import width
from charlm.lab.training import Plateau


def test_width_scores_every_width_at_every_p_and_says_where_the_cap_stopped_it(tmp_path):
    tiny = dict(
        pairs=(2, 4),
        widths={"lstm": (8, 16), "transformer": (16,)},
        plateau={"transformer": Plateau(20, 40), "lstm": Plateau(20, 40)},
        train_chars=20_000,
        eval_examples=20,
    )
    out = width.run(tmp_path, seed=0, progress=lambda m: None, **tiny)
    got = {(r["model"], r["width"], r["pairs"]) for r in out.results}
    assert got == {("lstm", w, p) for w in (8, 16) for p in (2, 4)} | {("transformer", 16, p) for p in (2, 4)}
    for r in out.results:
        assert r["no_binding"] == 1 / r["pairs"] and 0 <= r["accuracy"] <= 1
        assert all(0 < s <= 40 for s in r["steps_per_seed"]) and r["cpu_seconds"] > 0
    capped = [r for r in out.results if r["capped"]]
    assert ("at its cap" in out.reading) == bool(capped)
    if capped:
        assert "what this budget taught" in out.reading


def test_the_break_is_the_largest_p_every_seed_answers():
    rows = [
        {"pairs": 2, "lowest": 0.99},
        {"pairs": 4, "lowest": 0.95},
        {"pairs": 8, "lowest": 0.5},
        {"pairs": 16, "lowest": 0.95},
    ]
    assert width.holds_up_to(rows) == 4
    assert width.holds_up_to([{"pairs": 2, "lowest": 0.3}]) == 0


def test_width_task_copy_scores_n_against_width_beside_chance(tmp_path):
    """charlm lab width --task copy --quick: copy at every N for every width, chance and the best shortcut (no
    shortcut beats chance: the symbols are independent) beside each score, steps and CPU-seconds a model. At
    N = 2 the Transformer and the widest LSTM are well above chance (81-91% and 95-100% in seeds 0-3)."""
    import json

    from click.testing import CliRunner

    from charlm.cli import main

    r = CliRunner().invoke(main, ["lab", "width", "--task", "copy", "--quick", "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["settings"]["task"] == "copy" and "pairs" not in out["settings"]
    records = out["results"]
    got = {(r["model"], r["width"], r["length"]) for r in records}
    assert got == {("lstm", w, n) for w in (8, 32) for n in (2, 4, 8)} | {("transformer", 16, n) for n in (2, 4, 8)}
    for rec in records:
        assert rec["chance"] == rec["shortcut"] == 0.1 and 0 <= rec["accuracy"] <= 1
        assert all(0 < s <= 200 for s in rec["steps_per_seed"]) and rec["cpu_seconds"] > 0
    at2 = {(rec["model"], rec["width"]): rec["accuracy"] for rec in records if rec["length"] == 2}
    assert at2[("transformer", 16)] >= 0.1 + 0.4 and at2[("lstm", 32)] >= 0.1 + 0.4
    assert "Copy accuracy against N" in out["reading"] and "no shortcut beats" in out["reading"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("width-copy-")) == [
        "width-copy-lstm-w32-s0", "width-copy-lstm-w8-s0", "width-copy-transformer-w16-s0"
    ]  # fmt: skip
