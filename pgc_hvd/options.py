"""``KEY=VALUE`` command-line options (scheme options, control-rule options) for every CLI, the
one parser of ``NAME:K=V,...`` specs (delays, compression, links, optimizers), and the shared
test of count-like arguments."""

from __future__ import annotations

from typing import Iterable, NamedTuple, Optional


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


class SpecPart(NamedTuple):
    """One comma-separated part of a spec: ``key`` (stripped; None for a part without ``=``),
    ``value`` (stripped) and the part's ``text`` as written (stripped), for error messages."""

    key: Optional[str]
    value: str
    text: str


def split_spec(spec) -> tuple[str, str, list]:
    """``"NAME:K=V,K=V"`` -> ``(name, rest, [SpecPart, ...])``: the one parser of the package's
    ``NAME:K=V`` specs (``exp:mean=0.1,seed=1``, ``topk:0.01,ef=0``, ``ring:alpha=1e-5,gbps=25``,
    ``sgd:lr=0.5``). ``name`` is stripped (case kept), ``rest`` is the text after the first
    colon; empty parts are skipped. Casting the values and naming a wrong part are the
    caller's: each spec has its own keys and its own example of the right spelling."""
    name, _, rest = str(spec).partition(":")
    parts = []
    for raw in rest.split(","):
        if not raw.strip():
            continue
        key, eq, value = raw.partition("=")
        parts.append(SpecPart(key.strip() if eq else None, (value if eq else raw).strip(),
                              raw.strip()))
    return name.strip(), rest, parts
