"""models/inspect.py and the families' capabilities (issue 36): one knock-out, so `charlm explore` and `lab ablate`
give the same numbers on every kind of run (a lab run scored on its trained positions, a recall run that reads a
filler in place of each answer, an ordinary run, a run with heads or units pruned, an int8 one); mean-ablation
beside zero-ablation; what a family cannot do refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from charlm.commands import explore as ex
from charlm.config import ModelConfig
from charlm.data import READS, TARGETS, bits_per_char, trained_positions
from charlm.lab import ablate, heads
from charlm.models import Part, build_model
from charlm.models.inspect import knocked, nats, token_nats
from charlm.storage import checkpoint
from tests.conftest import VIEW_TEXT, cli, saved_model, tiny_train, train_runs

TEXT = VIEW_TEXT[:40]  # one window of every run below


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    """A lab run (corpus.txt and its targets mask beside the checkpoint): a 2-layer Transformer, 40 steps of
    copying 4 to 6 symbols."""
    from charlm.lab import tasks
    from charlm.lab.training import lab_trainer

    root = tmp_path_factory.mktemp("inspect-lab")
    data = tasks.corpus("copy", (4, 6), 4000, 0, heldout=True)
    cfg = ModelConfig(kind="transformer", vocab_size=tasks.vocab_size("copy"), n_layers=2, d_model=32, n_heads=2,
                      context=14, dropout=0.0)  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHARLM_CACHE", str(root / "cache"))
        lab_trainer(data, root / "run", cfg, tiny_train(40)).fit()
    return root / "run"


def _recall_run(root, kind: str):
    """A recall lab run (its model reads the filler '.' in place of each answer, as lab recall trains it): 40 steps
    of P = 2 and 3, one line a window."""
    from charlm.lab import tasks
    from charlm.lab.training import lab_trainer

    context = tasks.example_length("recall", 3) + 1
    data = tasks.corpus("recall", (2, 3), 6000, 0, pad=context - 1, heldout=True)
    cfg = ModelConfig(kind=kind, vocab_size=tasks.vocab_size("recall"), n_layers=2, d_model=32, n_heads=2,
                      context=context, dropout=0.0, positions="learned")  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHARLM_CACHE", str(root / "cache"))
        lab_trainer(data, root / kind, cfg, tiny_train(40)).fit()
    return root / kind


@pytest.fixture(scope="module")
def recall_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect-recall")
    return {kind: _recall_run(root, kind) for kind in ("transformer", "lstm")}


@pytest.fixture(scope="module")
def runs(view_runs, lab_run, recall_runs, tmp_path_factory):
    """Every kind of run: ordinary (Transformer, LSTM, GRU), heads pruned, units pruned, int8; and the lab run."""
    root = tmp_path_factory.mktemp("inspect-runs")
    four = ModelConfig(kind="transformer", n_layers=2, d_model=32, n_heads=4, context=48)  # 3 heads of 8 when pruned
    (root / "four").mkdir()
    tf4 = train_runs(root / "four", VIEW_TEXT, {"tf4": (four, tiny_train(20))})["tf4"]
    made = {"tf": view_runs["tf"], "lstm": view_runs["lstm"], "gru": view_runs["gru"], "lab": lab_run}
    made |= {"recall": recall_runs["transformer"], "recall-lstm": recall_runs["lstm"]}
    for name, run, flags in (
        ("heads-pruned", tf4, ["--drop-heads", "1"]),
        ("units-pruned", view_runs["lstm"], ["--drop-units", "5"]),
        ("int8", view_runs["tf"], ["--bits", "8"]),
        ("gru-int8-pruned", view_runs["gru"], ["--bits", "8", "--drop-units", "3"]),
    ):
        r = cli("compress", run, "--to", root / name, "--tokens", "512", *flags)
        assert r.exit_code == 0, r.output
        made[name] = root / name
    return made


@pytest.mark.parametrize(
    "kind",
    ["lab", "recall", "recall-lstm", "tf", "lstm", "gru", "heads-pruned", "units-pruned", "int8", "gru-int8-pruned"],
)
def test_explore_and_lab_ablate_knock_out_the_same(runs, kind, tmp_path):
    """Every head (or the units lab ablate zeroes) knocked out in explore changes bits/char by what lab ablate
    says, on the same text: one window (--rows 1); a lab run's first example window, scored on its trained
    positions (a recall run's reading its filler). Before: explore used d_model // n_heads as a pruned model's
    head size, ablate crashed on a pruned LSTM, and explore scored every position of a lab run."""
    ck = checkpoint.load(runs[kind])
    lab = kind.startswith(("lab", "recall"))
    if lab:
        result = ablate.run(str(ck.path), rows=1, units=1)
        body = (ck.path.parent / "corpus.txt").read_text(encoding="utf-8")
        at = body.index("\n")  # the first example's window, as lab ablate reads it
        ids = ck.tokenizer.encode(body[at : at + ck.model_config.context + 1])
    else:
        (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
        result = ablate.run(str(ck.path), text=str(tmp_path / "t.txt"), rows=1, units=1)
        ids = ck.tokenizer.encode(TEXT)
    scene = ex.scene(ck.model, ck.tokenizer, ids, ex.trained(ck, ids))
    assert scene.scored == (ex.TRAINED if lab else ex.EVERY)
    assert (scene.reads != scene.ids) == kind.startswith("recall")  # the filler read in place of each answer
    assert scene.bpc == pytest.approx(result.settings["baseline_bits_per_char"], abs=2e-4)
    assert max(abs(r["damage"]) for r in result.results) > 2e-3  # knock-outs that change something
    compared = 0
    for r in result.results:
        if r["part"].startswith("head "):
            which = int(r["part"].split()[1])
        elif "units" in r:
            which = r["units"][0]
        else:
            continue  # a gate held at 0 or 1: explore does not offer it
        assert ex.knock(ck.model, scene, r["layer"], which).change == pytest.approx(r["damage"], abs=2e-4), r
        compared += 1
    assert compared == ck.model_config.n_layers * (
        ck.model_config.n_heads if "attention" in ck.model.capabilities else 2
    )


def test_explore_on_a_lab_run_scores_only_its_trained_positions(runs):
    """Its default text (the start of its corpus.txt): bits/char over the characters the task determines, as
    the run was trained; the same text given as any other scores every position."""
    ck = checkpoint.load(runs["lab"])
    ids = ck.tokenizer.encode(ex.corpus_start(ck))
    lab = ex.trained(ck, ids)
    mask = trained_positions(ck.path.parent / "corpus.txt", ids, ck.tokenizer)
    keep = lab.keep
    assert keep.tolist() == mask[1:].tolist() and 0 < keep.sum() < len(keep) and lab.reads == ids  # copy: no filler
    scene = ex.scene(ck.model, ck.tokenizer, ids, lab)
    every = ex.scene(ck.model, ck.tokenizer, ids)
    assert (scene.scored, every.scored) == ("trained positions", "every position")
    want = bits_per_char(float(every.nats[keep].sum()), chars=int(keep.sum()))  # one character a token
    assert scene.bpc == pytest.approx(want, rel=1e-6) and scene.bpc != pytest.approx(every.bpc, abs=1e-3)
    nowhere = ck.tokenizer.encode(ex.corpus_start(ck)[:3] * 6)  # the alphabet's first letters, over and over
    assert ex.trained(ck, nowhere) is None and ex.scene(ck.model, ck.tokenizer, nowhere).scored == "every position"


def _corpus_lines(run, rows: int):
    """The first `rows` examples of a recall run's corpus.txt, as the lab's own Examples (targets from its mask)."""
    from charlm.lab import tasks

    body = (run / "corpus.txt").read_text(encoding="utf-8")
    mask = np.load(run / TARGETS)
    out, at = [], 0
    for n, line in enumerate(body.split("\n")):
        if n and line:  # the first line is the alphabet; padding is empty lines
            out.append(tasks.Example(line, [i for i in range(len(line)) if mask[at + i]], tasks.FILL))
        at += len(line) + 1
    return out[:rows]


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_lab_ablate_scores_a_recall_run_as_the_lab_s_own_scorer_does(recall_runs, kind, tmp_path):
    """With nothing knocked out, lab ablate's bits/char on a recall run's first lines equal the lab's own scorer's
    (scoring.scored: each tasks.Example reads its filler, an independent path) on the same lines, and differ from
    the model reading the answers, which lab ablate did before the run recorded its filler (data.READS). A run
    saved before that record opens and is scored as before, with a one-line note; a damaged record is one line."""
    import shutil

    from charlm.errors import ConfigError
    from charlm.lab import scoring

    rows = 4
    ck = checkpoint.load(recall_runs[kind])
    lines = _corpus_lines(recall_runs[kind], rows)
    assert all(len(e.targets) in (2, 3) and e.inputs.count(".") == len(e.targets) for e in lines)
    filled = bits_per_char(scoring.scored(ck.model, ck.tokenizer, lines)[1])
    answers = [type(e)(e.text, e.targets) for e in lines]  # the same lines, the answers read
    as_read_before = bits_per_char(scoring.scored(ck.model, ck.tokenizer, answers)[1])
    assert abs(filled - as_read_before) > 5e-3  # the two inputs are told apart
    result = ablate.run(str(ck.path), rows=rows, units=1)
    assert result.settings["baseline_bits_per_char"] == pytest.approx(filled, abs=2e-4)
    assert "saved before" not in result.reading

    old = tmp_path / "old"
    shutil.copytree(recall_runs[kind], old, ignore=shutil.ignore_patterns("*.lock", "cache"))
    (old / READS).unlink()
    result = ablate.run(str(old), rows=rows, units=1)
    assert result.settings["baseline_bits_per_char"] == pytest.approx(as_read_before, abs=2e-4)
    assert "saved before charlm kept what its model reads" in result.reading
    (old / READS).write_text("xy", encoding="utf-8")
    with pytest.raises(ConfigError, match="is damaged"):
        ablate.run(str(old), rows=rows, units=1)


@pytest.mark.parametrize("kind", ["transformer", "lstm", "gru"])
def test_mean_ablation_keeps_a_part_s_average_and_zero_ablation_removes_it(kind):
    """Read one position, a part's mean over the positions read is its own value: mean-ablation changes nothing
    and zero-ablation does; over several positions both change the logits, differently."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind=kind, vocab_size=11, n_layers=2, d_model=16, n_heads=2, context=8)).eval()
    part = Part(1, model.PART, (0,))
    one, many = torch.tensor([[3]]), torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        intact = model(one)[0], model(many)[0]
        with knocked(model, part, "mean"):
            mean = model(one)[0], model(many)[0]
        with knocked(model, part, "zero"):
            zero = model(one)[0], model(many)[0]
    torch.testing.assert_close(mean[0], intact[0], atol=1e-5, rtol=0)
    assert not torch.allclose(zero[0], intact[0], atol=1e-4)
    assert not torch.allclose(mean[1], intact[1], atol=1e-4) and not torch.allclose(mean[1], zero[1], atol=1e-4)
    torch.testing.assert_close(model(many)[0], intact[1])  # the knock-out ends with its block


def test_a_knocked_out_unit_is_the_one_the_python_equations_zero():
    """The RNN's knock_out (fused layers below and above, the layer stepped in Python) equals every layer
    stepped in Python with the unit zeroed (probes.trace_rnn's intervention)."""
    from charlm.models.probes import trace_rnn, zero_units

    torch.manual_seed(1)
    model = build_model(ModelConfig(kind="lstm", vocab_size=11, n_layers=3, d_model=16, context=8)).eval()
    ids = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        with knocked(model, Part(1, "unit", (2, 5))):
            got = nats(model(ids[:, :-1])[0], ids)
        h = trace_rnn(model.rnn, model.tok_emb(ids[:, :-1]), intervene=zero_units(1, [2, 5]))[-1].h
        assert got == pytest.approx(nats(model.head(h), ids), abs=1e-5)
        each = token_nats(model(ids[:1])[0][0], ids[0].tolist())  # (8,): one a target
        assert each.mean() == pytest.approx(nats(model(ids[:1, :-1])[0], ids[:1]), abs=1e-5)


def test_lab_heads_suggests_pruning_only_where_compress_can(tmp_path):
    """An untrained model's heads attend alike (twins); lab heads calls them candidates for pruning, except on an
    ALiBi model, whose heads charlm compress refuses to drop (each head's slope follows their number)."""
    readings = {}
    for positions in ("rope", "alibi"):
        torch.manual_seed(0)
        model = build_model(ModelConfig(kind="transformer", vocab_size=12, n_layers=1, d_model=16, n_heads=2,
                                        context=16, positions=positions))  # fmt: skip
        checkpoint.save(saved_model(model, "abcdefghijk\n"), tmp_path / positions / "best.safetensors")
        readings[positions] = heads.run(str(tmp_path / positions)).reading
    assert (
        "attend almost like another one" in readings["alibi"] and "attend almost like another one" in readings["rope"]
    )
    assert "candidates for pruning" in readings["rope"] and "candidates for pruning" not in readings["alibi"]
    assert "cannot be pruned" in readings["alibi"]


def test_induction_knocks_each_head_and_layer_out_by_zero_and_by_mean_ablation():
    """lab induction's causal test, both ways: every head alone and every layer at once, on the repeat's
    positions; a knock-out of the heads it is measured on changes the loss, and the two ablations differ."""
    from charlm.lab import induction, tasks
    from charlm.tokenizer import CharTokenizer

    tok = CharTokenizer(sorted(set(tasks.alphabet("induction") + "\n")))
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="transformer", vocab_size=tok.vocab_size, n_layers=2, d_model=32, n_heads=2,
                                    context=17))  # fmt: skip
    fresh = tasks.examples("induction", 6, 3, 0) + tasks.examples("induction", 8, 3, 1)
    zero = induction.repeat_losses(model, tok, fresh)
    mean = induction.repeat_losses(model, tok, fresh, mode="mean")
    assert set(zero) == set(mean) == {"none", "L0H0", "L0H1", "L1H0", "L1H1", "L0", "L1"}
    assert zero["none"] == mean["none"] and zero["L1"] != zero["none"]
    assert any(abs(zero[k] - mean[k]) > 1e-3 for k in ("L0", "L1"))


@pytest.mark.parametrize("head", [0, 1, 2])
def test_knocking_a_head_out_is_slicing_it_out_on_a_pruned_shape(head):
    """On a model already pruned (3 heads of 8 in a width of 32: not d_model // n_heads), a head knocked out
    gives the logits of the model with that head sliced out (the family's prune), which holds the knock-out to
    the config's head size."""
    from dataclasses import replace

    from charlm.models import family

    torch.manual_seed(head)
    cfg = ModelConfig(kind="transformer", vocab_size=11, n_layers=1, d_model=32, n_heads=3, head_dim=8, context=8)
    model = build_model(cfg).eval()
    importance = torch.ones(1, 3).numpy()
    importance[0, head] = 0.0
    small_cfg, state, dropped = family("transformer").prune(cfg, model.state_dict(), importance, 1)
    assert dropped == [(0, head)] and small_cfg == replace(cfg, n_heads=2)
    small = build_model(small_cfg).eval()
    small.load_state_dict(state)
    ids = torch.randint(0, 11, (2, 8))
    with torch.no_grad(), knocked(model, Part(0, "head", (head,))):
        torch.testing.assert_close(model(ids)[0], small(ids)[0], atol=1e-5, rtol=1e-5)
