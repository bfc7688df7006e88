"""The commands as plain functions: what `charlm train`, `sample`, `chat`, ... do, callable from Python and
tests without Click. Each takes typed configs (charlm.config) and returns its results, or reports them as
events to a callback; none of them parses flags or draws. cli.py maps flags to these functions' arguments
and draws what they return with charlm.views. The two REPLs (chat, compare -i) hand everything they show to
their view (views.chat.ChatView, views.compare.CompareView) and read their lines with views.repl.

  train.py     train(): a run directory from a corpus (resume, the run lock, torchrun, signals)
  generate.py  sample(): a model's continuations of a prompt, piece by piece
  repl.py      the REPL that `chat` and `compare -i` share: the loop, /help, /set, /bye, hints
  chat.py      chat(): the controller of `charlm chat`: the running text, /load, /mode, /attn, /gates, /save
  words.py     the words of /attn and /gates, from the fields of AttnConfig and GatesConfig
  compare.py   compare(): several checkpoints on the same prompt; compare -i on the shared REPL
  evaluate.py  evaluate(): a checkpoint's scores on a text file
  look.py      attention() and gates(): the numbers the viewers draw
  explore.py   every number `charlm explore` shows, computed once per text
  compress.py  compress() and report(): a smaller run, measured
  lab.py       lab(): an experiment of charlm.lab, with the numbers of the views that show why
  runs.py      info(), runs() and curves(): what run directories hold, read without torch
"""

from __future__ import annotations

import os

from charlm.errors import UserError


def user_errors() -> tuple[type[Exception], ...]:
    """What the user can fix: bad settings, files and checkpoints; a run that diverged (errors.UserError)."""
    return (UserError,)


def failure(e: Exception) -> str:
    """The one line that says what went wrong: the user's error as it is; the machine's memory, or another
    process of a torchrun run, with what to do; anything else as a bug, with how to see its traceback."""
    if isinstance(e, user_errors()):
        return str(e)
    if isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "OutOfMemoryError" in type(e).__name__:
        return (
            "out of memory: lower --batch-size (--grad-accum keeps the effective batch), --context, "
            "--d-model or --layers, or close what else uses the memory"
        )
    peer_gone = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and any(words in str(e) for words in peer_gone):
        return "another process of this run stopped (its error is above); this one stops too"
    return f"unexpected {type(e).__name__}: {e} (run with CHARLM_DEBUG=1 for the traceback, and please report it)"
