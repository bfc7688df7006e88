"""Command-line flags from config fields, and back: each field's settings.flag() (name, default, help, choices,
its --help section) becomes a Click option (config_options), the values typed become the validated config
(from_flags); a command's --help lists its options in those sections, then notes and examples
(CharlmCommand). cli.py builds every command from these; nothing here knows a command."""

from __future__ import annotations

import re
from pathlib import Path

import click
from click import _textwrap as click_textwrap

from charlm.settings import flag_fields, flag_name, from_text


def examples(command: str) -> list[tuple[str, str]]:
    """(what it does, the command line) of each example of `charlm COMMAND` in examples.txt: the text a
    --help ends with, kept apart from the code as it is shown (a "# what" line, then the command line)."""
    text = (Path(__file__).parent / "examples.txt").read_text(encoding="utf-8")
    pairs = re.findall(r"^# (.*)\n(.*\bcharlm (\w+).*)$", text, re.M)
    return [(what, line) for what, line, name in pairs if name == command]


class CharlmCommand(click.Command):
    """A command whose --help lists its options in titled sections (each option's `section`, from its config
    field), then `notes` (a title and its rows), then its examples."""

    def __init__(self, *args, notes=None, **kw):
        super().__init__(*args, **kw)
        self.notes = notes
        if not self.short_help:  # `charlm --help` lists the docstring's whole first sentence (Click cuts at 45)
            self.short_help = " ".join((self.help or "").split("\n\n")[0].split(". ")[0].split()).rstrip(".") + "."

    def format_options(self, ctx, formatter) -> None:
        sections: dict[str, list] = {}
        for p in self.get_params(ctx):
            if isinstance(p, click.Option) and (record := p.get_help_record(ctx)):
                sections.setdefault(getattr(p, "section", None), []).append(record)
        other = sections.pop(None, [])
        for title, rows in [*sections.items(), ("Other options" if sections else "Options", other)]:
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx, formatter) -> None:
        if self.notes:  # (title, a function that gives the rows)
            with formatter.section(self.notes[0]):
                formatter.write_dl(self.notes[1]())
        with formatter.section("Examples"):  # never re-wrapped as prose: a command line folds at its own spaces
            pad = " " * formatter.current_indent
            for what, line in examples(self.name):
                for part in click_textwrap.TextWrapper(formatter.width - len(pad) - 2).wrap(what):
                    formatter.write(f"{pad}# {part}\n")
                formatter.write("".join(f"{pad}{part}\n" for part in fold_command(line, formatter.width - len(pad))))


def fold_command(line: str, width: int) -> list[str]:
    """A command line as lines of at most `width` (where its words allow), each but the last ending in " \\"
    (the shell's continuation) and the rest indented: it breaks between words, never inside a word or a
    quoted text, so that the terminal never breaks it mid-token and a copy still runs."""
    words = re.findall(r"(?:\"[^\"]*\"|'[^']*'|\S)+", line)
    lines, current = [], ""
    for word in words:
        joined = f"{current} {word}" if current else word
        if current and len(joined) + 2 > width:  # room for " \\"
            lines.append(current + " \\")
            current = "    " + word
        else:
            current = joined
    return [*lines, current]


# Click wraps help with textwrap, which breaks at hyphens ("--max-" / "time"): flags must stay whole
# (tests/test_cli_help.py notices if a Click release moves this class)
click_textwrap.TextWrapper.wordsep_re = click_textwrap.TextWrapper.wordsep_simple_re  # split at spaces only


def config_options(cls, defaults: dict | None = None) -> list[click.Option]:
    """The Click options generated from a config dataclass's fields (settings.flag): name, default, help, choices and
    --help section are written once, on the field. `defaults` overrides a default for one command (chat's
    shorter --max-tokens). Values typed as text (a duration) reach the command as text: from_flags reads them."""
    options = []
    for f in flag_fields(cls):
        name, m = flag_name(f), f.metadata
        decls = [f"--{name}"] + ([f"-{m['short']}"] if m["short"] else []) + [f.name]
        kw = dict(help=m["help"])
        if m["from_preset"] and f.type == "bool":  # --qk-norm/--no-qk-norm, None when neither is typed
            decls[0] = f"--{name}/--no-{name}"
            kw.update(default=None, help=m["help"] + " [default: from --preset]")
        elif m["from_preset"]:
            kw.update(type=type(f.default), default=None, help=m["help"] + " [default: from --preset]")
        elif f.type == "bool":  # a setting a resumed run may change can also be turned off: --no-compile
            two = f.default or m["resumable"]
            decls[0] = f"--{name}/--no-{name}" if two else f"--{name}"
            kw.update(default=f.default, show_default=two, is_flag=True)
        elif f.type.startswith("list"):  # a repeatable flag
            kw.update(multiple=True, type=str)
        elif m["parse"] or m["derived"] or f.default is None:
            kw.update(type=str if m["parse"] or f.type.startswith("str") else int, default=None)
        else:
            shown = "[default:" not in m["help"]  # a help that says its default itself ("[default: none]")
            kw.update(default=(defaults or {}).get(f.name, f.default), show_default=shown, type=type(f.default))
        if m["choices"]:
            kw["type"] = click.Choice(m["choices"])
        options.append(click.Option(decls, **{k: v for k, v in kw.items() if k != "section"}))
        options[-1].section = m["section"]  # where CharlmCommand lists it
    return options


def from_flags(cls, values: dict):
    """The config the flags describe (a flag not given keeps the field's default), validated as it is made
    (settings.Validated; ModelConfig is checked by presets.train_configs, once its vocabulary is known)."""
    picked = {}
    for f in flag_fields(cls):
        value = values.get(f.name)
        if isinstance(value, tuple):  # a repeatable flag
            value = [from_text(f, v) for v in value]
        elif isinstance(value, str) and f.metadata["parse"]:
            value = from_text(f, value)
        if value is not None:
            picked[f.name] = value
    return cls(**picked)
