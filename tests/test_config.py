"""The configs are the one source of the command-line flags: every field has exactly one flag whose
default is the field's (or the preset's), or is marked internal; every option has a help line."""

from __future__ import annotations

import dataclasses
from dataclasses import fields, replace

import click
import pytest
from click.testing import CliRunner
from conftest import CITIZENS, TINY, cli, one_line_error

from charlm.cli import main
from charlm.config import ModelConfig, SampleConfig, TrainConfig
from charlm.errors import ConfigError
from charlm.options import (
    AttnConfig,
    ChatOptions,
    CompressOptions,
    EvalOptions,
    GatesConfig,
    LabConfig,
    LookOptions,
    PlotConfig,
    PromptOptions,
    SampleOptions,
)
from charlm.presets import PRESET_TABLE
from charlm.settings import Range, flag_name

# fields with no flag, on purpose: set by code (vocab_size from the tokenizer) or fixed by design
INTERNAL = {
    (ModelConfig, "vocab_size"),
    (ModelConfig, "head_dim"),  # a pruned model's sizes (charlm compress)
    (ModelConfig, "hidden"),
    (TrainConfig, "min_lr_ratio"),
    (TrainConfig, "beta2"),
    (TrainConfig, "grad_clip"),
    (TrainConfig, "val_fraction"),
    (TrainConfig, "teacher_sha256"),  # recorded by the run (distill.Teacher), never given
}
# fields whose CLI default the command works out: --steps and --max-time from each other
DERIVED = {"steps": None, "max_time": None}
# per-command defaults of the sampling flags
MAX_TOKENS = {"sample": 500, "chat": 200, "compare": 200}


def options(command: str) -> dict[str, click.Option]:
    return {o.name: o for o in main.commands[command].params if isinstance(o, click.Option)}


def field_options(command: str, cls) -> dict[str, list[click.Option]]:
    """Each field of cls: the options of `command` that are its flag."""
    opts = options(command).values()
    return {
        f.name: [o for o in opts if flag_name(f) and f"--{flag_name(f)}" in o.opts] for f in dataclasses.fields(cls)
    }


@pytest.mark.parametrize("cls", [ModelConfig, TrainConfig])
def test_every_train_field_has_one_flag_with_its_default(cls):
    preset_fields = {k for sizes in PRESET_TABLE["transformer"].values() for k in sizes}
    for name, found in field_options("train", cls).items():
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        if (cls, name) in INTERNAL:
            assert flag_name(f) is None and found == [], name
            continue
        assert len(found) == 1, f"{name}: {len(found)} flags"
        (o,) = found
        assert o.help, name
        if name in preset_fields:  # the CLI default is the preset's, and the help says so
            assert f.metadata["from_preset"] and o.default is None and "from --preset" in o.help, name
        elif name in DERIVED:
            assert o.default is DERIVED[name], name
        else:
            assert o.default == f.default, name


def test_preset_driven_fields_are_those_of_the_presets():
    marked = {
        f.name for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls) if f.metadata.get("from_preset")
    }
    assert marked == {k for table in PRESET_TABLE.values() for sizes in table.values() for k in sizes}


@pytest.mark.parametrize("command", ["sample", "chat", "compare"])
def test_sampling_flags_come_from_sample_config(command):
    for name, found in field_options(command, SampleConfig).items():  # compare too: it has every one (issue 13)
        assert len(found) == 1, f"{command} {name}"
        default = dataclasses.fields(SampleConfig)[[f.name for f in dataclasses.fields(SampleConfig)].index(name)]
        want = MAX_TOKENS[command] if name == "max_tokens" else default.default
        if name == "stop":
            assert found[0].multiple
        else:
            assert found[0].default == want, f"{command} {name}"


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_option_has_help(command):
    for o in options(command).values():
        assert o.help, f"charlm {command} {o.opts[0]} has no help line"


def test_device_and_unknown_are_the_same_everywhere():
    for command in ("train", "sample", "chat", "eval", "compare"):
        o = options(command)["device"]
        assert o.default == "auto" and list(o.type.choices) == ["auto", "cpu", "cuda"] and "auto:" in o.help, command
    for command in ("sample", "chat", "eval", "attn", "gates", "compare"):
        o = options(command)["unknown"]
        assert o.default == "error" and list(o.type.choices) == ["error", "drop", "replace"], command


def test_resumable_fields():
    resumable = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("resumable")}
    assert resumable == {
        "steps",
        "max_time",
        "device",
        "precision",
        "compile",
        "eval_interval",
        "eval_iters",
        "sample_tokens",
    }
    assert not any(f.metadata.get("resumable") for f in dataclasses.fields(ModelConfig))


