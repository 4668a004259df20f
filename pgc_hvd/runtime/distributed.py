"""``pgc_hvd.DistributedOptimizer``: the public constructor, in Horovod's signature.

Owns the signature and its documentation (Horovod's positional arguments in Horovod's order,
the scheme, the straggler budget and every pgc_hvd option keyword-only), the mapping of
Horovod's keywords into a :class:`~pgc_hvd.runtime.config.RuntimeConfig`
(:func:`~pgc_hvd.runtime.config.from_horovod`) and the dynamic subclass of the user's optimizer
class that carries the facade's methods (:class:`~pgc_hvd.runtime.optimizer.PGCOptimizer`), so
``isinstance(opt, torch.optim.SGD)`` still holds. Checks and defaults are the config's; what
the optimizer does per step is the facade's (:mod:`pgc_hvd.runtime.optimizer`).

Thread: the training thread, at construction; no state.
May import: torch, ``runtime.config``, ``runtime.optimizer``, ``runtime.communicator``
(``name_unnamed_ops``) and ``runtime.engine`` (which imports the engine, Horovod or
pgc_hvd's torch.distributed engine, only when ``hvd`` is not given).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from pgc_hvd.runtime.config import DEFAULT_CONTROL, RuntimeConfig, from_horovod, renamed_keyword
from pgc_hvd.runtime.optimizer import facade_methods


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression: Any = None, backward_passes_per_step: int = 1, op=None,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False, process_set=None, *,
                         scheme: str = "pgc-cr", stragglers: Any = None,
                         delay=None, records=None, scheme_options: Optional[dict] = None,
                         timeout: float = 60.0, poll_interval: float = 0.002, on_record=None,
                         on_update=None, replay_arrivals=None, straggler_policy: str = "continue",
                         optimistic: Optional[bool] = None, control: str = DEFAULT_CONTROL,
                         name: str = "pgc", metrics=(), momentum_correction: bool = True,
                         overlap: Optional[bool] = None, bucket_cap_mb: float = 25.0,
                         hvd=None, engine=None, auto: Optional[dict] = None, delays=None):
    """Wrap ``optimizer`` so that each step uses the messages of the n-s fastest ranks.

    The positional arguments are Horovod's, in Horovod's order (``optimizer,
    named_parameters, compression, backward_passes_per_step, op, ...``); the scheme, the
    straggler budget and every pgc_hvd option are keyword-only.

    Args:
        optimizer: the user's torch optimizer (its class and hyper-parameters are kept).
        named_parameters: ``model.named_parameters()`` (checked to cover the optimizer's).
        scheme: any name of :func:`pgc_hvd.schemes.get_scheme` (``dgd``, ``pgc-cr``, ``bcgc``,
            ``gc-cr``, ``bounded-staleness``, ...); n = ``hvd.size()``.
        stragglers: the straggler budget s; default (None): 0 for ``dgd`` (it waits for every
            rank), 1 for every other scheme, and 0 on a single rank (``python train.py``: a
            warning says so once; :meth:`~pgc_hvd.schemes.protocol.Scheme.default_stragglers`).
            ``"auto"``: chosen while training from the ranks' own delays, re-planned at
            boundaries (:mod:`pgc_hvd.runtime.auto_s`, docs/control.md "s chosen online");
            ``auto`` takes the rule's options (``{"s_max": 2, "every": 20, ...}``).
        compression: None (dense messages) or :class:`TopK` (sparse top-kappa, error feedback);
            Horovod's ``hvd.Compression.none`` (dense) and ``hvd.Compression.fp16`` (dense
            messages travel as float16: half the bytes) are accepted.
        backward_passes_per_step: as Horovod's: the gradients of up to this many backward
            passes per partition accumulate in ``p.grad`` before ``step()``; more raise.
        op: ``hvd.Average`` (default: the decoded update is the average gradient, as Horovod's)
            or ``hvd.Sum`` (n times it); ``hvd.Adasum`` is refused (its pairwise projections
            need every rank's gradient, which gradient coding does not wait for).
        gradient_predivide_factor: accepted (> 0, with ``op=hvd.Average``, as Horovod requires);
            it only splits Horovod's averaging into a pre- and post-division for fp16
            range; pgc_hvd decodes in fp32 with the code's coefficients, so it changes nothing.
        num_groups, groups, sparse_as_dense, process_set: Horovod's allreduce fusion and
            sparse options; accepted for compatibility (one flat coded message per step; sparse
            gradients are densified into the ring). A ``process_set`` other than the global one
            is refused.
        delay: straggler injection, any object with ``sample(worker, step) -> seconds`` (the
            simulator's delay models and traces, :mod:`pgc_hvd.delays`) or a spec string in
            the simulator's ``--delay`` syntax (``"exp:mean=0.1,seed=1"``); slept on the
            compute side of this rank. ``delays=``, its old name, still works, with a
            FutureWarning (once a process) saying to write ``delay=``.
        records: a :class:`~pgc_hvd.metrics.records.RecordWriter` (rank 0 writes one StepRecord
            per step) or None; ``on_record`` is called with each record on rank 0.
        scheme_options: extra options for the scheme (e.g. ``{"decoder": "first-complete"}``;
            ``"min-error"`` with ``compression``: every rank sends ||C(u) - u|| in its control
            row, and the step takes the complete class of least total error, BCGC Sec. VI-B).
        timeout: seconds after which a collective or a step with no answer raises
            :class:`~pgc_hvd.runtime.agent.AgentError` (a rank died or hung).
        poll_interval: seconds between control rounds while waiting.
        on_update: ``on_update(step, flat_update)`` is called on the training thread with every
            decoded update (the flat vector handed to the user's optimizer) before it is applied;
            its buffer is recycled after the step, so clone it to keep it.
            A callable that takes three positional arguments is called as
            ``on_update(step, flat_update, decision)`` with the step's
            :class:`~pgc_hvd.schemes.protocol.Decision` (messages used, their versions,
            ``decision.info["max_age"]`` counting ring slots); decided once from its signature.
        replay_arrivals: ``[(worker, step), ...]`` in arrival order, e.g. a simulator's
            ``arrival_log``: the ranks' messages are offered to the scheme in exactly that order
            (while it lasts), and each rank computes exactly the steps it computes there, so the
            run takes the simulated run's decisions whatever the real timing (twin tests,
            reproducing a schedule). Every rank must pass the same list.
        straggler_policy: what a rank does when the step it is computing fires without it
            (the simulator's option of the same name). ``"continue"`` (default): it finishes
            the step and sends its late message (dropped by exact and pipelined schemes, used by
            bounded staleness). ``"cancel"`` (exact and pipelined schemes): it abandons the rest
            of the step at the next point the runtime controls -- before its next partition, or
            during the injected ``delay`` -- keeps the ring slots it has evaluated (PGC paper:
            every worker stores its own gradients whether it straggles or not), sends nothing
            and starts the newest model; the model of the paper's analysis, where every worker
            starts every step and s(t, i) >= t - c + 1. It cannot interrupt a forward/backward
            pass in progress.
        optimistic: one-collective steps: a rank's payload travels in the same allgather as
            the control row that first shows it ready, so a step that fires on that control
            round needs no second collective (every rank then receives every current-step
            payload, also the ones the decision leaves out: n payloads). Default (None): on for
            CPU payload rows while n of them are at most
            ``pgc_hvd.compress.codecs.OPTIMISTIC_BYTES`` (4 MiB, measured;
            ``PGC_HVD_OPTIMISTIC_BYTES``), where latency dominates; off above it, where the
            step is decided on control rows alone and dense messages move in ONE allreduce of
            the ranks' weighted contributions (2 (n-1)/n * 4d bytes per rank, as Horovod's),
            sparse ones in an allgather of the chosen rows (:mod:`pgc_hvd.compress.codecs`).
        metrics: names of small user metrics (e.g. ``["accuracy"]``) that ``step(metrics=
            {"accuracy": a})`` sends in the control row; :attr:`metrics` gives every rank the
            decided step's means (and the loss's) with no extra collective.
        momentum_correction: True (default): each update is applied with the optimizer's
            momentum less the momentum its stale gradients already add (mu_imp = a/(1+a) for the
            update's mean gradient age a; beta' = max(0, beta - mu_imp), SGD's lr scaled by
            (1-beta')/(1-beta) so lr/(1-beta) is kept; Adam's beta1 likewise), the user's values
            restored after the step. Pipelined schemes only (PGC-FR, PGC-CR, PGC-BCGC: their
            messages average evaluations over the last c models); exact schemes have nothing to
            correct and bounded staleness (delayed, not averaged) measured worse with it.
            With momentum beta and no ``decay`` in ``scheme_options``, PGC-CR also weights
            its ring slot of age a by rho^a, rho = 1 - beta (fresh gradients first; plain SGD
            keeps the paper's rho = 1). Records carry ``implicit_momentum``,
            ``effective_momentum`` and ``ring_decay``. False applies the optimizer's own
            momentum unchanged and the paper's ring (:mod:`pgc_hvd.control.momentum`).
        control: how the ranks exchange control rows. ``"log"`` (default): see below.
            ``"allgather"``: polled rounds of a Horovod allgather (payloads may ride along,
            ``optimistic``); their number differs by rank, so a user's *unnamed* Horovod
            collective gets a different name on each rank and hangs: use it only in scripts
            whose own collectives all have names. ``"store"``: a
            ``torch.distributed.TCPStore`` served by rank 0 (:mod:`pgc_hvd.runtime.control_store`;
            a round costs 0.3-0.6 ms instead of 1.3-7.7 ms here, payloads then move in one data
            allgather per step; it listens only on the address the ranks use:
            ``PGC_HVD_STORE_ADDR``, else the interface gloo is pinned to, ``MASTER_ADDR`` or rank
            0's host name; whoever reaches that port can write rows: a trusted network, as for
            torch's own store).
            ``"log"``: no polling (:mod:`pgc_hvd.runtime.control_log`): a rank appends its row
            to an ordered log in that store when its message is ready, rank 0 decides as the
            rows arrive and publishes each step's outcome by one broadcast: 4 control
            operations per rank > 0 per step whatever the compute time (the append's ``add`` and
            ``set``, the broadcast, the delete of its row once taken; records: ``control_ops``);
            no payloads with the rows (``optimistic`` unset).
        overlap: None (default): True when the parameters live on a GPU, False on the CPU
            (there the agent thread's sums compete with the backward for the cores and the
            interpreter: no gain measured on 2 cores). True: the data collective overlaps the
            backward pass
            (:mod:`pgc_hvd.runtime.overlap`): from the second step on, a rank's message is
            declared ready when its backward begins, and once the step is decided it is summed
            bucket by bucket while the backward still computes. Dense fp32 messages and schemes
            that use each step's own messages (not bounded staleness, compression or fp16: they
            keep the one collective after ``step()``). The ``loss`` and ``metrics`` handed to
            ``step()`` then ride with the rank's next message (a decided step reports its used
            ranks' previous batches). A loop whose first ``step()`` gets a GradScaler's scale,
            or that changes ``p.grad`` after the backward (clipping), is not overlapped; one
            that starts doing so later is refused with the fix. False: the message is formed
            and sent at ``step()``.
        bucket_cap_mb: the overlap's bucket size in MiB (default 25, the first bucket 1 MiB, as
            DDP's; ``pgc_hvd.DistributedDataParallel`` takes DDP's own ``bucket_cap_mb``).
        engine: whose collectives: ``"horovod"`` (``horovod.torch``), ``"torch"``
            (torch.distributed, :mod:`pgc_hvd.torch`) or None: from the launcher's environment
            (:func:`pgc_hvd.runtime.engine.resolve`); ``hvd``, when given, is used as it is.

    Every argument is checked (type and range) before any collective; a bad one raises
    TypeError or ValueError naming it.
    """
    from pgc_hvd.runtime.communicator import name_unnamed_ops
    from pgc_hvd.runtime.engine import resolve
    if hvd is None:
        hvd = resolve(engine)
    # the user's unnamed Horovod collectives are named by their own count, never by Horovod's
    # handle counter, which pgc_hvd's agent advances at rank-dependent moments
    name_unnamed_ops(hvd)
    horovod = from_horovod(hvd, backward_passes_per_step=backward_passes_per_step, op=op,
                           gradient_predivide_factor=gradient_predivide_factor,
                           num_groups=num_groups, groups=groups, sparse_as_dense=sparse_as_dense,
                           process_set=process_set, metrics=metrics)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), facade_methods())
    config = RuntimeConfig(
        scheme=scheme, stragglers=stragglers, compression=compression,
        delay=renamed_keyword("delays", delays, delay), records=records,
        scheme_options=scheme_options, timeout=timeout, poll_interval=poll_interval, name=name,
        on_record=on_record, on_update=on_update, replay_arrivals=replay_arrivals,
        straggler_policy=straggler_policy, optimistic=optimistic, control=control,
        momentum_correction=momentum_correction, overlap=overlap, bucket_cap_mb=bucket_cap_mb,
        auto=auto, **horovod)
    return cls(optimizer, named_parameters, config, hvd)
