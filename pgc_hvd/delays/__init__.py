"""Straggler delays: seeded delay models, their specs, and delay traces that can be saved and replayed.

Both engines use these: the simulator adds ``sample(worker, step)`` seconds of virtual time to
a worker's compute time at step t; the Horovod runtime sleeps that long (straggler injection).

API
---
Every model is a :class:`DelayModel` with

* ``sample(worker, step) -> float`` seconds >= 0, a pure function of (seed, worker, step) and
  the model's parameters: the same call always returns the same value, in any order, in any
  process (each (worker, step) draws from its own ``numpy`` stream seeded by
  ``SeedSequence([seed, salt, worker, step])``, ``salt`` a fixed per-model-type constant);
* ``matrix(n, steps) -> ndarray (steps, n)`` the same values for a block of steps;
* ``to_dict()`` / :func:`from_dict` a JSON-able spec (``{"type": ..., params...}``), and
  ``str(model)`` / :func:`parse_delay` a short text spec for command lines;
* ``a + b`` -> :class:`Sum` (delays add; combinations such as log-normal plus occasional
  long stragglers).

Models (``seed`` defaults to 0; give two components of the same type different seeds if they
must be independent):

=========================================  =============================================  ==========
class                                      sample                                          text spec
=========================================  =============================================  ==========
``Zero()``                                  0                                               ``none``
``Constant(value)``                         value                                           ``const:value=0.1``
``Exponential(mean, seed)``                 Exp with mean ``mean``                          ``exp:mean=1``
``LogNormal(mu, sigma, seed)``              exp(N(mu, sigma^2))                             ``lognormal:mu=-1,sigma=0.5``
``Pareto(shape, scale, seed)``              scale * (U^(-1/shape) - 1) (Lomax, >= 0,
                                            heavy tail, mean scale/(shape-1) if shape>1)    ``pareto:shape=1.5,scale=0.1``
``LongStraggler(p, low=10, high=30, seed)`` with prob. p: Uniform(low, high), else 0        ``straggler:p=0.01,low=10,high=30``
``FixedStragglers(n, count, delay, seed)``  ``delay`` for a seeded random set of exactly
                                            ``count`` of the n workers at each step, else 0  ``fixed:n=100,count=20,delay=5``
``SlowWorker(worker, delay)``               ``delay`` for worker ``worker``, else 0          ``slow:worker=2,delay=0.04``
``SpeedClasses(n, count, delay, seed)``     ``delay`` for a seeded set of ``count`` of the
                                            n workers, fixed for the run, else 0             ``classes:n=12,count=3,delay=1``
``Transient(n, count, delay, start, stop)`` as ``SpeedClasses`` for steps in [start, stop),
                                            0 before and after                              ``transient:n=12,count=2,delay=4,start=100,stop=240``
``Sum(m1, m2, ...)``                        m1 + m2 + ...                                   ``exp:mean=1+straggler:p=0.01``
``Heterogeneous(base, factors)``            factors[worker % len] * base(worker, step)      (dict spec only)
``Scaled(base, factor)``                    factor * base                                   (dict spec only)
=========================================  =============================================  ==========

Named straggler patterns (none, exponential, a persistently slow rank, two speed classes,
heavy-tailed per-batch cost, stragglers that come and go, log-normal with rare long
stragglers): :func:`pattern_spec` (``name, n, compute, steps, seed``) -> the text spec above,
:data:`PATTERNS` their names, :func:`pattern_name` a name or alias (``slow``, ``pareto``) to its
entry (:mod:`.patterns`: the one table the apps and the benchmarks read).

Traces
------
``rec = Recording(model)`` samples through ``model`` and remembers every value;
``rec.trace`` is a :class:`DelayTrace`, ``trace.save(path)`` writes JSON
``{"format": "pgc_hvd.delay_trace/1", "model": <spec or null>, "delays": [[worker, step,
seconds], ...]}`` and ``DelayTrace.load(path)`` reads it back. ``Replay(trace, fallback=None)``
returns the recorded values (bit-identical floats) and, for a (worker, step) not in the trace,
``fallback.sample`` or a ``ValueError`` naming the trace's extent; the simulator and
``pgc-hvd train`` call ``check_trace_covers(model, n, steps)`` first, so a trace from a run with
fewer workers or steps is refused before the run starts. ``DelayTrace.from_model(model, n,
steps)`` precomputes a whole schedule. Replaying one trace under several schemes makes every
scheme face the same straggler schedule, as the papers did with fixed seeds.
"""


from .models import (Constant, DelayModel, Exponential, FixedStragglers, Heterogeneous,
                     LogNormal, LongStraggler, Pareto, PerWorker, Scaled, SlowWorker, Sum, Zero)
from .patterns import (PATTERN_ALIASES, PATTERNS, SpeedClasses, Transient, pattern_model,
                       pattern_name, pattern_spec)
from .spec import as_delay_model, check_trace_covers, check_workers, from_dict, parse_delay
from .traces import TRACE_FORMAT, DelayTrace, Recording, Replay

__all__ = ["DelayModel", "Zero", "Constant", "Exponential", "LogNormal", "Pareto", "LongStraggler",
           "FixedStragglers", "SlowWorker", "SpeedClasses", "Transient", "PATTERNS",
           "PATTERN_ALIASES", "pattern_name", "pattern_spec", "pattern_model", "Sum", "Scaled", "Heterogeneous", "PerWorker",
           "DelayTrace",
           "Recording", "Replay", "TRACE_FORMAT", "as_delay_model", "check_trace_covers",
           "check_workers", "from_dict", "parse_delay"]
