"""docs/architecture.md stays true: every module of charlm is in its layout, in an order where a module imports
only from the ones above it (lazy imports inside functions included), and no code outside models/ asks
which model family it holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "charlm"


def layout() -> list[str]:
    """The top-level modules and packages of charlm, in the order docs/architecture.md lists them."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    tree = doc.split("```", 2)[1]
    return [m.group(1) for m in re.finditer(r"^  ([a-z_]+)(?:\.py|/)", tree, flags=re.M)]


def unit(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imports(path: Path) -> set[str]:
    """The top-level charlm modules a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "charlm":
            names = [node.module] if node.module != "charlm" else [f"charlm.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "charlm"]
        found |= {n.split(".")[1] for n in names if "." in n}
    return found


def test_every_module_is_in_the_documented_layout():
    order = layout()
    modules = {unit(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    assert modules == set(order), modules ^ set(order)


def test_no_module_imports_one_documented_below_it():
    order = layout()
    upward = [
        (str(p.relative_to(ROOT)), target)
        for p in PACKAGE.rglob("*.py")
        if unit(p) in order
        for target in imports(p)
        if target != unit(p) and target in order and order.index(target) > order.index(unit(p))
    ]
    assert upward == []


def test_no_family_test_outside_models():
    """Code asks a model for a capability (model.capabilities, model.window), never which class it is."""
    pattern = re.compile(
        r"has_attention|isinstance\([^)]*(Transformer|RNN)\b|\.kind\s*[!=]=\s*\"(transformer|lstm|gru)\""
    )
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in PACKAGE.rglob("*.py")
        if unit(p) not in ("models", "lab")  # the lab's experiments are about the two families
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


INTERNALS = re.compile(  # a family's layers and weights, by the names only its own module should know
    r"\bmodel\.(blocks|rnn|tok_emb|pos_emb|head|norm|drop)\b|\.attn\.(proj|qkv)\b|\bblocks\.\d|"
    r"weight_(ih|hh)|bias_(ih|hh)|\bnn\.(LSTM|GRU)\b|\bGATES\b|\{\s*\"lstm\":\s*4"
)


# modules that build their own models rather than read a family's: lab forgetting's LSTM arms are nn.LSTM layers
# with pinned gate rows (experiment models, not a charlm family; no command opens them as one)
OWN_MODELS = {"lab/forgetting.py"}


def test_no_family_internals_outside_models():
    """What is inside a model is asked through its capabilities (models/__init__.py, models/inspect.py): no code
    outside models/ -- the lab, explore and compress included -- names a family's layers, its weights or its
    gate count."""
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in PACKAGE.rglob("*.py")
        if unit(p) != "models" and p.relative_to(PACKAGE).as_posix() not in OWN_MODELS
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if INTERNALS.search(line)
    ]
    assert hits == []


def test_the_internals_check_sees_what_it_looks_for():
    """The lines issue 36 found outside models/, each caught."""
    for line in (
        "hook = model.blocks[layer].attn.proj.register_forward_pre_hook(zero_head)",
        "for layer, block in enumerate(model.blocks):",
        "rnn = model.rnn",
        'qkv, proj = f"blocks.{layer}.attn.qkv.weight", f"blocks.{layer}.attn.proj.weight"',
        'ih = state[f"rnn.weight_ih_l{layer}"]',
        'gates, H = {"lstm": 4, "gru": 3}[cfg.kind], cfg.hidden_size',
        "logits = model.head(traces[-1].h)[0].float()",
        "def trace_rnn(rnn: nn.LSTM | nn.GRU, x):",
    ):
        assert INTERNALS.search(line), line
    assert not INTERNALS.search("self.rnn = isinstance(self.scene, ex.GateScene)")
