"""Hot-path tensor ops of pgc_hvd, backed by the compiled extension ``pgc_hvd._C``.

The kernels are torch ops, ``torch.ops.pgc_hvd.<name>`` (schemas in ``csrc/library.cpp``): the
dispatcher picks the kernel by the device of the tensors (CPU kernels with OpenMP; CUDA kernels
when the extension was built with a CUDA toolkit), and a fake kernel per op
(:mod:`pgc_hvd.ops._fake`) lets torch.compile trace them. The functions here check and convert
their arguments and call those ops; each has a pure-PyTorch reference in
:mod:`pgc_hvd.ops.reference` that the tests compare against.

* :func:`coded_accumulate`, :func:`add_slot`: coded messages from the ring buffer's slots.
* :func:`topk_compress`, :func:`error_feedback_compress`: top-kappa compression of messages;
  :func:`compression_error_norm` ||C(u) - u|| of a sent message (minimum-error decoder).
* :func:`decode_accumulate`: weighted sum of dense and sparse messages into one buffer.
"""

from pgc_hvd.ops.coded import coded_accumulate, add_slot
from pgc_hvd.ops.compress import compression_error_norm, error_feedback_compress, topk_compress
from pgc_hvd.ops.decode import decode_accumulate

__all__ = [
    "coded_accumulate",
    "add_slot",
    "topk_compress",
    "error_feedback_compress",
    "compression_error_norm",
    "decode_accumulate",
]
