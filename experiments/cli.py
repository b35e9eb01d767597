"""Shared plumbing of the command-line tools: a user mistake (``ValueError``) becomes a one-line
``error: ...`` with exit code 2, Ctrl-C a one-line resume hint with exit code 130; never a traceback.
"""

from __future__ import annotations

import sys
from typing import Callable


def run_cli(body: Callable[[], None], resume_hint: str = "re-run the same command to resume") -> int:
    """Run a CLI's ``body``; returns the process exit code (0, 2 for bad input, 130 if interrupted)."""
    try:
        body()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {resume_hint}", file=sys.stderr)
        return 130
    return 0
