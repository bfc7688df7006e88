"""A setting is a field: `flag(...)` on a dataclass field says its command-line flag (name, help, choices, its
section in --help, how typed text becomes its value, whether a resumed run may change it); `internal(...)` a
field with none. flags.py turns these fields into Click options, chat's /set and /attn read them, storage/runs.py reads
the resume rule off them. Beside them: the checks every config's validate() uses, and the readers of typed
text (durations, escaped stop strings). Knows no config and no command.
"""

from __future__ import annotations

import math
import numbers
import re
import reprlib
from dataclasses import dataclass, field, fields

from charlm.errors import ConfigError

NONE_WORDS = ("none", "off", "random")  # typed for a setting that may be empty (a seed, the stop strings)


class Validated:
    """A config that validates itself when it is made (and when dataclasses.replace makes a changed copy): every
    one that exists is valid, so a command takes it as it is, from the CLI or from Python alike. Each field is
    checked against its own declaration (check_fields: its type, choices and range); validate() adds what
    involves several fields."""

    def __post_init__(self) -> None:
        check_fields(self)
        self.validate()

    def validate(self):
        return self


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_paths(config, *names: str) -> None:
    """A path flag given as empty text ('') is refused: it would mean the current directory, or nothing."""
    for f in fields(config):
        check(
            f.name not in names or getattr(config, f.name) != "",
            f"--{flag_name(f)} is empty: give a path, or leave it out",
        )


MAX_BITS = 10_000  # str() of a whole number of more than 4300 digits (14,000 bits) raises ValueError


class _Shown(reprlib.Repr):
    maxlevel = 3

    def repr_int(self, x, level):
        return f"a number of {x.bit_length()} bits" if x.bit_length() > MAX_BITS else super().repr_int(x, level)


def shown(value) -> str:
    """A value in a message: short, on one line, whatever it holds (a checkpoint's config is outside data)."""
    return _Shown().repr(value)


def _whole(x) -> bool:  # one that messages can print
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and int(x).bit_length() <= MAX_BITS


def _real(x) -> bool:
    return _whole(x) or isinstance(x, numbers.Real) and not isinstance(x, (bool, numbers.Integral))


# what each declared field type accepts, and its name in a message
_KINDS = {
    "int": (_whole, "a whole number"),
    "float": (_real, "a number"),
    "str": (lambda x: isinstance(x, str), "text"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "list[str]": (lambda x: isinstance(x, list) and all(isinstance(s, str) for s in x), "a list of text"),
    "int | list[int]": (lambda x: _whole(x) or isinstance(x, list) and all(map(_whole, x)), "a count or a list"),
}


def _bound(x) -> str:
    """A range's bound as messages write it: 10^12, 2^63 - 1, 0.5."""
    if _whole(x) and x == 2**63 - 1:
        return "2^63 - 1"
    if _whole(x) and x >= 10**7 and str(x).rstrip("0") == "1":
        return f"10^{len(str(x)) - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """The numbers a field takes, written once on its declaration (flag(range=...), internal(range=...)): each
    bound included unless open; None: no bound. text: how a message says it, where the bounds alone read badly."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    text: str | None = None

    def __contains__(self, x) -> bool:
        if isinstance(x, float) and math.isnan(x):
            return False
        above = self.low is None or (x > self.low if self.low_open else x >= self.low)
        return above and (self.high is None or (x < self.high if self.high_open else x <= self.high))

    def __str__(self) -> str:
        if self.text:
            return self.text
        low, high = _bound(self.low), _bound(self.high)
        if self.high is None:
            return ("positive" if self.low == 0 else f"above {low}") if self.low_open else f"at least {low}"
        if self.low is None:
            return f"below {high}" if self.high_open else f"at most {high}"
        if not (self.low_open or self.high_open):
            return f"between {low} and {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def label(f) -> str:
    """A field as a message names it: its flag ("--d-model"), or its own words (internal(what=...))."""
    return f"--{flag_name(f)}" if flag_name(f) else f.metadata.get("what") or f.name.replace("_", " ")


def check_types(config) -> None:
    """Every field holds a value of its declared type, before any range check compares or prints it: a string
    where a number belongs would raise TypeError there, a float where an int belongs would pass and break
    the model later."""
    for f in fields(config):
        value = getattr(config, f.name)
        kind, optional = str(f.type).removesuffix(" | None"), str(f.type).endswith(" | None")
        ok, what = _KINDS.get(kind, (lambda x: True, ""))
        if not (ok(value) or optional and value is None):
            check(False, f"{label(f)} must be {what}{' or nothing' if optional else ''}, got {shown(value)}")


def check_fields(config) -> None:
    """Every field against its own declaration: its type (check_types), then its choices or its range
    (flag(choices=..., range=...)). A value of None (an optional field left empty) has neither."""
    check_types(config)
    for f in fields(config):
        value, choices, bounds = getattr(config, f.name), f.metadata.get("choices"), f.metadata.get("range")
        if choices and value is not None and value not in choices:
            check(False, f"unknown {label(f)} {shown(value)}: choose one of {', '.join(map(str, choices))}")
        if bounds and isinstance(value, numbers.Real) and value not in bounds:
            check(False, f"{label(f)} must be {bounds}, got {shown(value)}")


SEEDS = Range(0, 2**63 - 1)  # what a torch.Generator takes


_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)\s*")  # one number and its unit, matched part by part:
# a single pattern for the whole text, (number unit?)+, backtracked exponentially on a long run of digits that
# fails at its end ('--max-time 9999999999999999999999999999x' took minutes)
_UNIT = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def _parts(t: str) -> list[tuple[str, str]] | None:
    """'1h 5m' -> [('1', 'h'), ('5', 'm')]; None unless the whole text is numbers each followed by a word."""
    parts, at = [], 0
    while at < len(t):
        m = _PART.match(t, at)
        if m is None:
            return None
        parts.append(m.groups())
        at = m.end()
    return parts


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds, from a duration as charlm prints them ('45s', '2m04s', '1h05m', '1.2s') or as people type them
    ('90', '90 s', '10m', '1m30s', '1.5h', '0:05:30', '5:30'). Each unit at most once, largest first ('1h1h'
    and '30s1m' are refused); on a clock, minutes and seconds below 60 ('0:99:99' is refused), the leading
    field as large as it likes ('90:00' is 90 minutes)."""
    t, seconds = text.strip().lower(), None
    hint = "use e.g. 90s, 10m, 1m30s, 1h or 1:30:00"
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}(\.\d+)?", t):  # [h:]m:s
        _, *rest = t.split(":")
        check(
            all(float(p) < 60 for p in rest),
            f"{what}: cannot read duration {shown(text)}: minutes and seconds on a clock go up to 59; {hint}",
        )
        seconds = sum(float(p) * 60**i for i, p in enumerate(reversed(t.split(":"))))
    elif (parts := _parts(t)) and all(u in _UNIT or u == "" for _, u in parts):
        if len(parts) == 1 or all(u for _, u in parts):  # '1m30' is not a duration; '1m30s' is
            sizes = [_UNIT[u or "s"] for _, u in parts]
            check(
                all(a > b for a, b in zip(sizes, sizes[1:])),
                f"{what}: cannot read duration {shown(text)}: give each unit once, largest first; {hint}",
            )
            seconds = sum(float(v) * size for (v, _), size in zip(parts, sizes))
    check(seconds is not None, f"{what}: cannot read duration {shown(text)}: {hint}")
    check(seconds > 0, f"{what}: duration must be positive, got {shown(text)}")
    return seconds


def unescape(text: str) -> str:
    r"""'\n', '\t', '\r' and '\\' typed as two characters -> the character itself (for stop strings)."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


