"""The torch engine's backend: which one ``init`` takes (``PGC_HVD_TORCH_BACKEND``, its check) and
the refusal of two ranks on one GPU under NCCL (the rows' logic here; the collective itself runs
on a GPU machine: ``benchmarks/gpu/gpu_check.sh``)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from pgc_hvd.torchdist import ops, world

ROOT = Path(__file__).resolve().parents[2]


def test_backend_names_resolve_and_nccl_keeps_the_rows_on_gloo():
    assert world.resolve_backend("gloo") == "gloo"
    assert world.resolve_backend(" GLOO ") == "gloo"
    assert world.resolve_backend("cpu:gloo,cuda:gloo") == "cpu:gloo,cuda:gloo"
    if dist.is_nccl_available():
        assert world.resolve_backend("nccl") == "cpu:gloo,cuda:nccl"
        assert world.resolve_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    else:
        with pytest.raises(ValueError, match="without NCCL; use gloo"):
            world.resolve_backend("nccl")


def test_a_misspelt_backend_is_refused_naming_the_setting(monkeypatch):
    with pytest.raises(ValueError, match=r"init\(backend\)='mpi': use gloo, or nccl"):
        world.resolve_backend("mpi", "init(backend)")
    monkeypatch.setenv(world.BACKEND_ENV, "glo")
    with pytest.raises(ValueError, match="PGC_HVD_TORCH_BACKEND='glo'"):
        world.default_backend()


def test_the_environment_variable_chooses_the_default(monkeypatch):
    monkeypatch.setenv(world.BACKEND_ENV, "gloo")
    assert world.default_backend() == "gloo"
    monkeypatch.delenv(world.BACKEND_ENV)
    import torch
    want = ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() and dist.is_nccl_available()
            else "gloo")
    assert world.default_backend() == want


@pytest.mark.parametrize("backend, nccl", [
    ("gloo", False), ("cpu:gloo,cuda:gloo", False), ("nccl", True), ("NCCL", True),
    ("cpu:gloo,cuda:nccl", True), ("cpu:gloo, cuda:nccl", True), ("cuda:nccl", True)])
def test_which_backends_put_cuda_tensors_on_nccl(backend, nccl):
    assert world.uses_nccl_for_cuda(backend) is nccl


def test_ranks_sharing_a_gpu_on_a_host_are_found():
    # rows: (host id, cuda index) per rank
    assert ops.shared_gpus([(1, 0), (1, 1), (2, 0), (2, 1)]) == []    # one GPU per rank
    assert ops.shared_gpus([(1, 0), (1, 0)]) == [[0, 1]]              # torchrun np 2, 1 GPU
    assert ops.shared_gpus([(1, 0), (2, 0), (1, 1), (1, 0), (2, 0)]) == [[0, 3], [1, 4]]


def test_the_refusal_names_the_ranks_the_gpu_and_both_fixes():
    rows = [(7, 0), (7, 0), (7, 1)]
    msg = ops.shared_gpu_message(ops.shared_gpus(rows), rows)
    assert "ranks 0, 1 all hold cuda:0 on one host" in msg
    assert "torch.cuda.set_device(hvd.local_rank())" in msg
    assert "PGC_HVD_TORCH_BACKEND=gloo" in msg and "init(backend='gloo')" in msg


@pytest.mark.slow
def test_init_takes_the_backend_from_the_environment_in_a_world_of_one(tmp_path):
    # a fresh interpreter (the engine's world is per process): the variable reaches init, and a
    # bad value stops init with the setting named instead of torch's own error
    code = textwrap.dedent("""
        import os, sys
        import pgc_hvd.torch as hvd
        from pgc_hvd.torchdist import ops, world
        try:
            hvd.init()
        except ValueError as err:
            print("REFUSED", err)
            sys.exit(0)
        print("BACKEND", world.W.backend, hvd.size())
        hvd.shutdown()
    """)
    for value, want in (("gloo", "BACKEND gloo 1"), ("nccl-ish", "REFUSED PGC_HVD_TORCH_BACKEND")):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               world.BACKEND_ENV: value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert want in out.stdout, out.stdout + out.stderr


def _check_gpu_rank(rank, path, host_and_index, results):
    # one rank of a real 2-process gloo group: GroupOps.check_gpu's allgather and verdict (a
    # cuda device descriptor needs no GPU; the index is given, so torch.cuda is never asked)
    import torch
    import torch.distributed as dist
    from pgc_hvd.torchdist.ops import GroupOps

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    try:
        host, index = host_and_index[rank]
        g = GroupOps(dist.group.WORLD, "train", rank, 2, gpu_host=host)
        try:
            g.check_gpu(torch.device("cuda", index))
            verdict = "ok"
        except ValueError as err:
            verdict = str(err)
        g.check_gpu(torch.device("cuda", index))      # checked once: no second collective
        results[rank] = (verdict, g.calls)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("layout, refused", [
    ([(7, 0), (7, 0)], True),      # torchrun np 2 on a one-GPU host, NCCL
    ([(7, 0), (7, 1)], False),     # one GPU per rank
    ([(7, 0), (8, 0)], False)])    # two hosts, GPU 0 each
def test_check_gpu_over_a_real_group_refuses_shared_gpus_on_every_rank(tmp_path, layout, refused):
    import torch.multiprocessing as mp
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_check_gpu_rank, args=(str(tmp_path / "rdv"), layout, results), nprocs=2)
        got = dict(results)
    for rank in (0, 1):
        verdict, calls = got[rank]
        assert calls == 0          # the check is not one of the group's counted collectives
        if refused:
            assert "ranks 0, 1 all hold cuda:0 on one host" in verdict, verdict
        else:
            assert verdict == "ok"


@pytest.mark.gpu
def test_a_scripts_own_nccl_default_group_gives_the_engine_gloo_for_its_rows(tmp_path):
    # dist.init_process_group("nccl") first (the usual torchrun script), then the engine: its
    # groups must still carry CPU rows, so they are built cpu:gloo,cuda:nccl
    code = textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        import pgc_hvd.torch as hvd
        from pgc_hvd.torchdist import world
        hvd.init()
        print("BACKEND", world.W.backend)
        print("GATHERED", hvd.allgather(torch.ones(1, 2)).shape[0])
        hvd.shutdown()
        dist.destroy_process_group()
    """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    import os
    env.update({k: v for k, v in os.environ.items() if k.startswith(("CUDA", "LD_", "NCCL"))})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "BACKEND cpu:gloo,cuda:nccl" in out.stdout and "GATHERED 1" in out.stdout, out.stdout
