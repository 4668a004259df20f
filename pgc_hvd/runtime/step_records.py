"""Records: one :class:`~pgc_hvd.metrics.records.StepRecord` per decided step, on rank 0.

Owns the records writer and the ``on_record`` callback. The agent thread only queues a
:class:`~pgc_hvd.runtime.agent.Report` of each decided step (``CommAgent(reports=True)``); the
training thread drains the queue (:meth:`StepRecorder.drain`, at every applied update and at
``close()``/``abandon()``) and writes the records, so ``on_record`` and the writer run on the
training thread, like every other user callback, and never race the optimizer's state.

Threads: the training thread (:meth:`StepRecorder.drain`, the writer, ``on_record``); the agent
thread only queues the reports.
May import: ``metrics``, ``control.momentum``, ``metrics.telemetry``.
"""

from __future__ import annotations

import time
from typing import Optional


class StepRecorder:
    """Writes the records of decided steps (module doc). ``t0``: the run's start (wall time),
    the origin of the records' times."""

    def __init__(self, records=None, on_record=None, *, scheme_name: str, n: int, s: int,
                 t0: Optional[float] = None, param_groups=None, momentum_correction: bool = True):
        self.records, self.on_record = records, on_record
        # the optimizer's param groups and whether updates are momentum-corrected: each record
        # carries the implicit and effective momentum of its update (pgc_hvd.control.momentum)
        self.param_groups, self.momentum_correction = param_groups, bool(momentum_correction)
        self.scheme_name, self.n, self.s = scheme_name, int(n), int(s)
        self.t0 = time.time() if t0 is None else float(t0)

    @property
    def active(self) -> bool:
        """Whether anything consumes records (else the agent need not queue reports)."""
        return self.records is not None or self.on_record is not None

    def drain(self, agent) -> None:
        """Write the records of the steps the agent decided since the last call, in order."""
        if not self.active:
            return
        for rep in agent.take_reports():
            self.write(rep)

    def write(self, rep) -> None:
        from pgc_hvd.metrics.records import StepRecord
        from pgc_hvd.metrics.telemetry import gpu_stats

        dec = rep.decision
        extra = {"control_rounds": rep.info.get("control_rounds"),
                 "control_ops": rep.info.get("control_ops"),
                 "collective": rep.info.get("collective"),
                 "buckets": rep.info.get("buckets"),    # the overlap's bucket allreduces
                 "arrived": list(dec.arrived),
                 "nonfinite_ranks": list(rep.nonfinite_ranks),
                 "gpu": gpu_stats()}
        if rep.info.get("nonfinite_sum"):   # the overlap: a used message held NaN/Inf
            extra["nonfinite_sum"] = True
        if rep.info.get("auto_s") is not None:   # stragglers="auto": the switch after it
            extra["auto_s"] = [rep.info["auto_s"]]
        if rep.c is not None:
            extra["c"] = rep.c  # the bound this decision was taken with
        if self.param_groups is not None:
            from pgc_hvd.control.momentum import momentum_correction
            extra.update(momentum_correction(self.param_groups, dec.info.get("mean_age"),
                                             self.momentum_correction).record())
        rec = StepRecord.from_decision_info(
            dec.step, rep.time - self.t0, dict(dec.info), step_time=rep.info.get("step_time"),
            scheme=self.scheme_name, n=self.n, s=self.s,
            workers_used=[u.worker for u in dec.uses], versions=[u.version for u in dec.uses],
            loss=rep.info.get("loss"), bytes=rep.info.get("bytes"), busy=rep.busy,
            extra=extra)
        if self.records is not None:
            self.records.write(rec)
        if self.on_record is not None:
            self.on_record(rec)

    def close(self) -> None:
        if self.records is not None and hasattr(self.records, "close"):
            self.records.close()