def test_seed_is_validated_once_at_the_edge(tmp_path):
    with pytest.raises(ConfigError, match=r"--seed must be between 0 and 2\^63 - 1, got -1"):
        TrainConfig(seed=-1).validate()
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n" * 20)
    r = CliRunner().invoke(main, ["train", str(corpus), "--seed", str(2**63), "--out", str(tmp_path / "run")])
    assert r.exit_code == 1 and r.stderr.strip() == f"error: --seed must be between 0 and 2^63 - 1, got {2**63}"
    assert not (tmp_path / "run").exists()


def test_train_validates_each_config_once(tmp_path, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, hello moon\n" * 40)
    calls = []
    for cls in (ModelConfig, TrainConfig):
        original = cls.validate
        monkeypatch.setattr(cls, "validate", lambda self, o=original, c=cls: calls.append(c.__name__) or o(self))
    r = CliRunner().invoke(
        main,
        [
            "train",
            str(corpus),
            *TINY,
            "--steps",
            "2",
            "--eval-interval",
            "2",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert r.exit_code == 0, r.output
    # the CLI's one check of each, before any work; the second ModelConfig is build_model's own guard (models/,
    # an entry point of its own). It was three of each before.
    assert sorted(calls) == ["ModelConfig", "ModelConfig", "TrainConfig"]


def test_sample_validates_each_config_once_and_python_callers_too(gen_runs, monkeypatch):
    """A command's configs validate as they are made (the CLI's from_flags makes them): `charlm sample` checks
    each once and the command function does not check again; from Python, a bad value is refused where the
    config is made, before any command runs."""
    calls = []
    for cls in (PromptOptions, SampleConfig, SampleOptions):
        original = cls.validate
        monkeypatch.setattr(cls, "validate", lambda self, o=original, c=cls: calls.append(c.__name__) or o(self))
    r = CliRunner().invoke(main, ["sample", str(gen_runs["lstm"]), "-p", "RO", "-n", "5", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert sorted(calls) == ["PromptOptions", "SampleConfig", "SampleOptions"]
    with pytest.raises(ConfigError, match="--num-samples must be at least 1"):
        SampleOptions(num_samples=0)
    with pytest.raises(ConfigError, match="temperature must be between 0 and 100"):
        dataclasses.replace(SampleConfig(), temperature=-1.0)


@pytest.mark.parametrize("command, cls", [("plot", PlotConfig), ("lab", LabConfig)])
def test_command_settings_come_from_their_config(command, cls):
    """plot's and lab's options are their config's fields: one flag each, the field's default and help."""
    for name, found in field_options(command, cls).items():
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        assert len(found) == 1 and found[0].default == f.default and found[0].help == f.metadata["help"], name


@pytest.mark.parametrize(
    "args, message",
    [
        (["lab", "copy", "--seeds", "0"], "--seeds must be between 1 and 100, got 0"),
        (["lab", "copy", "--seed", "-1"], "--seed must be between 0 and 2^63 - 1, got -1"),
        (["plot", "run", "--height", "3"], "--height must be at least 8, got 3"),
    ],
)
def test_a_command_setting_is_checked_by_its_config(args, message):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and result.output.strip() == f"error: {message}"


# ---- each field checked against its own declaration (issue 36): types, choices, ranges -------------------


@pytest.mark.parametrize(
    "make,message",
    [
        # a string where a number belongs: a ConfigError naming the field, not a TypeError from a comparison
        (lambda: AttnConfig(top="3"), "--top must be a whole number, got '3'"),
        (lambda: GatesConfig(units="abc"), "--units must be a count or a list"),
        (lambda: GatesConfig(units=[1, "x"]), "--units must be a count or a list"),
        (lambda: ChatOptions(mode="sideways"), "unknown --mode 'sideways': choose one of fresh, continue"),
        (lambda: ChatOptions(device="tpu"), "unknown --device 'tpu'"),
        (lambda: EvalOptions(unknown="ignore"), "unknown --unknown 'ignore'"),
        (lambda: PlotConfig(y="acc"), "unknown --y 'acc': choose one of bpc, loss"),
        (lambda: AttnConfig(scale="log"), "unknown --scale 'log'"),
        (lambda: AttnConfig(top=0), "--top must be at least 1, got 0"),
        (lambda: LookOptions(width=5), "--width must be at least 20, got 5"),
        (lambda: CompressOptions(report=True, tokens=10), "--tokens must be at least 64, got 10"),
        (lambda: SampleConfig(top_p=0.0), r"--top-p must be in \(0, 1\], got 0.0"),
        (lambda: SampleConfig(temperature=float("nan")), "--temperature must be between 0 and 100, got nan"),
        (lambda: TrainConfig(steps=0), r"--steps must be between 1 and 10\^12, got 0"),
        (lambda: TrainConfig(seed=2**63), r"--seed must be between 0 and 2\^63 - 1"),
        (lambda: TrainConfig(max_time=-1.0), "--max-time must be positive"),
        (lambda: dataclasses.replace(SampleConfig(), max_tokens=-1), "--max-tokens must be at least 0, got -1"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_config_made_in_python_is_checked_against_its_fields(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_choices_and_ranges_are_written_once_on_the_field():
    """Each choice and range is declared on its field (settings.flag) and nowhere else: no validate() method
    repeats a field's choices or bounds by hand."""
    import inspect

    from charlm import config, options

    for module in (config, options):
        source = inspect.getsource(module)
        for cls in vars(module).values():
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and "validate" in vars(cls)):
                continue
            body = inspect.getsource(vars(cls)["validate"])
            for f in dataclasses.fields(cls):
                m = f.metadata
                if m.get("choices"):
                    assert f"self.{f.name} in" not in body, (cls.__name__, f.name)
                if m.get("range") is not None and m["range"].low is not None:
                    assert f"self.{f.name} >= {m['range'].low}" not in body, (cls.__name__, f.name)
                    assert f"<= self.{f.name} <=" not in body, (cls.__name__, f.name)
        assert "check_types(self)" not in source  # Validated checks every field's type itself


def test_a_field_range_reads_as_it_is_written():
    assert str(Range(1, 64)) == "between 1 and 64"
    assert str(Range(0)) == "at least 0" and str(Range(0, low_open=True)) == "positive"
    assert str(Range(0, 1, high_open=True)) == "in [0, 1)" and str(Range(1, 10**12)) == "between 1 and 10^12"
    assert 1 in Range(1, 64) and 64 in Range(1, 64) and 0 not in Range(1, 64) and float("nan") not in Range(0)
    assert 1 not in Range(0, 1, high_open=True) and 0 not in Range(0, low_open=True)


@pytest.mark.parametrize(
    "args,flag",
    [
        (["train", "c.txt", "--out", ""], "--out"),  # trained into the current directory before
        (["sample", "run", "--prompt-file", ""], "--prompt-file"),
        (["attn", "run", "--prompt-file", ""], "--prompt-file"),
        (["compare", "a", "b", "--eval", ""], "--eval"),  # was taken as no --eval at all
        (["lab", "copy", "--out", ""], "--out"),
        (["lab", "ablate", "run", "--text", ""], "--text"),
    ],
)
def test_an_empty_path_is_refused_not_read_as_here_or_nothing(tmp_path, monkeypatch, args, flag):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text(CITIZENS, encoding="utf-8")
    one_line_error(cli(*args), f"{flag} is empty: give a path, or leave it out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]  # nothing written


def whole_number_fields(cls):
    return [f for f in fields(cls) if str(f.type).removesuffix(" | None") == "int"]


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_no_config_accepts_a_number_a_checkpoint_cannot_hold(kind):
    """Regression (issue 26 item 1): --warmup 18446744073709551616 (or --eval-interval that large, or --steps
    of 20 digits with --max-time) trained and said "training done", and then info, sample and --resume all
    refused best.pt ("it holds a number of 65 bits"): the whole run was lost. Every whole-number field of the
    configs a checkpoint records now has an upper bound below 2^64, for every model kind, so the flags refuse
    such numbers before any work."""
    model = ModelConfig(kind=kind, vocab_size=65)
    for f in whole_number_fields(ModelConfig):
        with pytest.raises(ConfigError):
            replace(model, **{f.name: 2**64}).validate()
    for tokenizer in ("char", "bpe"):
        train = TrainConfig(tokenizer=tokenizer)
        for f in whole_number_fields(TrainConfig):
            with pytest.raises(ConfigError):
                replace(train, **{f.name: 2**64}).validate()
    with pytest.raises(ConfigError):
        replace(TrainConfig(), max_time=float("inf")).validate()


@pytest.mark.parametrize(
    "flags",
    [
        ["--warmup", "18446744073709551616"],
        ["--eval-interval", "18446744073709551616"],
        ["--steps", "99999999999999999999", "--max-time", "15s"],
        ["--max-time", "9" * 400],
        ["--eval-iters", "1000000000"],
        ["--sample-tokens", "1000000000"],
    ],
)
def test_a_run_with_a_number_no_checkpoint_holds_is_refused_before_any_work(corpus, tmp_path, flags):
    out = tmp_path / "run"
    r = cli("train", corpus, *TINY, "--steps", "3", "--out", out, *flags)
    one_line_error(r, flags[0])
    assert not out.exists()
