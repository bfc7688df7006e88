"""lab forgetting: each arm's gate is what it says through training (pinned rows stay pinned, a fixed gate is
trained fixed, not clamped after), the step-by-step cell is the fused one where it should be, and the experiment
reports every arm on both tasks beside the free gate and the no-binding baseline."""

import pytest
import torch

from charlm.lab import forgetting
from charlm.lab.forgetting import GATES, ArmLSTM, Cell


def batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 7, (4, 9), generator=g)
    return x, torch.roll(x, -1, 1)


@pytest.mark.parametrize("gate", ["forget", "input", "output"])
def test_a_fixed_gate_is_open_through_training(gate):
    torch.manual_seed(0)
    model = ArmLSTM(7, 8, f"{gate}=1", 9)
    forgetting.train(model, batch, 5, 1e-2)
    rows = slice(GATES[gate] * 8, (GATES[gate] + 1) * 8)
    rnn = model.rnn
    assert torch.all(rnn.weight_ih_l0[rows] == 0) and torch.all(rnn.weight_hh_l0[rows] == 0)
    assert torch.all(torch.sigmoid(rnn.bias_ih_l0[rows] + rnn.bias_hh_l0[rows]) == 1)  # open, in float32
    other = slice(GATES["cell"] * 8, (GATES["cell"] + 1) * 8)
    assert torch.any(rnn.weight_ih_l0[other] != ArmLSTM(7, 8, f"{gate}=1", 9).rnn.weight_ih_l0[other])


def test_a_constant_forget_gate_learns_its_bias_and_nothing_else():
    torch.manual_seed(0)
    model = ArmLSTM(7, 8, "constant", 9)
    before = model.rnn.bias_ih_l0[8:16].clone()
    forgetting.train(model, batch, 5, 1e-2)
    assert torch.all(model.rnn.weight_ih_l0[8:16] == 0) and torch.all(model.rnn.weight_hh_l0[8:16] == 0)
    assert not torch.equal(model.rnn.bias_ih_l0[8:16], before)  # learned: one constant per unit


def test_the_step_by_step_cell_starts_as_the_free_lstm():
    """meta's controller starts at zero and floor's floor is the only change: with the floor at 0 and the same
    weights, both compute what nn.LSTM computes."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, 6, batch_first=True)
    x = torch.randn(3, 7, 5)
    for design in ("meta", "floor"):
        cell = Cell(5, 6, design)
        with torch.no_grad():
            cell.ih.weight.copy_(lstm.weight_ih_l0)
            cell.ih.bias.copy_(lstm.bias_ih_l0 + lstm.bias_hh_l0)
            cell.hh.weight.copy_(lstm.weight_hh_l0)
            if design == "floor":
                cell.retain.fill_(-1e4)
            assert torch.allclose(cell(x), lstm(x)[0], atol=1e-5)


def test_forgetting_reports_every_arm_on_both_tasks(tmp_path):
    tiny = dict(arms=("free", "constant", "meta", "forget=1"), text_steps=3, recall_steps=3, eval_examples=10)
    out = forgetting.run(tmp_path, seed=0, seeds=2, progress=lambda m: None, **forgetting.QUICK | tiny)
    by = {(r["task"], r["arm"]): r for r in out.results}
    assert set(by) == {(t, a) for t in ("text", "recall") for a in tiny["arms"]}
    for (task, arm), r in by.items():
        assert len(r["per_seed"]) == 2 and r["cpu_seconds"] > 0
        assert r["vs_free"] == pytest.approx(r["score"] - by[(task, "free")]["score"], abs=1e-3)
        if task == "text":
            assert 0 < r["score"] < 8  # bits/char: within a byte
        else:
            assert 0 <= r["score"] <= 1 and r["no_binding"] == pytest.approx((1 / 2 + 1 / 4) / 2, abs=1e-3)
        assert arm in out.reading
    assert "on text, better in every seed" in out.reading and "On recall, better in every seed" in out.reading


def test_forgetting_is_drawn_by_the_cli(tmp_path):
    """Its arms are names, not a scale: it is drawn as a table and a reading, with no chart (drawing one
    raised a TypeError)."""
    from click.testing import CliRunner

    from charlm.cli import main

    args = ["lab", "forgetting", "--quick", "--plain", "--device", "cpu", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "forget=1" in result.output and "bits/char on held-out text" in result.output
