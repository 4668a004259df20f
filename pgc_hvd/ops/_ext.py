"""Loads the compiled extension once, with an error that says how to build it, and hands out its
torch ops (``torch.ops.pgc_hvd``) with their fake kernels registered."""

from __future__ import annotations

import functools

import torch

#: ``torch.ops.pgc_hvd`` once :func:`library` has loaded it (None before): the ops' modules read
#: it per call (``LIBRARY or library()``), so a kernel call enters no module but its own
LIBRARY = None


@functools.lru_cache(maxsize=None)
def ext():
    """Return the ``pgc_hvd._C`` module (importing torch first, whose libraries it links).

    Importing it registers the torch library ``pgc_hvd`` (``csrc/library.cpp``): the schemas of
    the four ops and their CPU and CUDA kernels."""
    try:
        from pgc_hvd import _C
    except ImportError as err:  # pragma: no cover - only on a broken install
        raise ImportError(
            "pgc_hvd._C (the compiled kernels) is not built or does not load: "
            f"{err}. Run `bash launch/setup.sh` from the repository root to build it."
        ) from err
    return _C


def library():
    """``torch.ops.pgc_hvd``: the ops of the compiled extension, loaded on the first call with
    their fake kernels (:mod:`pgc_hvd.ops._fake`), so that torch.compile traces them."""
    global LIBRARY
    if LIBRARY is None:
        ext()
        from pgc_hvd.ops import _fake  # noqa: F401  (registers the fake kernels)

        LIBRARY = torch.ops.pgc_hvd
    return LIBRARY


def cuda_compiled() -> bool:
    """True when the extension was built with its CUDA kernels."""
    return bool(ext().cuda_compiled())
