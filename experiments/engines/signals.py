"""SIGTERM as Ctrl-C: ``kill``, ``timeout`` and batch schedulers stop a process with SIGTERM, whose default
action ends it on the spot, before any ``finally`` block. Inside ``sigterm_raises()`` it raises
``Terminated`` (a ``KeyboardInterrupt``) in the main thread instead, so the run unwinds as after Ctrl-C:
workers stopped, trials recorded as interrupted, an MPS daemon stopped."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as a Ctrl-C is."""


def _raise(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one must not cut the clean-up short
    raise Terminated


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises ``Terminated`` in this process's main thread (a process whose whole life
    is the block, such as a sweep worker)."""
    signal.signal(signal.SIGTERM, _raise)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Where SIGTERM has its default action (in the main thread), make it raise ``Terminated`` for the
    block; a handler already set (an outer block, the embedding program) is left as it is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    raise_on_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
