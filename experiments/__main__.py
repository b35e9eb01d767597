"""``python -m experiments`` is ``python -m experiments.sweep``."""

import sys

from experiments.sweep import main

sys.exit(main())
