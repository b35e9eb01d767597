"""``python -m kernels.bench <family> [args...]``: run one kernel family's benchmark."""

from __future__ import annotations

import importlib
import sys

FAMILIES = ("scan", "newton", "fused_rnn", "mlstm", "ssd")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m kernels.bench {{{','.join(FAMILIES)}}} [--quick] [family options]")
        print("Times every implementation of the family and every installed peer library in one run,")
        print("checks each against the reference first, prints a table and writes benchmarks/<family>-*.json.")
        raise SystemExit(0 if argv else 2)
    family, rest = argv[0], argv[1:]
    if family not in FAMILIES:
        raise SystemExit(f"error: unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
    try:
        module = importlib.import_module(f"kernels.{family}.bench")
    except ModuleNotFoundError as err:
        raise SystemExit(f"error: the {family!r} benchmark is not available ({err})") from None
    module.main(rest)


if __name__ == "__main__":
    main()
