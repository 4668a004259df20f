"""Exact gradient-coding schemes: every worker evaluates all the partitions of
its support each step and sends g^_i = sum_k B[i,k] g_k.

* Binary class codes -- GC-FR (``fr``), GFRC, BCGC: the message is the plain sum of
  the support; the master sums one worker per block of the first complete
  recovery group (weights 1/n), see :class:`FirstCompleteRound`
  (here, beside the schemes that use it).
* Linear codes -- GC-CR (``cr``), G-MDS, RS (and cyclic MDS): the master waits for
  the first n-s arrivals I and solves a_I B_I = 1 (cached per I); weights a_i / n.
  ``info`` reports ||a_I||_1 (as ``decode_norm1``) and ``residual`` ||a_I B_I - 1||.
"""

from __future__ import annotations

from typing import Optional

from pgc_hvd.codes import get_code

from .protocol import Arrival, Decision, FirstKRound, Round, Scheme
from .validation import check_choice

BINARY_DECODERS = ("first-complete", "n-s", "min-error")


class FirstCompleteRound(Round):
    """Binary class codes. Arrivals go, O(1) each, into a streaming
    first-complete-group decoder; the round fires

    * ``decoder="first-complete"``: as soon as a group is complete;
    * ``decoder="n-s"``: at the (n-s)-th arrival, with the group completed first;
    * ``decoder="min-error"``: at the (n-s)-th arrival, with the complete class of
      smallest sum of compression-error norms (BCGC paper, Sec. VI-B).
    """

    def __init__(self, scheme, step):
        super().__init__(scheme, step)
        self.dec = scheme.new_decoder()

    def _on_arrival(self, arrival: Arrival) -> Optional[Decision]:
        sch = self.scheme
        group = self.dec.offer(arrival.worker)
        if sch.decoder == "first-complete":
            if group is None:
                return None
            return self._decide_group(group, self.dec.representatives())
        if len(self.arrived) < sch.n - sch.s:
            return None
        if sch.decoder == "n-s":
            return self._decide_group(self.dec.complete, self.dec.representatives())
        from pgc_hvd.codes import min_error_class

        errors = {}
        for w in self.arrived:
            e = self.arrivals[w].error_norm
            sch.check_error_norms(e is not None, f"worker {w}'s arrival has no error_norm "
                                                 f"(||C(g^_i) - g^_i||)")
            errors[w] = float(e)
        j = min_error_class(sch.code.classes, self.arrived, errors)
        members = sch.code.classes[j]
        return self._decide_group(j, members, {"class_error": sum(errors[i] for i in members)})

    def _decide_group(self, group, members, extra=None):
        w = 1.0 / self.scheme.n
        info = {"group": group}
        if extra:
            info.update(extra)
        return self.decide({i: w for i in members}, info)


class BinaryGCScheme(Scheme):
    """Binary class code with first-complete (or n-s, or minimum-error) decoding.

    Options: ``decoder`` in {"first-complete", "n-s", "min-error"};
    ``recovery`` in {"cover", "class"}: "cover" lets FRC/GFRC use one worker per
    block across classes (Tandon's FRC decoding), "class" insists on a whole
    class (BCGC Algorithm 1; identical for BCGC).
    """

    round_type = FirstCompleteRound
    code_name = "bcgc"
    default_decoder = "first-complete"

    def __init__(self, n: int, s: int, decoder: str | None = None, recovery: str = "cover"):
        super().__init__(n, s)        # checks s against n (check_stragglers)
        n, s = self.n, self.s
        self.code = get_code(self.code_name, n, s)
        self.decoder = check_choice(self.name, "decoder", decoder or self.default_decoder, BINARY_DECODERS)
        self.recovery = check_choice(self.name, "recovery", recovery, ("cover", "class"))

    def supports(self):
        return self.code.supports

    def new_decoder(self):
        return self.code.decoder(self.recovery)

    @property
    def needs_error_norms(self) -> bool:
        return self.decoder == "min-error"


class GCFRScheme(BinaryGCScheme):
    """GC-FR as in the PGC paper: wait for n-s messages, take one per group."""

    name = "gc-fr"
    code_name = "fr"
    default_decoder = "n-s"


class GFRCScheme(BinaryGCScheme):
    name = "gfrc"
    code_name = "gfrc"


class BCGCScheme(BinaryGCScheme):
    name = "bcgc"
    code_name = "bcgc"

    def __init__(self, n: int, s: int, decoder: str | None = None, recovery: str = "class"):
        super().__init__(n, s, decoder=decoder, recovery=recovery)


class LinearGCScheme(Scheme):
    """Real/complex code: fire at the first n-s arrivals, weights a_I / n."""

    round_type = FirstKRound
    code_name = "cr"

    def __init__(self, n: int, s: int, **code_options):
        super().__init__(n, s)        # checks s against n (check_stragglers)
        n, s = self.n, self.s
        self.code = get_code(self.code_name, n, s, **code_options)
        self.complex_messages = self.code.is_complex

    def supports(self):
        return self.code.supports

    def slot_coefficients(self, worker):
        return tuple(coef for _, coef in self.code.coefficients(worker))

    def weights_for(self, workers, rnd):
        res = self.code.decode_result(workers)
        a = res.a
        cast = complex if self.complex_messages else float
        weights = {i: cast(a[i]) / self.n for i in workers}
        return weights, {"residual": res.residual, "a_norm1": res.norm1}


class GCCRScheme(LinearGCScheme):
    name = "gc-cr"
    code_name = "cr"


class GMDSScheme(LinearGCScheme):
    name = "gmds"
    code_name = "gmds"


class RSScheme(LinearGCScheme):
    name = "rs"
    code_name = "rs"


class CyclicMDSScheme(LinearGCScheme):
    name = "cyclic-mds"
    code_name = "cyclic-mds"
