"""Imports every module that registers built-in mixers (one line each; add yours here)."""

import mixers.attention  # noqa: F401,E402
import mixers.cells  # noqa: F401
import mixers.delta  # noqa: F401
import mixers.mamba  # noqa: F401
import mixers.mamba3  # noqa: F401
import mixers.mlstm  # noqa: F401
import mixers.pd_ssm  # noqa: F401
import mixers.rnn  # noqa: F401,E402
import mixers.rwkv7  # noqa: F401
import mixers.signed_mamba  # noqa: F401
