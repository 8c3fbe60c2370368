"""Closest-name suggestions for error messages ("did you mean ...?")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""`` when nothing is close."""
    matches = difflib.get_close_matches(name.lower(), list(choices), n=1, cutoff=0.5)
    return f"; did you mean {matches[0]!r}?" if matches else ""
