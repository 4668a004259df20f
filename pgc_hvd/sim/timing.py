"""Time-only simulation: the engine's clock without gradients.

    from pgc_hvd.schemes import get_scheme
    from pgc_hvd.sim.comm import parse_comm_model
    from pgc_hvd.sim.timing import time_steps

    recs = time_steps(get_scheme("pgc-cr", 256, 16), d=11_689_512, steps=20,
                      delay="exp:mean=0.3,seed=1", partition_time=0.3,
                      comm=parse_comm_model("ring:alpha=10e-6,gbps=25", plane="allreduce"))

:class:`TimingSimulator` is :class:`~pgc_hvd.sim.engine.Simulator` with the gradients taken
out: the same workers, work plans, delays, straggler policy, comm model (master or collective)
and the scheme's decision rule -- a decision is a pure function of the arrival order, so the
times, the ranks used and the bytes are the full simulator's (the tests check it, record by
record) -- while a message is only its size: 4d bytes dense, 8 kappa (float32 values and int32
indices) with ``compress``. Steps cost microseconds, so n = 1024 runs in seconds
(``pgc-hvd experiment scale``). No loss, no diagnostics; the minimum-error decoder, which reads
compression errors, needs the full simulator.
"""

from __future__ import annotations

from typing import Optional

from pgc_hvd.schemes import Scheme

from .engine import SimConfig, Simulator


class _Sized:
    """A message's stand-in: its size in bytes, and whether it is a sparse (values, indices)."""

    __slots__ = ("nbytes", "sparse")

    def __init__(self, nbytes: int, sparse: bool):
        self.nbytes, self.sparse = int(nbytes), sparse


class TimingSimulator(Simulator):
    """One time-only run (module doc). ``d``: parameters of the model; ``element_size``: bytes
    per entry of a dense message (4: float32)."""

    def __init__(self, scheme: Scheme, d: int, config: SimConfig, element_size: int = 4,
                 writer=None):
        scheme.check_error_norms(False, "the timing simulator has no messages to compress; "
                                        "use the full simulator (pgc_hvd.sim.Simulator)")
        if config.partition_time is None:
            raise ValueError("TimingSimulator: give SimConfig.partition_time (seconds per "
                             "partition gradient); there are no gradients to measure")
        if config.decode_time == "measured":
            raise ValueError("TimingSimulator: decode_time='measured' times real decoding; give "
                             "seconds")
        if not (isinstance(d, int) and d >= 1):
            raise ValueError(f"TimingSimulator: d = {d!r}; give the model's parameter count")
        self.scheme, self.task, self.cfg = scheme, None, config
        self.n = scheme.n
        self.d = int(d)
        self.writer = writer
        self.partition_time = float(config.partition_time)
        self._init_cluster(element_size)
        self.initial: dict = {}
        mb = self.model_bytes if self.kappa is None else 8 * self.kappa
        self._msg = _Sized(mb, self.kappa is not None)

    def run(self):
        # millions of small objects, none cyclic: the cyclic collector only costs time here
        import gc
        was = gc.isenabled()
        gc.disable()
        try:
            return super().run()
        finally:
            if was:
                gc.enable()

    # -- the gradient side, taken out ------------------------------------------------------
    def grads_at(self, v: int):
        return None

    def _message(self, w, plan):
        return self._msg, None, None

    def _message_bytes(self, payload) -> int:
        return payload.nbytes

    def _update(self, decision, step: int, decide_seconds: float):
        self.version = step + 1
        return float(self.cfg.decode_time), {}, {}


def time_steps(scheme: Scheme, d: int, steps: int, partition_time: float, delay=None,
               comm=None, straggler_policy: str = "continue", compress: Optional[float] = None,
               **config) -> list:
    """Records of a time-only run of ``steps`` steps (see :class:`TimingSimulator`)."""
    kw = dict(steps=steps, delay=delay, partition_time=partition_time,
              straggler_policy=straggler_policy, compress=compress, diagnostics=False,
              eval_every=0, **config)
    if comm is not None:
        kw["comm"] = comm
    cfg = SimConfig(**kw)
    return TimingSimulator(scheme, d, cfg).run()


def time_per_step(records, warmup: int = 1) -> float:
    """Mean seconds per step after ``warmup`` steps (PGC's step 0 evaluates every slot), as the
    runtime benchmarks measure it: (time of the last update - time of update ``warmup - 1``) /
    (steps - warmup)."""
    if len(records) <= warmup:
        raise ValueError(f"{len(records)} records: need more than warmup = {warmup}")
    t0 = records[warmup - 1].time if warmup > 0 else 0.0
    return (records[-1].time - t0) / (len(records) - warmup)


__all__ = ["TimingSimulator", "time_steps", "time_per_step"]
