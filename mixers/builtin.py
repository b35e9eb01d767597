"""Imports every module that registers built-in mixers (one line each; add yours here)."""
