"""Command-line flags from config fields, and back: each field's config.flag() (name, default, help, choices,
its --help section) becomes a Click option (config_options), the values typed become the validated config
(from_flags); a command's --help lists its options in those sections, then notes and examples
(CharlmCommand). cli.py builds every command from these; nothing here knows a command."""

from __future__ import annotations

import click
from click import _textwrap as click_textwrap

from charlm import config
from charlm.config import flag_fields, flag_name


def summary(command: click.Command) -> str:
    """A command's line in `charlm --help`: its short help, or its docstring's whole first sentence."""
    if command.short_help:
        return command.short_help
    first = (command.help or "").split("\n\n")[0]
    return " ".join(first.split(". ")[0].split()).rstrip(".") + "."


class CharlmCommand(click.Command):
    """A command whose --help lists its options in titled sections (each option's `section`, from its config
    field), then `notes` (title, rows), then examples (what it does, the command line)."""

    def __init__(self, *args, examples: list[tuple[str, str]] | None = None, notes=None, **kw):
        super().__init__(*args, **kw)
        self.examples, self.notes = examples or [], notes

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
        for title, rows in self.notes() if self.notes else ():
            with formatter.section(title):
                formatter.write_dl(rows)
        if self.examples:  # verbatim: a command line must not be re-wrapped
            with formatter.section("Examples"):
                pad = " " * formatter.current_indent
                for what, line in self.examples:
                    formatter.write(f"{pad}# {what}\n{pad}{line}\n")


# Click wraps help with textwrap, which breaks at hyphens ("--max-" / "time"): flags must stay whole
# (tests/test_cli_help.py notices if a Click release moves this class)
click_textwrap.TextWrapper.wordsep_re = click_textwrap.TextWrapper.wordsep_simple_re  # split at spaces only


def option(*decls, section: str | None = None, **kw):
    """click.option, placed in a --help section."""

    def decorate(f):
        f = click.option(*decls, **kw)(f)
        f.__click_params__[-1].section = section
        return f

    return decorate


def config_options(cls, defaults: dict | None = None):
    """Click options generated from a config dataclass's fields (config.flag): name, default, help, choices and
    --help section are written once, in config.py. `defaults` overrides a default for one command (chat's
    shorter --max-tokens). Values typed as text (a duration) reach the command as text: from_flags reads them."""
    options = []
    for f in flag_fields(cls):
        name, m = flag_name(f), f.metadata
        decls = [f"--{name}"] + ([f"-{m['short']}"] if m["short"] else []) + [f.name]
        kw = dict(help=m["help"], section=m["section"])
        if m["from_preset"]:
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
            kw.update(default=(defaults or {}).get(f.name, f.default), show_default=True, type=type(f.default))
        if m["choices"]:
            kw["type"] = click.Choice(m["choices"])
        options.append(option(*decls, **kw))

    def decorate(command):
        for o in reversed(options):
            command = o(command)
        return command

    return decorate


def from_flags(cls, values: dict, **extra):
    """The config the flags describe (a flag not given keeps the field's default), validated."""
    picked = {}
    for f in flag_fields(cls):
        value = values.get(f.name)
        if isinstance(value, tuple):  # a repeatable flag
            value = [config.from_text(f, v) for v in value]
        elif isinstance(value, str) and f.metadata["parse"]:
            value = config.from_text(f, value)
        if value is not None:
            picked[f.name] = value
    return cls(**{**picked, **extra}).validate()


def with_options(*decorators):
    def decorate(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return decorate
