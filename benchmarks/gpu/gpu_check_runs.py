"""The training half of ``benchmarks/gpu/gpu_check.sh``: pgc_hvd's runs on CUDA tensors, under torchrun
on the torch engine (no Horovod build needed on the GPU machine).

    python benchmarks/gpu/gpu_check_runs.py --device cuda --out DIR     # on the GPU machine
    python benchmarks/gpu/gpu_check_runs.py --device cpu --out DIR      # the rehearsal here

1. ``train``: ``torchrun --nproc-per-node 2 -m pgc_hvd train --device DEV`` for dgd, pgc-cr and
   bcgc, each dense and with ``--compression topk:0.01``, the six launched together
   (``PGC_HVD_TORCH_BACKEND=gloo``: the two ranks of each share the one GPU). Passes when the run
   exits 0 (``close()`` compares the parameters' digests across ranks and raises when they
   differ), trained on DEV, and its training loss fell.
2. ``bench``: ``benchmarks/runtime/torchrun_bench.py --device DEV`` alone on the machine: ResNet-18 time
   per step of DDP, dgd and pgc-cr, np 2 on the one GPU (gloo), no sleep (``--compute 0``).
3. ``nccl``: on cuda only (this torch's CPU build has no NCCL): np 1 with
   ``PGC_HVD_TORCH_BACKEND=nccl`` (the engine's collectives on NCCL), and np 2 on the one GPU
   under NCCL, which must be refused with the message naming the fix (exit != 0 within the
   timeout, the message in the output).
4. ``amp``: ``benchmarks/gpu/gpu_train_check.py --device DEV`` under torchrun np 2 (gloo): fp16
   autocast with a GradScaler, fp16 messages, a pinned CodedLoader on DEV, NVML in the records.

Writes ``OUT/gpu_runs.json`` (every run: command, exit status, seconds, figures) and
``OUT/gpu_runs.log`` (the last lines of each run's output); prints a table. Exit status 1 when
any run failed its check.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import read_result

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("dgd", "pgc-cr", "bcgc")
COMPRESSIONS = ("none", "topk:0.01")


def torchrun(nproc: int, args: list) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *args]


def environment(backend: str | None) -> dict:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PGC_HVD_TORCH_BACKEND", None)
    if backend is not None:
        env["PGC_HVD_TORCH_BACKEND"] = backend
    return env


def start(cmd: list, backend: str | None, log: Path) -> tuple:
    fh = open(log, "w")
    proc = subprocess.Popen([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT,
                            env=environment(backend), cwd=ROOT, start_new_session=True)
    return proc, fh, time.monotonic()


def finish(run: tuple, timeout: float) -> tuple[int, float]:
    proc, fh, t0 = run
    try:
        rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        import signal
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = 124
    fh.close()
    return rc, time.monotonic() - t0


def train_runs(dev: str, work: Path, steps: int, timeout: float, schemes=SCHEMES) -> list:
    runs = []
    for scheme in schemes:
        for comp in COMPRESSIONS:
            tag = f"train-{scheme}-{comp.replace(':', '')}"
            out = work / tag
            cmd = torchrun(2, ["-m", "pgc_hvd", "train", "--device", dev, "--scheme", scheme,
                               "--compression", comp, "--dataset", "digits", "--model", "cnn",
                               "--steps", str(steps), "--lr", "0.05", "--timeout", "90",
                               "--out", out, "--force"])
            runs.append((tag, cmd, out, start(cmd, "gloo", work / f"{tag}.log")))
    results = []
    for tag, cmd, out, run in runs:
        rc, secs = finish(run, timeout)
        res = {"run": tag, "cmd": " ".join(map(str, cmd[1:])), "rc": rc, "seconds": secs,
               "log": str(work / f"{tag}.log")}
        problems = [] if rc == 0 else [f"exit status {rc}"]
        try:
            summary = json.loads((out / "summary.json").read_text())
            recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()
                    if x.strip()]
            first = next((r["loss"] for r in recs if r.get("loss") is not None), None)
            res.update(device=summary["device"], ms_per_step=1e3 * summary["time_per_step_s"],
                       first_loss=first, final_train_loss=summary["final_train_loss"],
                       test_accuracy=summary["final_test_accuracy"],
                       mean_bytes=sum(r.get("bytes") or 0 for r in recs) / max(1, len(recs)))
            if summary["device"] != dev:
                problems.append(f"trained on {summary['device']}, not {dev}")
            if first is None or not summary["final_train_loss"] < first:
                problems.append(f"loss did not fall: {first} -> {summary['final_train_loss']}")
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"no summary ({type(err).__name__}: {err})")
        res["problems"] = problems
        results.append(res)
    return results


def script_run(tag: str, script: str, args: list, work: Path, timeout: float) -> dict:
    """``torchrun`` np 2 (gloo) of a benchmarks/ script that prints ``RESULT {json}``."""
    log = work / f"{tag}.log"
    cmd = torchrun(2, [ROOT / "benchmarks" / script, *args])
    rc, secs = finish(start(cmd, "gloo", log), timeout)
    figures = read_result(log.read_text(errors="replace"))
    return {"run": tag, "cmd": " ".join(map(str, cmd[1:])), "rc": rc,
            "seconds": secs, "log": str(log), "figures": figures,
            "problems": [] if rc == 0 and figures else [f"exit status {rc}, figures {figures}"]}


def nccl_runs(work: Path, timeout: float) -> list:
    out = []
    log = work / "nccl-np1.log"
    cmd = torchrun(1, ["-m", "pgc_hvd", "train", "--device", "cuda", "--scheme", "dgd",
                       "--dataset", "digits", "--model", "cnn", "--steps", "20", "--timeout", "60",
                       "--out", work / "nccl-np1", "--force"])
    rc, secs = finish(start(cmd, "nccl", log), timeout)
    out.append({"run": "nccl-np1", "cmd": "PGC_HVD_TORCH_BACKEND=nccl " + " ".join(
        map(str, cmd[1:])), "rc": rc, "seconds": secs, "log": str(log),
        "problems": [] if rc == 0 else [f"exit status {rc}"]})
    log = work / "nccl-np2-one-gpu.log"
    cmd = torchrun(2, ["-m", "pgc_hvd", "train", "--device", "cuda", "--scheme", "pgc-cr",
                       "--dataset", "digits", "--model", "cnn", "--steps", "20", "--timeout", "60",
                       "--out", work / "nccl-np2", "--force"])
    rc, secs = finish(start(cmd, "nccl", log), timeout)
    text = log.read_text(errors="replace")
    refused = "all hold cuda:0 on one host" in text and "PGC_HVD_TORCH_BACKEND=gloo" in text
    problems = []
    if rc == 0:
        problems.append("two ranks on one GPU under NCCL ran (expected the refusal)")
    elif rc == 124:
        problems.append("two ranks on one GPU under NCCL hung until the timeout")
    elif not refused:
        problems.append("failed without pgc_hvd's refusal message (see the log)")
    out.append({"run": "nccl-np2-one-gpu-refused", "cmd": "PGC_HVD_TORCH_BACKEND=nccl " +
                " ".join(map(str, cmd[1:])), "rc": rc, "seconds": secs, "log": str(log),
                "refused_with_fix": refused, "problems": problems})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--out", required=True, help="folder for gpu_runs.json and gpu_runs.log")
    p.add_argument("--work", default=None, help="run folders and logs (default: a temp dir)")
    p.add_argument("--parts", default="train,bench,nccl,amp")
    p.add_argument("--steps", type=int, default=60,
                   help="steps of each train run (top 1%% of a small CNN needs ~60 to fall surely)")
    p.add_argument("--schemes", default=",".join(SCHEMES), help="the train runs' schemes")
    args = p.parse_args(argv)
    import tempfile
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="pgc_gpu_runs_"))
    work.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    results = []
    t0 = time.monotonic()
    if "train" in parts:
        schemes = args.schemes.split(",")
        print(f"== train: {len(schemes) * len(COMPRESSIONS)} runs of torchrun np 2 on "
              f"{args.device} (gloo), launched together", flush=True)
        results += train_runs(args.device, work, args.steps, timeout=150, schemes=schemes)
    if "bench" in parts:
        print(f"== bench: torchrun_bench.py --device {args.device} (ResNet-18, np 2)", flush=True)
        results.append(script_run("bench-resnet18", "runtime/torchrun_bench.py", [
            "--device", args.device, "--compute", "0", "--steps", "12", "--warmup", "3",
            "--runs", "a:ddp,a:dgd,a:pgc-cr"], work, timeout=150))
    if "nccl" in parts:
        if args.device == "cuda":
            print("== nccl: np 1 on NCCL; np 2 on one GPU under NCCL (must be refused)",
                  flush=True)
            results += nccl_runs(work, timeout=90)
        else:
            print("== nccl: skipped (cpu: this torch has no NCCL to run)", flush=True)
    if "amp" in parts:
        print(f"== amp: gpu_train_check.py --device {args.device} (torchrun np 2, gloo)",
              flush=True)
        results.append(script_run("amp-fp16-pinned-nvml", "gpu/gpu_train_check.py", [
            "--device", args.device, "--steps", "40"], work, timeout=120))

    print(f"\n{'run':<26} {'rc':>4} {'s':>6}  figures")
    for r in results:
        if "ms_per_step" in r:
            fig = (f"{r['ms_per_step']:.1f} ms/step, loss {r['first_loss']:.3f} -> "
                   f"{r['final_train_loss']:.3f}, test acc {r['test_accuracy']:.3f}, "
                   f"{r['mean_bytes'] / 1e3:.1f} kB/step")
        elif r.get("figures") and "a:ddp" in r["figures"]:
            f = r["figures"]
            fig = ", ".join(f"{k[2:]} {f[k] * 1e3:.1f} ms/step ({f[k] / f['a:ddp']:.2f}x DDP)"
                            for k in ("a:ddp", "a:dgd", "a:pgc-cr") if k in f)
        elif r.get("figures"):
            f = r["figures"]
            gpu = f.get("gpu_record") or {}
            wire = f["bytes_per_step"] / f["fp32_ring_bytes"]
            fig = (f"{f['amp']} autocast, loss {f['first_loss']:.3f} -> {f['last_loss']:.3f}, "
                   f"scale {f['loss_scale']:g}, wire {wire:.2f}x the fp32 ring, "
                   f"{f['seconds_per_step'] * 1e3:.1f} ms/step, NVML "
                   f"{gpu.get('util', gpu.get('reason'))}")
        else:
            fig = ""
        print(f"{r['run']:<26} {r['rc']:>4} {r['seconds']:6.1f}  {fig}")
        for problem in r["problems"]:
            print(f"{'':<26} FAIL {problem}")
    failed = [r["run"] for r in results if r["problems"]]
    print(f"\n{len(results) - len(failed)} of {len(results)} runs passed "
          f"({time.monotonic() - t0:.0f} s){'; failed: ' + ', '.join(failed) if failed else ''}")
    with open(out / "gpu_runs.log", "w") as fh:
        for r in results:
            lines = Path(r["log"]).read_text(errors="replace").splitlines()
            fh.write(f"===== {r['run']} (rc {r['rc']}): {r['cmd']}\n")
            fh.write("\n".join(lines[-60:]) + "\n")
    (out / "gpu_runs.json").write_text(json.dumps(
        {"device": args.device, "results": results}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
