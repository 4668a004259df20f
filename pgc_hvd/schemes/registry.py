"""Name -> scheme table behind :func:`pgc_hvd.schemes.get_scheme`."""

from __future__ import annotations

import inspect
from typing import Optional

from .bounded_staleness import BoundedStalenessScheme
from .coded import (BCGCScheme, CyclicMDSScheme, GCCRScheme, GCFRScheme, GFRCScheme, GMDSScheme,
                    RSScheme)
from .ignore_straggler import ISGCScheme
from .pipelined import NaivePGCCRScheme, PGCBCGCScheme, PGCCRScheme, PGCFRScheme
from .protocol import Scheme
from .synchronous import DGDScheme, ISSGDScheme

SCHEMES = {
    "dgd": DGDScheme,
    "is-sgd": ISSGDScheme,
    "gc-fr": GCFRScheme,
    "gc-cr": GCCRScheme,
    "is-gc": ISGCScheme,
    "pgc-fr": PGCFRScheme,
    "pgc-cr": PGCCRScheme,
    "pgc-cr-naive": NaivePGCCRScheme,
    "bcgc": BCGCScheme,
    "gfrc": GFRCScheme,
    "gmds": GMDSScheme,
    "rs": RSScheme,
    "pgc-bcgc": PGCBCGCScheme,
    "bounded-staleness": BoundedStalenessScheme,
    "cyclic-mds": CyclicMDSScheme,
}


def default_stragglers(name: str, n: Optional[int] = None) -> int:
    """The straggler budget s of scheme ``name`` when none is given, for n workers (None: any
    n >= 2): 0 for ``dgd`` (it waits for every worker and tolerates no straggler) and for
    n = 1, 1 otherwise (:meth:`~pgc_hvd.schemes.protocol.Scheme.default_stragglers`, where it
    is written)."""
    return scheme_class(name).default_stragglers(n)


def stragglers_for(name: str, n: Optional[int], s=None) -> int:
    """The straggler budget a run of scheme ``name`` over n workers uses: ``s`` checked
    (:meth:`~pgc_hvd.schemes.protocol.Scheme.check_stragglers`: an int in [0, n - 1], 0 for
    dgd; n None: not known yet) or, when None, the scheme's default. Every engine and command
    line resolves s here."""
    cls = scheme_class(name)
    return cls.default_stragglers(n) if s is None else cls.check_stragglers(s, n)


def setting_stragglers(name: str, s: int) -> int:
    """The budget scheme ``name`` runs with in an experiment setting of budget s: s, or 0 for
    dgd, which the papers run beside the schemes of budget s
    (:meth:`~pgc_hvd.schemes.protocol.Scheme.setting_stragglers`)."""
    return scheme_class(name).setting_stragglers(s)


def scheme_options(name: str) -> list[str]:
    cls = SCHEMES[name]
    # LinearGCScheme forwards **code_options to the code (seed for cr/gmds, cache_size)
    params = inspect.signature(cls.__init__).parameters
    out = [p for p, v in params.items() if p not in ("self", "n", "s") and v.kind != v.VAR_KEYWORD]
    if any(v.kind == v.VAR_KEYWORD for v in params.values()):
        from pgc_hvd.codes.registry import CODES

        code_cls = CODES[cls.code_name]
        out += [p for p in inspect.signature(code_cls.__init__).parameters if p not in ("self", "n", "s")]
    return out


def get_scheme(name: str, n: int, s: int, **options) -> Scheme:
    """Build scheme ``name`` for n workers and straggler budget s (see module docs).

    Every scheme uses the s it is given; ``dgd``, which waits for all n workers, takes s = 0
    only (a larger s is a ValueError, not silently ignored;
    :meth:`~pgc_hvd.schemes.protocol.Scheme.check_stragglers`). For the default s, or to check
    s before building, :func:`stragglers_for`."""
    key = scheme_class(name).name
    allowed = scheme_options(key)
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise ValueError(f"scheme {key!r} does not take option(s) {bad}; valid options: {allowed or 'none'}")
    return SCHEMES[key](n, s, **options)


def scheme_class(name: str) -> type:
    """The class of scheme ``name`` (case and ``_``/``-`` do not matter), e.g. to read its
    class attributes (``uses_stale_gradients``) before building one; ValueError if unknown."""
    key = str(name).lower().replace("_", "-")
    if key not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; valid names: {', '.join(SCHEMES)}")
    return SCHEMES[key]
