"""What every ``python -m analysis.X`` shares: logging setup and one-line errors for bad input."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger("analysis")


def setup_logging(verbose: bool = False) -> None:
    """INFO (or DEBUG) messages through ``rich`` on stderr, once per process."""
    if logging.getLogger().handlers:
        logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
        return
    try:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, show_time=False)
        fmt = "%(message)s"
    except ImportError:  # pragma: no cover - rich is a dependency
        handler, fmt = logging.StreamHandler(), "%(levelname)s %(message)s"
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=fmt, handlers=[handler])
    for noisy in ("fontTools", "matplotlib", "PIL"):  # font subsetting chatter when writing PDFs
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; bad input (``ValueError``, ``TypeError``, ``OSError``) -> ``error: ...``, exit 2.

    Usage in a module: ``if __name__ == "__main__": sys.exit(run(main))``.
    """
    try:
        main(argv)
    except (ValueError, TypeError, OSError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        sys.stderr.write(f"error: {msg}\n")
        return 2
    return 0


def csv_list(kind: type = str) -> Callable[[str], list]:
    """An argparse ``type``: ``"a,b,c"`` -> ``[kind(a), kind(b), kind(c)]`` with a clear error."""
    import argparse

    def parse(text: str) -> list:
        try:
            return [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}"
            ) from None

    return parse