def flag(
    default,
    help: str,
    *,
    name: str | None = None,
    short: str | None = None,
    choices: tuple | None = None,
    section: str | None = None,
    parse=None,
    example: str | None = None,
    positional: bool = False,
    resumable: bool = False,
    from_preset: bool = False,
    derived: bool = False,
    applies_to: str | None = None,
    range: Range | None = None,
    **kw,
):
    """A config field with its command-line flag. name: the flag without "--" (default: the field's name
    with dashes). section: its group in --help. parse: turns the text a user typed into the value (a
    duration, an escaped stop string); None: the field's own type. example: a value to show in hints.
    positional: chat's /attn and /gates take it as a bare number (/attn 1 2: layer 1, head 2).
    resumable: `--resume` may change it. from_preset: the CLI default comes from --preset (the field's
    default applies to code that builds configs itself). derived: the command works the value out when the
    flag is absent (--steps and --max-time from each other). applies_to: the only model kind (ModelConfig)
    or tokenizer (TrainConfig) the setting means anything for. range: the numbers it takes (Range); choices
    and range are checked wherever the config is made (Validated), from the CLI or from Python."""
    meta = dict(
        flag=name,
        short=short,
        help=help,
        choices=choices,
        section=section,
        parse=parse,
        example=example,
        positional=positional,
        resumable=resumable,
        from_preset=from_preset,
        derived=derived,
        applies_to=applies_to,
        range=range,
    )
    if "default_factory" in kw:
        return field(metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def internal(default, applies_to: str | None = None, range: Range | None = None, what: str | None = None, **kw):
    """A field with no command-line flag: set by code (vocab_size from the tokenizer) or fixed by design.
    what: its name in a message ("vocabulary size")."""
    return field(default=default, metadata=dict(flag=False, applies_to=applies_to, range=range, what=what), **kw)


def flag_name(f) -> str | None:
    """The flag of a dataclass field ("d-model"), or None for an internal one."""
    if f.metadata.get("flag") is False:
        return None
    return f.metadata.get("flag") or f.name.replace("_", "-")


def from_dict(cls, d: dict):
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


def from_text(f, text: str):
    """The value a user typed for the field f (a flag, or a word after /set, /attn, /gates)."""
    if f.metadata.get("parse"):
        try:
            return f.metadata["parse"](text)
        except ValueError as e:
            raise ConfigError(str(e) if isinstance(e, ConfigError) else f"{text!r} is not a valid {f.name}") from None
    kind = str(f.type)
    if "None" in kind and text.lower() in NONE_WORDS:
        return None
    if f.metadata.get("choices"):
        check(text in f.metadata["choices"], f"{f.name} takes {', '.join(f.metadata['choices'])}, not {text!r}")
        return text
    for name, convert, what in (("float", float, "a number"), ("int", int, "a whole number")):
        if kind.startswith(name):
            try:
                return convert(text)
            except ValueError:
                raise ConfigError(f"{f.name} must be {what}, got {text!r}") from None
    return text


def flag_fields(cls) -> list:
    """The fields of a config class that have a flag, in order."""
    return [f for f in fields(cls) if flag_name(f)]
