"""fp16 messages: time per step and bytes per rank, fp32 against fp16 wire, in one run.

    python benchmarks/data_plane/fp16_bytes.py [--d 11689512] [--np 2,4] [--steps 15] [--warmup 3]
                                    [--compute 0.0] [--json runs/fp16_bytes.json]

Launches ``horovodrun --gloo`` once per np. On every rank a fixed gradient-like message of d
entries (ResNet-18's d = 11,689,512 by default; normal, std 1e-3) is encoded each step and
submitted to a :class:`~pgc_hvd.runtime.agent.CommAgent` driven directly (no model, no
optimizer: only the wire differs between the runs), after ``--compute`` seconds of emulated
compute (a sleep). Runs, each ``--steps`` steps:

* ``hvd`` / ``hvd-fp16``: Horovod's own ``hvd.allreduce`` of the d-vector with
  ``compression=hvd.Compression.none`` / ``.fp16`` (cast, allreduce in fp16, cast back);
* ``dgd`` / ``dgd-fp16``: pgc_hvd's ``dgd`` (every rank's message, ONE allreduce of the
  contributions) with :class:`~pgc_hvd.compress.DenseCodec` / :class:`~pgc_hvd.compress.Fp16Codec`
  (on CPU the fp16 sum is an alltoall of fp16 chunks summed in fp32 + an allgather);
  ``dgd-fp16ring``: the same with ``narrow_reduce="allreduce"``, Horovod's fp16 ring allreduce
  (the GPU default);
* ``gc-cr`` / ``gc-cr-fp16``: gradient coding (s = 1; the step fires on n - 1 messages).

Time per step = (time of the last decision - time of the last warm-up one) / measured steps,
on rank 0. Bytes = rank 0's ``Update.info["bytes"]`` per step (the allreduce's 2 (n-1)/n * 4d
or * 2d, plus the control rows), beside the ring allreduce's 2 (n-1)/n * 4d.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result, run_ranks

RUNS = ("hvd", "hvd-fp16", "dgd", "dgd-fp16", "dgd-fp16ring", "gc-cr", "gc-cr-fp16")


def base_of(name: str) -> tuple:
    """(run, fp16?, narrow_reduce) of a run's label."""
    head, _, tail = name.partition("-fp16")
    if name.endswith("-fp16") or tail:
        return head, True, "allreduce" if tail == "ring" else "auto"
    return name, False, "auto"



def worker(args) -> None:
    import horovod.torch as hvd
    import torch

    from pgc_hvd.compress import DenseCodec, make_codec
    from pgc_hvd.runtime.agent import CommAgent, Outgoing
    from pgc_hvd.runtime.config import horovod_wire_dtype
    from pgc_hvd.schemes import default_stragglers, get_scheme

    torch.set_num_threads(1)
    hvd.init()
    rank, n, d = hvd.rank(), hvd.size(), args.d
    steps, warm = args.steps, args.warmup
    g = torch.Generator().manual_seed(rank)
    grad = torch.randn(d, generator=g) * 1e-3

    def run_hvd(compression):
        buf = torch.empty(d)
        times = []
        for t in range(steps):
            time.sleep(args.compute)
            buf.copy_(grad)
            hvd.allreduce(buf, name="bench.hvd", op=hvd.Sum, compression=compression)
            times.append(time.time())
        return times, []

    def run_pgc(scheme, fp16, reduce):
        wire = horovod_wire_dtype(hvd.Compression.fp16 if fp16 else hvd.Compression.none)
        codec = (make_codec(d, None, complex_messages=False, wire_dtype=wire) if fp16
                 else DenseCodec(d))
        sch = get_scheme(scheme, n, default_stragglers(scheme, n))
        agent = CommAgent(hvd, sch, rank, d, 1, codec=codec, device="cpu", timeout=300,
                          name=f"bench-{scheme}-{int(fp16)}-{reduce}", optimistic=False,
                          narrow_reduce=reduce)
        agent.start()
        times, nbytes, t = [], [], 0
        try:
            while t < steps:
                time.sleep(args.compute)
                packed, payload = agent.payload_buffer()
                codec.encode(grad, payload)
                agent.submit(Outgoing(t, t, payload, time.time(), packed=packed), 0.0)
                agent.wait_for(t)
                while t < min(agent.decided(), steps):
                    upd = agent.take(t)
                    times.append(upd.time)
                    nbytes.append(upd.info["bytes"])
                    t += 1
                agent.release_before(t)
        finally:
            agent.finish()
        return times, nbytes[warm:]

    out = {"n": n, "d": d, "compute": args.compute, "steps": steps, "warmup": warm}
    for name in RUNS:
        hvd.allreduce(torch.zeros(1), name=f"barrier.{name}")
        base, fp16, reduce = base_of(name)
        if base == "hvd":
            times, nbytes = run_hvd(hvd.Compression.fp16 if fp16 else hvd.Compression.none)
        else:
            times, nbytes = run_pgc(base, fp16, reduce)
        if rank == 0:
            out[name] = (times[-1] - times[warm - 1]) / (steps - warm)
            if nbytes:
                out[f"{name}.bytes"] = sum(nbytes) / len(nbytes)
            print(f"[fp16 np={n}] {name}: {out[name] * 1e3:.1f} ms/step"
                  + (f", {out[f'{name}.bytes'] / 1e6:.2f} MB/step" if nbytes else ""),
                  file=sys.stderr, flush=True)
    if rank == 0:
        print_result(out)


def report(results: list, load: str) -> None:
    print(f"\nfp16 messages, d = {results[0]['d']:,}, compute {results[0]['compute']} s/step, "
          f"load before: {load}")
    print(f"{'np':>3} {'run':>13} {'ms/step':>9} {'vs fp32':>8} {'MB/step':>9} {'vs ring':>8}")
    for r in results:
        n, d = r["n"], r["d"]
        ring = 2.0 * (n - 1) / n * 4.0 * d
        for name in RUNS:
            ratio = r[name] / r[base_of(name)[0]]
            b = r.get(f"{name}.bytes")
            bytes_txt = f"{b / 1e6:9.2f} {b / ring:8.3f}" if b is not None else f"{'':>9} {'':>8}"
            print(f"{n:>3} {name:>13} {r[name] * 1e3:9.1f} {ratio:8.2f} {bytes_txt}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=11_689_512, help="message entries (ResNet-18)")
    p.add_argument("--np", default="2,4")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compute", type=float, default=0.0, help="emulated seconds per step")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    import os
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = []
    for np_ in [int(x) for x in args.np.split(",")]:
        print(f"== np={np_}", flush=True)
        results.append(run_ranks(np_, __file__, ["--d", args.d, "--steps", args.steps,
                                                 "--warmup", args.warmup,
                                                 "--compute", args.compute],
                                 args.timeout, on_line=lambda line: print(
                                     "  " + line.split("<stderr>:")[-1], flush=True)
                                 if "[fp16 " in line else None))
    report(results, load)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"load": load, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
