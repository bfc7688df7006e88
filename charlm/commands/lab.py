"""`charlm lab NAME` as a function: the experiment (charlm.lab.run_experiment) and, when its result names an
example and the two runs that show why it came out so (copy: the Transformer's copy head and the LSTM), the
attention and gates the viewers draw beside its table (views.lab.render_lab)."""

from __future__ import annotations

from dataclasses import dataclass

from charlm.options import LabConfig

WHY = ("transformer_run", "lstm_run", "copy_head", "example")  # the details that name the views of why


@dataclass
class LabRun:
    result: object  # lab.result.LabResult
    views: tuple | None = None  # ((tokenizer, Attention), (tokenizer, Gates)): commands.look.copy_views


def lab(name: str, settings: LabConfig | None = None, *, ckpt: str | None = None, progress=None, views=True) -> LabRun:
    """Run the experiment `name` (progress(message) as it goes); with views, also the numbers of the views of
    why, where its details name them."""
    from charlm.lab import run_experiment

    result = run_experiment(name, settings, ckpt=ckpt, progress=progress or (lambda message: None))
    if views and all(key in result.details for key in WHY):
        from charlm.commands.look import copy_views

        return LabRun(result, copy_views(result.details))
    return LabRun(result)
