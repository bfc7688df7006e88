
# ---- compare / eval (issue 5): tiny checkpoints trained once per test session -------------------

import pytest as _cmp_pytest

CMP_TEXT = (
    "the cat sat on the mat, and the dog ran to the log.\n"
    "a bird sang in the tree; the bee flew to me.\n"
    "then the cat and the dog and the bird went home.\n"
) * 45


@_cmp_pytest.fixture(scope="session")
def cmp_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "rhymes.txt"
    path.write_text(CMP_TEXT, encoding="utf-8")
    return path


@_cmp_pytest.fixture(scope="session")
def cmp_runs(cmp_corpus, tmp_path_factory):
    """Run directories of three tiny models, 30 steps each: an LSTM and a Transformer on chars, a
    Transformer on BPE. Keys: "lstm", "tf", "bpe"."""
    from charlm.config import ModelConfig, TrainConfig
    from charlm.train import Trainer

    import torch

    root = tmp_path_factory.mktemp("cmp-runs")
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only adds contention on a shared 2-core machine
    with _cmp_pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHARLM_CACHE", str(root / "cache"))
        for name, kind, tokenizer in (("lstm", "lstm", "char"), ("tf", "transformer", "char"), ("bpe", "transformer", "bpe")):
            model_cfg = ModelConfig(kind=kind, n_layers=1, d_model=32, n_heads=2, context=32)
            train_cfg = TrainConfig(tokenizer=tokenizer, vocab_size=300, steps=30, batch_size=8, lr=1e-2, warmup=5,
                                    eval_interval=30, eval_iters=2, sample_tokens=0, device="cpu")
            Trainer(cmp_corpus, model_cfg, train_cfg, root / f"cmp-{name}").fit()
            runs[name] = root / f"cmp-{name}"
    torch.set_num_threads(threads)
    return runs


# ---- viewers: attn, gates (issue 4): tiny checkpoints trained once per test session -------------

import pytest as _view_pytest

VIEW_TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"
) * 40


@_view_pytest.fixture(scope="session")
def view_runs(tmp_path_factory):
    """Run directories of four tiny models, 20 steps each: char Transformer (2 layers × 2 heads), BPE
    Transformer, char LSTM and char GRU (2 layers each). Keys: "tf", "bpe", "lstm", "gru"."""
    from charlm.config import ModelConfig, TrainConfig
    from charlm.train import Trainer

    import torch

    root = tmp_path_factory.mktemp("view-runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster, and far faster on a busy machine
    corpus = root / "plays.txt"
    corpus.write_text(VIEW_TEXT, encoding="utf-8")
    runs = {}
    with _view_pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHARLM_CACHE", str(root / "cache"))
        for name, kind, tokenizer in (("tf", "transformer", "char"), ("bpe", "transformer", "bpe"),
                                      ("lstm", "lstm", "char"), ("gru", "gru", "char")):
            model_cfg = ModelConfig(kind=kind, n_layers=2, d_model=32, n_heads=2, context=48)
            train_cfg = TrainConfig(tokenizer=tokenizer, vocab_size=300, steps=20, batch_size=8, lr=1e-2, warmup=5,
                                    eval_interval=20, eval_iters=1, sample_tokens=0, device="cpu")
            Trainer(corpus, model_cfg, train_cfg, root / f"view-{name}").fit()
            runs[name] = root / f"view-{name}"
    torch.set_num_threads(threads)
    return runs


# ---- generation: sample, chat (issue 3): tiny checkpoints trained once per test session ---------

import pytest as _gen_pytest

# A text the model learns by heart, full of Rich markup and terminal escapes (an OSC title change, a
# BEL, colour codes): sample and chat must show them as harmless visible text.
GEN_TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    "[bold]red[/bold] \x1b]0;pwned\x07 \x1b[31mred\x1b[0m\n"
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"
) * 60


@_gen_pytest.fixture(scope="session")
def gen_runs(tmp_path_factory):
    """Run directories: "tf", a char Transformer (1 layer × 48, context 48) trained for 80 steps, which
    has memorised GEN_TEXT; "lstm", a char LSTM trained for 3 steps. Trained on one thread (two
    threads on a busy 2-core machine are several times slower)."""
    import torch

    from charlm.config import ModelConfig, TrainConfig
    from charlm.train import Trainer

    root = tmp_path_factory.mktemp("gen-runs")
    corpus = root / "verona.txt"
    corpus.write_text(GEN_TEXT, encoding="utf-8")
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _gen_pytest.MonkeyPatch.context() as mp:
            mp.setenv("CHARLM_CACHE", str(root / "cache"))
            for name, kind, steps in (("tf", "transformer", 80), ("lstm", "lstm", 3)):
                model_cfg = ModelConfig(kind=kind, n_layers=1, d_model=48, n_heads=2, context=48)
                train_cfg = TrainConfig(tokenizer="char", steps=steps, batch_size=16, lr=1e-2, warmup=10,
                                        eval_interval=steps, eval_iters=1, sample_tokens=0, device="cpu")
                Trainer(corpus, model_cfg, train_cfg, root / f"gen-{name}").fit()
                runs[name] = root / f"gen-{name}"
    finally:
        torch.set_num_threads(threads)
    return runs
