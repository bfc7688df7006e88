"""docs/architecture.md stays true: every module of charlm is in its layout, in an order where a top-level module
or package imports only from the ones above it (lazy imports inside functions included), each package whose files
the layout lists has exactly those files, and no code outside models/ asks which model family it holds."""

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


def listed_files() -> dict[str, list[str]]:
    """The files docs/architecture.md lists under a package (`  training/` then `    trainer.py` lines), by package."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    tree = doc.split("```", 2)[1]
    listed: dict[str, list[str]] = {}
    package = None
    for line in tree.splitlines():
        if m := re.match(r"^  ([a-z_]+)(?:\.py|/)", line):
            package = m.group(1)
        elif (m := re.match(r"^    ([a-z_]+\.py)", line)) and package:
            listed.setdefault(package, []).append(m.group(1))
    return listed


def unit(path: Path, package: Path = PACKAGE) -> str:
    """The top-level module or package a file belongs to: "cli", "models", "training", ..."""
    return path.relative_to(package).parts[0].removesuffix(".py")


def imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The top-level charlm modules and packages a file imports, anywhere in it (relative imports resolved)."""
    here = ["charlm", *path.relative_to(package).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from . import x, from ..storage import checkpoint
                base = here[: len(here) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            if module.split(".")[0] == "charlm":
                names = [module] if module != "charlm" else [f"charlm.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "charlm"]
        found |= {n.split(".")[1] for n in names if "." in n}
    return found


def upward(order: list[str], package: Path = PACKAGE) -> list[tuple[str, str]]:
    """(file, what it imports) for every import of a module or package documented below the file's own."""
    return [
        (p.relative_to(package.parent).as_posix(), target)
        for p in sorted(package.rglob("*.py"))
        if unit(p, package) in order
        for target in sorted(imports(p, package))
        if target != unit(p, package) and target in order and order.index(target) > order.index(unit(p, package))
    ]


def test_every_module_is_in_the_documented_layout():
    order = layout()
    modules = {unit(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    assert modules == set(order), modules ^ set(order)


def test_each_listed_package_has_exactly_its_listed_files():
    listed = listed_files()
    assert {"models", "storage", "training", "explore"} <= set(listed)
    for package, files in listed.items():
        assert sorted(files) == sorted(p.name for p in (PACKAGE / package).glob("*.py") if p.name != "__init__.py")


def test_no_module_imports_one_documented_below_it():
    assert upward(layout()) == []


def test_the_order_check_sees_a_package_importing_one_below_it(tmp_path):
    """The check works by package: storage/ must not import training/ (which is below it), lazily, by a
    relative import or through `from charlm import training`, while training/ may import storage/."""
    order = layout()
    assert order.index("storage") < order.index("training") < order.index("explore")
    package = tmp_path / "charlm"
    files = {
        "storage/checkpoint.py": "def save():\n    from charlm.training import trainer\n",
        "storage/runs.py": "from ..training.resume import resume_run\n",
        "storage/quantized.py": "from charlm import training\n",
        "storage/safe_pickle.py": "from . import checkpoint\nfrom charlm.storage import runs\n",
        "training/trainer.py": "from charlm.storage import checkpoint\nimport charlm.models\n",
        "models/__init__.py": "from charlm.explore.app import ExploreApp\n",
    }
    for rel, text in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text, encoding="utf-8")
    assert upward(order, package) == [
        ("charlm/models/__init__.py", "explore"),
        ("charlm/storage/checkpoint.py", "training"),
        ("charlm/storage/quantized.py", "training"),
        ("charlm/storage/runs.py", "training"),
    ]


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
