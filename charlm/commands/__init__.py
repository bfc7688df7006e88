"""The commands as plain functions: what `charlm train`, `sample`, `chat`, ... do, callable from Python and
tests without Click. Each takes typed configs (charlm.config) and returns its results, or reports them as
events to a callback; none of them parses flags or draws. cli.py maps flags to these functions' arguments
and draws what they return with charlm.views.

  train.py     train(): a run directory from a corpus (resume, the run lock, torchrun, signals)
  generate.py  sample(): a model's continuations of a prompt, piece by piece
  chat.py      the REPL behind `chat` and `compare -i`: the input loop, /set, /attn, /gates, /load, /save
  compare.py   compare(): several checkpoints on the same prompt
  look.py      attention() and gates(): the numbers the viewers draw
  runs.py      info(), runs() and curves(): what run directories hold, read without torch
"""
