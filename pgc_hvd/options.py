"""``KEY=VALUE`` command-line options (scheme options, control-rule options) for every CLI, and
the shared test of count-like arguments."""

from __future__ import annotations

from typing import Iterable


def is_count(value, minimum: int = 1) -> bool:
    """Whether ``value`` is a Python int >= ``minimum`` (a bool is not a count, nor is 2.0)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_options(items: Iterable[str], what: str = "option") -> dict:
    """``["c=2", "r=2,decoder=min-error"]`` -> ``{"c": 2, "r": 2, "decoder": "min-error"}``.

    Each item holds one or more comma-separated ``KEY=VALUE`` pairs (so ``--opt a=1 --opt b=2``
    and ``--opt a=1,b=2`` mean the same); values become int, else float, else stay strings.
    A pair without ``=`` or with an empty key raises ValueError naming it and the form expected.
    """
    out: dict = {}
    for item in items:
        for pair in filter(None, (p.strip() for p in str(item).split(","))):
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"{what} {pair!r} must look like KEY=VALUE (e.g. c=2); "
                                 f"separate several with commas")
            out[key.strip()] = _value(value.strip())
    return out
