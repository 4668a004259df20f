"""Loads the compiled extension once, with an error that says how to build it."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def ext():
    """Return the ``pgc_hvd._C`` module (importing torch first, whose libraries it links)."""
    import torch  # noqa: F401  (loads libtorch*, which _C links against)

    try:
        from pgc_hvd import _C
    except ImportError as err:  # pragma: no cover - only on a broken install
        raise ImportError(
            "pgc_hvd._C (the compiled kernels) is not built or does not load: "
            f"{err}. Run `bash launch/setup.sh` from the repository root to build it."
        ) from err
    return _C


def cuda_compiled() -> bool:
    """True when the extension was built with its CUDA kernels."""
    return bool(ext().cuda_compiled())
