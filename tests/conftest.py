"""Shared pytest configuration for pgc_hvd.

Markers (declared in pyproject.toml):
  * ``gpu``: needs a CUDA device; skipped cleanly when torch sees none.
  * ``multirank``: runs a script under ``horovodrun --gloo -np N -H localhost:N
    --network-interface lo`` through the :func:`horovodrun` fixture (skipped when horovod is not
    installed), or under ``torchrun --standalone --nproc-per-node N`` with
    ``GLOO_SOCKET_IFNAME=lo`` through the :func:`torchrun` fixture (the torch engine; horovod
    hidden from the ranks by default). Both pin gloo to the loopback interface: ranks on one
    machine never talk over its network address (tests/multirank/test_loopback.py checks).
  * ``bench``: pytest-benchmark suites, kept in ``benchmarks/`` (not collected by default).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    has_gpu = _cuda_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (none visible to torch)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)


def _horovodrun_path() -> str | None:
    candidate = Path(sys.executable).with_name("horovodrun")
    if candidate.exists():
        return str(candidate)
    return shutil.which("horovodrun")


def _launch(cmd: list, cwd, paths: list, timeout: float, env: dict | None, check: bool,
            drop_prefix: str | None = None):
    """Run a launcher command (the ``horovodrun`` and ``torchrun`` fixtures): ``paths`` first on
    PYTHONPATH, one OpenMP thread per rank unless set, the environment variables starting with
    ``drop_prefix`` removed, then ``env``; fails the test with both streams on a non-zero exit
    when ``check``."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if drop_prefix:
        for k in [k for k in full_env if k.startswith(drop_prefix)]:
            del full_env[k]
    full_env["PYTHONPATH"] = os.pathsep.join(
        list(paths) + [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if env:
        full_env.update(env)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=str(cwd))
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                    f"\n--- stderr\n{proc.stderr}")
    return proc


@pytest.fixture
def horovodrun(tmp_path):
    """Run ``python SCRIPT ARGS`` on N local gloo ranks (gloo pinned to ``lo``); returns the
    CompletedProcess.

    Usage: ``horovodrun(np, script, *args, timeout=120)``. The script's ranks should exit
    non-zero on failure; the fixture fails the test with both streams when they do.
    """
    exe = _horovodrun_path()
    if exe is None:
        pytest.skip("horovod is not installed (run bash launch/setup.sh)")

    def run(np: int, script: str | os.PathLike, *args: str, timeout: float = 180.0,
            env: dict | None = None, check: bool = True):
        cmd = [exe, "--gloo", "-np", str(np), "-H", f"localhost:{np}",
               "--network-interface", "lo", sys.executable, str(script), *map(str, args)]
        return _launch(cmd, tmp_path, [str(REPO_ROOT)], timeout, env, check)

    return run


HIDDEN_HOROVOD = "raise ImportError('horovod is hidden from this run (tests/conftest.py torchrun)')\n"


@pytest.fixture
def torchrun(tmp_path):
    """Run ``python SCRIPT ARGS`` on N local ranks under ``torchrun --standalone`` (gloo, the
    torch engine, pinned to ``lo`` by ``GLOO_SOCKET_IFNAME`` unless ``env`` sets it); returns
    the CompletedProcess.

    Usage: ``torchrun(np, script, *args, timeout=120, hide_horovod=True)``. With
    ``hide_horovod`` a ``horovod`` package that raises ImportError comes first on the ranks'
    PYTHONPATH, so the run proves it needs no Horovod. Fails the test with both streams when a
    rank exits non-zero (``check``)."""
    try:
        import torch.distributed as dist
    except ImportError:
        pytest.skip("torch.distributed is not available")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed has no gloo backend")

    def run(np: int, script: str | os.PathLike, *args: str, timeout: float = 180.0,
            env: dict | None = None, check: bool = True, hide_horovod: bool = True):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(np), "--monitor-interval", "0.5", "--tee", "3", str(script),
               *map(str, args)]
        paths = [str(REPO_ROOT)]
        if hide_horovod:
            hide = tmp_path / "hidden-horovod"
            (hide / "horovod").mkdir(parents=True, exist_ok=True)
            (hide / "horovod" / "__init__.py").write_text(HIDDEN_HOROVOD)
            paths.insert(0, str(hide))
        return _launch(cmd, tmp_path, paths, timeout, {"GLOO_SOCKET_IFNAME": "lo", **(env or {})},
                       check, drop_prefix="HOROVOD_")

    return run


@pytest.fixture
def usage_error(capsys):
    """``usage_error(main, argv)``: runs a command-line ``main`` that must stop with an argparse
    usage error (exit status 2) and returns what it printed on stderr."""
    def run(main, argv):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2, f"exit status {err.value.code}, not a usage error"
        return capsys.readouterr().err
    return run


@pytest.fixture
def unusable_runs(tmp_path):
    """``[(argv after --out, message), ...]``: run folders (and a replay: trace) that pgc-hvd
    train and simulate must refuse before the run, with the message each gets."""
    a_file = tmp_path / "file"
    a_file.write_text("not a folder")
    (tmp_path / "r" / "records.jsonl").mkdir(parents=True)
    (tmp_path / "s" / "summary.json").mkdir(parents=True)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "records.jsonl").write_text('{"step": 0, "time": 0.1}\n')
    trace = tmp_path / "trace.json"
    trace.write_text('{"format": "pgc_hvd.delay_trace/1", "delays": [[0, 0, -1.0]]}')
    return [([str(a_file)], "is a file; --out names the run's folder"),
            ([str(tmp_path / "r")], "records.jsonl is a folder"),
            ([str(tmp_path / "s")], "summary.json is a folder"),
            ([str(tmp_path / "done")], "already holds an earlier run"),
            ([str(tmp_path / "new"), "--delay", f"replay:{trace}"],
             "trace.json, entry 0 ([0, 0, -1.0]): the delay must be finite seconds >= 0")]
