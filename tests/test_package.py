"""The installed package: import cost, the compiled extension and its build configuration."""

import subprocess
import sys

import pytest


def test_import_is_light():
    # Importing pgc_hvd must not pull torch or horovod (CLI start-up, codes-only users).
    code = "import sys, pgc_hvd; print('torch' in sys.modules, 'horovod' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_extension_loads_and_reports_cuda_build():
    from pgc_hvd.ops._ext import cuda_compiled, ext

    mod = ext()
    assert mod.__name__ == "pgc_hvd._C"
    assert isinstance(cuda_compiled(), bool)


def test_extension_was_built_with_cuda_when_toolkit_present():
    """CI has the CUDA toolkit: the build must then include the CUDA kernels."""
    import shutil
    from pathlib import Path

    from pgc_hvd.ops._ext import cuda_compiled

    if not (Path("/usr/local/cuda/bin/nvcc").exists() or shutil.which("nvcc")):
        pytest.skip("no CUDA toolkit on this machine")
    assert cuda_compiled(), "a CUDA toolkit is present but pgc_hvd._C was built without CUDA"

