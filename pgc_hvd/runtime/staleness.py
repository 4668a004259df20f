"""The staleness knob: the bound c of a bounded-staleness scheme, changed during training.

Owns c_0 (the bound the optimizer was built with: buffers and control rows are sized for it)
and the checks of a requested bound. The one writer of the scheme's bound while training runs is
the agent thread (:meth:`~pgc_hvd.runtime.agent.CommAgent.request_staleness_bound`: rank 0's request
travels in its control rows and every rank applies it at the same control round); before the
first step a restored checkpoint sets it directly (:meth:`StalenessKnob.restore`).

May import: numpy; the agent is used through its public members.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class StalenessKnob:
    """The staleness bound of ``scheme`` as rank 0 requests it through ``agent``."""

    def __init__(self, scheme, agent):
        self.scheme, self.agent = scheme, agent
        #: the bound c_0 the optimizer was built with; None when c is fixed by the code
        self.c0: Optional[int] = (int(scheme.staleness_bound)
                                  if scheme.staleness_bound_adjustable else None)

    @property
    def bound(self) -> Optional[int]:
        """The bound c the decisions currently use (None for schemes whose c is the code's)."""
        c = self.scheme.staleness_bound
        return None if c is None else int(c)

    def request(self, c: int) -> None:
        """Ask for bound ``c`` in [1, c_0] from the next control round on (module doc)."""
        if self.c0 is None:
            raise ValueError(f"{self.scheme.name}: its pipeline depth c is fixed by the code; only "
                             f"bounded-staleness has a staleness bound that can change (lower the "
                             f"learning rate instead)")
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 1 <= c <= self.c0:
            raise ValueError(f"staleness bound c must be an integer in [1, {self.c0}] (the c "
                             f"this optimizer was built with), got {c!r}")
        self.agent.request_staleness_bound(int(c))

    def restore(self, c: Optional[int]) -> None:
        """Before the first step: a checkpoint's bound. Every rank restores its own value;
        rank 0's request makes them agree at once."""
        if c is not None and self.c0 is not None:
            self.scheme.staleness_bound = int(c)
            self.agent.request_staleness_bound(int(c))
