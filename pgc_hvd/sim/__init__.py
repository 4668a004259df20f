"""Single-process simulator: n virtual workers and one decoder in virtual time.

* :mod:`.engine`: the event-driven cluster (:class:`~.engine.Simulator`, :class:`~.engine.SimConfig`),
  with its parts :mod:`.workers` (a worker's ring and message), :mod:`.agents` (the runtime's
  agents under the collective model), :mod:`.step_records` (busy seconds, diagnostics) and
  :mod:`.progress` (the bar, when a run stops);
* :mod:`.timing`: the same clock without gradients (n up to 1024);
* :mod:`.comm`: the master and collective (alpha-beta) communication models;
* :mod:`.gradients`: per-partition gradients of a task;
* :mod:`.decomposition`: the error-decomposition probe (PGC paper, Lemmas 1 and 3);
* :mod:`.run`: :func:`~.run.simulate`, one run from plain settings.

Delays come from :mod:`pgc_hvd.delays` (shared with the Horovod runtime's straggler
injection); the command lines that drive the simulator live in :mod:`pgc_hvd.apps`.
"""
