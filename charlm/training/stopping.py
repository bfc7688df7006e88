"""How a run stops: the signals that stop it (stop_signals) and what they do from set-up to exit (RunSignals),
with the exceptions that carry a stop through the trainer (SetupInterrupted, Quit, Abandon).
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager


class Abandon(Exception):
    """A stop was asked for: the evaluation or sample under way is given up (the run saves and stops)."""


class Quit(Exception):
    """A second signal: stop now, without saving."""

    def __init__(self, signum: int):
        self.signum = signum


class SetupInterrupted(Exception):
    """A signal before training started (nothing of this session to save)."""

    def __init__(self, signum: int):
        self.signum = signum


def stop_signals(distributed_run: bool = False) -> tuple[int, ...]:
    """The signals that stop a run, saved: Ctrl-C, SIGTERM (kill, timeout, a scheduler) and SIGHUP (the terminal
    closed). Under torchrun only Ctrl-C: SIGTERM and SIGHUP stay the launcher's way to stop a rank (one blocked
    in a collective whose peer died cannot run a Python handler)."""
    extra = () if distributed_run else (signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))
    return (signal.SIGINT, *extra)


class RunSignals:
    """What the stop signals do to a run, from its set-up to its exit.

    Entered (`with signals:`), it installs its handler. In set-up a first signal raises SetupInterrupted at
    once. Inside deferring() (fit: training, evaluations, samples, saves) a first signal only sets `requested`
    and tells notify() at once; the run gives up an evaluation or sample under way, saves at the step it is
    at and stops. A second signal quits without saving (Quit), except inside holding(): a checkpoint being
    written is finished first (a signal inside torch.save would lose it), and the run stops right after,
    saved. Once a stop is under way (`stopping`) or training is over, further signals are ignored. With
    settle=True they stay ignored once the block ends (a process that only has to print and exit); else the
    handlers before are back. Only the main thread can handle signals, so elsewhere it does nothing."""

    def __init__(self, *signums: int, notify=None, settle: bool = False):
        self.signums, self.settle = signums, settle
        self.notify = notify or (lambda signum, saving: None)
        self.requested = False
        self.signum: int | None = None  # the first signal
        self.held = self.stopping = self.deferred = self.over = False
        self.depth = 0
        self.previous: dict[int, object] = {}

    def _handle(self, signum, frame):
        if self.stopping or self.over:
            return
        if not self.requested:
            self.requested, self.signum = True, signum
            if not self.deferred:
                self.stopping = True
                self._tell(signum, saving=False)
                raise SetupInterrupted(signum)
            self._tell(signum, saving=True)
        elif self.held:
            self.stopping = True
        else:
            self.stopping = True
            raise Quit(signum)

    def _tell(self, signum: int, saving: bool) -> None:
        try:  # a terminal that closed (SIGHUP) cannot be written to: the save matters, the words do not
            self.notify(signum, saving)
        except (Quit, SetupInterrupted):  # a second signal while the first was being told
            raise
        except Exception:
            pass

    @contextmanager
    def holding(self):
        """Signals only set `requested` in here."""
        held, self.held = self.held, True
        try:
            yield
        finally:
            self.held = held

    @contextmanager
    def deferring(self):
        """Training: a first signal asks for a stop, saved; see the class."""
        self.requested, self.signum, self.stopping, self.over, self.deferred = False, None, False, False, True
        try:
            yield self
        finally:
            self.deferred, self.over = False, True

    def __enter__(self) -> RunSignals:
        self.depth += 1
        if self.depth == 1:
            self.requested, self.signum, self.stopping, self.over = False, None, False, False
            if threading.current_thread() is threading.main_thread():
                self.previous = {s: signal.signal(s, self._handle) for s in self.signums}
            self._unraisable, sys.unraisablehook = sys.unraisablehook, self._quiet_unraisable
        return self

    def _quiet_unraisable(self, unraisable) -> None:
        """A signal's exception raised where Python cannot raise it (inside a weakref callback of importlib's
        module locks) is printed as 'Exception ignored … Traceback'; `requested` keeps the signal, and the
        command checks it (compress does before its one rename), so say nothing."""
        if not isinstance(unraisable.exc_value, (SetupInterrupted, Quit)):
            self._unraisable(unraisable)

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        if self.depth:
            return
        for s, previous in self.previous.items():  # None: set outside Python; fall back to the default
            signal.signal(s, signal.SIG_IGN if self.settle else previous if previous is not None else signal.SIG_DFL)
        self.previous = {}
        sys.unraisablehook = self._unraisable
