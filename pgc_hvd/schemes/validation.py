"""Parameter checks for schemes (messages name the constraint and a valid alternative), and
:class:`SchemeChecks`, the base class of :class:`~pgc_hvd.schemes.protocol.Scheme` with the
checks asked before or at a scheme's construction, never in a step: the straggler budget s (its
default, its one check, the budget of an experiment setting) and the minimum-error decoder's
precondition (here since issue 46, from ``protocol.py``).

May import: ``codes`` and the standard library.
"""

from __future__ import annotations

import operator
from typing import Optional

from pgc_hvd.codes.validation import check_n_s


def check_choice(scheme: str, option: str, value, choices):
    if value not in choices:
        raise ValueError(
            f"{scheme}: option {option}={value!r} is not one of {list(choices)}; e.g. {option}={choices[0]!r}"
        )
    return value


def check_positive_int(scheme: str, option: str, value, minimum: int = 1, maximum=None, hint: str = ""):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
        maximum is not None and value > maximum
    ):
        rng = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(
            f"{scheme}: option {option} must be an integer {rng}, got {value!r}"
            + (f"; {hint}" if hint else f"; e.g. {option}={minimum}")
        )
    return value


class SchemeChecks:
    """The checks of a scheme asked before or at its construction (module doc); the base class
    of :class:`~pgc_hvd.schemes.protocol.Scheme`, whose class attributes (``name``,
    ``waits_for_all``) they read."""

    name = "scheme"
    #: every step waits for all n workers, so the scheme tolerates no straggler: s = 0 only
    waits_for_all = False

    # -- the straggler budget s (class methods: asked before a scheme is built) ----------
    @classmethod
    def default_stragglers(cls, n: Optional[int] = None) -> int:
        """The straggler budget s when none is given, for n workers (None: any n >= 2): 1, or
        0 for a scheme that waits for every worker (dgd) and for a single worker (n = 1: there
        is no other worker to wait less for, e.g. a one-process debug run). The one place this
        default is written: the optimizer (``stragglers=None``), the command lines and the
        benchmarks ask here (:func:`pgc_hvd.schemes.stragglers_for`)."""
        return 0 if cls.waits_for_all or (n is not None and n <= 1) else 1

    @classmethod
    def check_stragglers(cls, s, n: Optional[int] = None) -> int:
        """s as an int, checked for n workers (None: n not known yet, e.g. a command line
        before the ranks start): an int (TypeError otherwise), n an int >= 1 and 0 <= s <= n -
        1 (:func:`pgc_hvd.codes.validation.check_n_s`'s messages), and 0 for a scheme that
        waits for every worker; each error names the fix. The one checker of s: a scheme's
        construction asks it once (``Scheme.__init__``); the optimizer checks s only there (it
        builds its scheme before any collective:
        :meth:`pgc_hvd.runtime.config.RuntimeConfig.build_scheme`), while the simulator and
        the command lines, which parse s long before a scheme exists, ask it through
        :func:`pgc_hvd.schemes.stragglers_for` (``--stragglers``)."""
        if isinstance(s, bool):
            raise TypeError(f"stragglers must be an int (the straggler budget s), got {s!r}")
        try:
            s = operator.index(s)
        except TypeError:
            raise TypeError(f"stragglers must be an int (the straggler budget s), got "
                            f"{s!r}") from None
        if n is not None:
            check_n_s(cls.name, n, s)
        elif s < 0:
            raise ValueError(f"{cls.name}: s (stragglers tolerated) must be >= 0, got s={s}; "
                             f"e.g. s={cls.default_stragglers()}")
        if cls.waits_for_all and s != 0:
            workers = "workers" if n is None else f"n={n} workers"
            raise ValueError(f"{cls.name} waits for all {workers} and tolerates no stragglers, "
                             f"so s={s} would be ignored; pass s=0 (stragglers=0, --stragglers "
                             f"0, or leave it out), or use 'is-sgd' to drop the s slowest, or a "
                             f"coded scheme ('pgc-cr', 'bcgc', 'gc-cr') to tolerate s "
                             f"stragglers exactly")
        return s

    @classmethod
    def setting_stragglers(cls, s: int) -> int:
        """The budget this scheme runs with in an experiment setting of budget s: s, or 0 for
        a scheme that waits for every worker (the papers run DGD beside the schemes of budget
        s, as the reference of that setting). Asked explicitly by the experiments that do so;
        the simulator and the optimizer refuse dgd with s > 0 (:meth:`check_stragglers`)."""
        return 0 if cls.waits_for_all else int(s)

    # -- the decoder's precondition ------------------------------------------------------
    @property
    def needs_error_norms(self) -> bool:
        """Whether the decoder reads ``Arrival.error_norm`` (the minimum-error class decoder)."""
        return False

    def check_error_norms(self, available: bool, fix: str) -> None:
        """The minimum-error class decoder's precondition (BCGC, Sec. VI-B): it picks the
        complete class whose messages lost least to compression (least sum of ||C(u) - u||), so
        every message it decodes must come with that error, which only compressed messages
        have. ValueError ending with ``fix`` (how the caller's engine gets such messages) when
        :attr:`needs_error_norms` and not ``available``. The one home of this precondition:
        the optimizer (:meth:`~pgc_hvd.runtime.config.RuntimeConfig.check_scheme`), both
        simulators and the decoding round call it."""
        if self.needs_error_norms and not available:
            raise ValueError(f"{self.name} with decoder='min-error' picks the complete class "
                             f"whose messages lost least to compression (least sum of "
                             f"||C(u) - u||), so it needs top-kappa compression: {fix}")
