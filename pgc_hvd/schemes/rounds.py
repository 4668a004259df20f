"""Round types shared by several schemes: wait for the first k arrivals, or
stream arrivals into a first-complete-group decoder."""

from __future__ import annotations

from typing import Optional

from .protocol import Arrival, Decision, Round


class FirstKRound(Round):
    """Fires at the k-th distinct current-step arrival (k = ``scheme.wait_for``);
    the weights come from ``scheme.weights_for(first_k_workers, round)``."""

    def _on_arrival(self, arrival: Arrival) -> Optional[Decision]:
        if len(self.arrived) < self.scheme.wait_for:
            return None
        weights, extra = self.scheme.weights_for(list(self.arrived), self)
        return self.decide(weights, extra)


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
