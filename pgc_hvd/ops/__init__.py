"""Hot-path tensor ops of pgc_hvd, backed by the compiled extension ``pgc_hvd._C``.

Each op dispatches on the device of its tensors (CPU kernels with OpenMP; CUDA kernels when the
extension was built with a CUDA toolkit) and has a pure-PyTorch reference in
:mod:`pgc_hvd.ops.reference` that the tests compare against.
"""

from pgc_hvd.ops.coded import coded_accumulate, add_slot

__all__ = ["coded_accumulate", "add_slot"]
