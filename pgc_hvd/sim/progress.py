"""A simulated run's progress: the bar on stderr and the rule that ends the run.

Owns :class:`Progress` (``SimConfig.progress``: wall-clock seconds, the last redraw) and
:func:`stops` (the step budget, ``stop_at_target`` on a loss or accuracy target,
``max_time``). Reads a :class:`~pgc_hvd.metrics.records.StepRecord` and the config; writes
nothing else.

May import: ``metrics`` (layer 1); never the engine.
"""

from __future__ import annotations

import sys
import time as _time

from pgc_hvd.metrics.records import StepRecord


def stops(cfg, rec: StepRecord, t: float, step: int) -> bool:
    """Whether the run ends after ``step`` records, the last ``rec`` at virtual time t."""
    if step >= cfg.steps:
        return True
    if cfg.stop_at_target and cfg.target_loss is not None and rec.loss is not None \
            and rec.loss <= cfg.target_loss:
        return True
    if cfg.stop_at_target and cfg.target_accuracy is not None and rec.accuracy is not None \
            and rec.accuracy >= cfg.target_accuracy:
        return True
    if cfg.max_time is not None and t >= cfg.max_time:
        return True
    return False


class Progress:
    """The progress bar on stderr (``SimConfig.progress``)."""

    def __init__(self, cfg, name: str):
        self.cfg, self.name = cfg, name
        self.wall0 = self.last = _time.perf_counter()

    def tick(self, step: int, t: float, rec: StepRecord) -> None:
        cfg = self.cfg
        if cfg.progress and (_time.perf_counter() - self.last > 0.5 or step == cfg.steps):
            self.last = _time.perf_counter()
            bar = "#" * int(20 * step / cfg.steps)
            print(f"\r{cfg.label or self.name:>24} [{bar:<20}] {step}/{cfg.steps} "
                  f"t={t:9.2f}s loss={rec.loss if rec.loss is not None else float('nan'):.4f} "
                  f"({_time.perf_counter() - self.wall0:.0f}s)", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.cfg.progress:
            print(file=sys.stderr)
