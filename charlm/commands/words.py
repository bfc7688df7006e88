"""Chat's words: its / commands (CHAT_COMMANDS, listed by chat's /help and by `charlm help chat`, so kept free
of torch), and the words after /attn and /gates, read off the fields of options.AttnConfig and GatesConfig
(the same fields give `charlm attn` and `charlm gates` their flags): a new field there is a new word here,
with its help. parse_words turns the words into the config; words_help lists them (/attn help)."""

from __future__ import annotations

import re

from charlm.commands.repl import QUIT, SHARED_COMMANDS, Session, did_you_mean
from charlm.errors import ConfigError
from charlm.settings import flag_fields, from_text

CHAT_COMMANDS = {  # chat's, in the order /help lists them
    **SHARED_COMMANDS,
    "/show": "the settings and the model",
    "/clear": "forget the running text (also /reset)",
    "/load": "/load CKPT: switch to another checkpoint (a file or a run directory), keeping the settings",
    "/mode": "/mode fresh|continue: each prompt starts anew, or continues the running text",
    "/attn": "/attn [args]: the attention over the running text (transformer; /attn help)",
    "/gates": "/gates [args]: the gates over the running text (LSTM/GRU; /gates help)",
    "/save": "/save FILE: write the transcript to FILE",
    **QUIT,
}
CHAT_HELP_ROWS = [  # the keys and forms of input beside the commands
    Session.HELP_ROWS[0],
    ("Enter", "on an empty line in continue mode: go on with the text"),
    *Session.HELP_ROWS[1:],
]


def parse_words(cls, words: list[str], command: str):
    """The words after /attn or /gates as a config: a field's name turns a switch on (overview) or takes the
    next word as its value (tokens 40); a choice is its value alone (abs); bare numbers fill the
    positional fields in order (/attn 1 2: layer 1, head 2); an optional text may go without a value
    (focus: the last token)."""
    fields = {f.name: f for f in flag_fields(cls)}
    positional = [f for f in fields.values() if f.metadata["positional"]]
    values, numbers, i = {}, [], 0
    while i < len(words):
        word, key = words[i], words[i].lower().replace("-", "_")
        f = fields.get(key)
        choice = next((c for c in fields.values() if key in (c.metadata["choices"] or ())), None)
        if f is not None and f.type == "bool":
            values[key] = True
        elif f is not None:
            takes_text = f.type == "str | None" and not f.metadata["choices"]
            if i + 1 < len(words) and not (takes_text and words[i + 1].lower() in fields):
                values[key] = from_text(f, words[i + 1])
                i += 1
            elif takes_text:
                values[key] = ""
            else:
                raise ConfigError(f"'{word}' needs a value after it: try /{command} help")
        elif choice is not None:
            values[choice.name] = key
        elif re.fullmatch(r"-?\d+", word):
            numbers.append(int(word))
        else:
            words_known = [*fields, *(c for f in fields.values() for c in f.metadata["choices"] or ())]
            raise ConfigError(
                f"unknown /{command} argument '{word}'{did_you_mean(key, words_known)}: try /{command} help"
            )
        i += 1
    if len(numbers) > len(positional):
        names = " and ".join(f"a {f.name}" for f in positional)
        raise ConfigError(f"/{command} takes at most {names}, got {len(numbers)} numbers: try /{command} help")
    values.update({f.name: n for f, n in zip(positional, numbers)})
    return cls(**values)  # (checked as it is made)


def words_help(cls, command: str) -> list[tuple[str, str]]:
    """/attn help, /gates help: every word with its field's help."""
    fields = flag_fields(cls)
    positional = [f.name.upper() for f in fields if f.metadata["positional"]]
    rows = [
        (
            f"/{command} " + " ".join(f"[{p}" for p in positional) + "]" * len(positional),
            "the view of the running text; words may follow:",
        )
    ]
    for f in fields:
        if f.metadata["positional"]:
            continue
        if f.type == "bool":
            word = f.name
        elif f.metadata["choices"]:
            word = "|".join(f.metadata["choices"])
        else:
            word = f"{f.name} {'[TEXT]' if f.type == 'str | None' else 'N'}"
        rows.append((f"  {word}", f.metadata["help"].replace("--", "")))
    rows += [
        (f"  {p}", f.metadata["help"]) for p, f in zip(positional, [f for f in fields if f.metadata["positional"]])
    ]
    return rows
