"""Runs on every rank (under horovodrun or torchrun): several runs of check scripts, one after
the other, in ONE launch (the ``launch_group`` fixture of tests/conftest.py).

    python run_modes.py OUTDIR SPEC_JSON ENTRY_TIMEOUT

``SPEC_JSON`` is a list of ``[key, script, args]``. Each entry runs as ``python script *args``
would (``runpy`` with ``__name__ == "__main__"``, ``sys.argv`` set, the script's folder first on
``sys.path``; a script ``-m MODULE`` as ``python -m MODULE *args``), in a fresh working folder
``OUTDIR/<i>``, with what it prints on ``sys.stdout`` / ``sys.stderr`` also written to
``OUTDIR/<i>.rank<r>.out`` / ``.err``. When the script returns, what its process would not have
passed on is put back (the environment variables, torch's default dtype and thread count), the
optimizers it left unclosed are closed as at the end of its process
(``pgc_hvd.runtime.lifecycle.close_all``: closed, or aborted when they failed) and its garbage
is collected; then ``OUTDIR/<i>.rank<r>.done`` gets ``0``, or ``1`` when that closing raised
(printed on its stderr, as the exit hook prints it). An exception that escapes a script ends the
launch as it would have ended the script's own (later entries do not run; their ``.done`` files
are missing); so does an entry still running after ENTRY_TIMEOUT seconds (``faulthandler``:
every thread's traceback on stderr, exit status 1), and an entry other than the last that leaves
Horovod shut down: the next entry's ``hvd.init()`` would rendezvous and connect gloo afresh while
a loaded rank may still be in the entry before, which ends in gloo's ``Connect timeout`` (seen
under load); such a script is marked ``"last"`` in its module's ``LAUNCH_GROUPS`` instead.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import runpy
import sys
import time
import traceback

import torch


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()

    def __getattr__(self, name):
        return getattr(self.streams[0], name)


def _horovod_still_up(key: str) -> None:
    """Ends the launch when entry ``key`` shut Horovod down and another entry follows."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and "HOROVOD_RANK" in os.environ and not hvd.is_initialized():
        raise SystemExit(f"run_modes: entry {key} left Horovod shut down (hvd.shutdown()) and "
                         "more entries follow: a re-init mid-launch re-connects gloo and times "
                         "out when a rank lags; drop the shutdown or mark the entry \"last\" in "
                         "its module's LAUNCH_GROUPS")


def _escaping(entry_err, real_out, real_err) -> None:
    """An exception is leaving the entry: its traceback goes into the entry's ``.err`` file
    (the report's "stderr" section) and the real streams come back, so that the exit hook prints
    it on the launch's stderr too. Left as ``_Tee``s over the entry's files, which the ``with``
    closes, the hook would fail on the closed file and the rank would end with status 120 and
    no traceback anywhere (seen in CI)."""
    entry_err.write(traceback.format_exc())
    entry_err.flush()
    sys.stdout, sys.stderr = real_out, real_err


def main() -> None:
    out, spec, limit = os.path.abspath(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))
    real_out, real_err, base_path = sys.stdout, sys.stderr, list(sys.path)
    for i, (key, script, args) in enumerate(spec):
        work = os.path.join(out, str(i))
        os.makedirs(work, exist_ok=True)
        os.chdir(work)
        with open(os.path.join(out, f"{i}.rank{rank}.out"), "w") as fo, \
                open(os.path.join(out, f"{i}.rank{rank}.err"), "w") as fe:
            sys.stdout, sys.stderr = _Tee(real_out, fo), _Tee(real_err, fe)
            env = dict(os.environ)
            dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
            module = script[3:] if script.startswith("-m ") else None
            sys.argv = [module or script, *map(str, args)]
            sys.path[:] = [work if module else os.path.dirname(os.path.abspath(script))] + base_path
            print(f"RUN-MODES {key} rank={rank}", file=real_out, flush=True)
            t0 = time.monotonic()
            faulthandler.dump_traceback_later(limit, exit=True, file=real_err)
            try:
                if module:
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(script, run_name="__main__")
            except BaseException as end:   # sys.exit(0) / sys.exit() is the script's clean end
                if not (isinstance(end, SystemExit) and end.code in (None, 0)):
                    _escaping(fe, real_out, real_err)
                    raise
            from pgc_hvd.runtime import lifecycle   # the script's end: its process would exit
            errors = lifecycle.close_all()
            gc.collect()   # and its objects would go (a DataLoader's workers, ...)
            faulthandler.cancel_dump_traceback_later()
            for err in errors:
                sys.stderr.write("pgc_hvd: closing the optimizer at exit (no close() was called) "
                                 "failed:\n" + "".join(traceback.format_exception(err)))
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = real_out, real_err
            os.environ.clear()
            os.environ.update(env)
            torch.set_default_dtype(dtype)
            torch.set_num_threads(threads)
        if i < len(spec) - 1:
            _horovod_still_up(key)
        with open(os.path.join(out, f"{i}.rank{rank}.done"), "w") as fd:
            fd.write("1" if errors else "0")
        print(f"RUN-MODES {key} rank={rank} ended in {time.monotonic() - t0:.1f}s",
              file=real_out, flush=True)


if __name__ == "__main__":
    main()
