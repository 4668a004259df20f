// pybind11 module pgc_hvd._C: the compiled hot path of pgc_hvd. Python callers use
// pgc_hvd.ops, which documents every op and holds its pure-PyTorch reference.
#include <torch/extension.h>

#include "coded_accumulate.h"
#include "decode.h"
#include "error_feedback.h"
#include "topk.h"

namespace {

bool cuda_compiled() {
#ifdef PGC_HVD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pgc_hvd compiled kernels (CPU with OpenMP; CUDA when built with a toolkit)";
  m.def("cuda_compiled", &cuda_compiled, "True when the CUDA kernels were compiled in");
  m.def("coded_accumulate", &pgc::coded_accumulate, pybind11::arg("out"), pybind11::arg("slots"),
        pybind11::arg("coeffs"), pybind11::arg("accumulate") = false,
        "out (=|+=) sum_l coeffs[l] * slots[l], in place, fp32 accumulation");
  m.def("topk_compress", &pgc::topk_compress, pybind11::arg("x"), pybind11::arg("k"),
        pybind11::arg("method") = "exact", pybind11::arg("index64") = true,
        "(values, indices) of the k largest |x_i|, indices ascending (see pgc_hvd.ops)");
  m.def("error_feedback_compress", &pgc::error_feedback_compress, pybind11::arg("x"),
        pybind11::arg("residual"), pybind11::arg("k"), pybind11::arg("method") = "exact",
        pybind11::arg("index64") = true,
        "top-k of x + residual; residual <- (x + residual) minus what is sent");
  m.def("decode_accumulate", &pgc::decode_accumulate, pybind11::arg("out"),
        pybind11::arg("dense"), pybind11::arg("dense_weights"), pybind11::arg("sparse_values"),
        pybind11::arg("sparse_indices"), pybind11::arg("sparse_weights"),
        pybind11::arg("accumulate") = true, pybind11::arg("check_finite") = true,
        "out (+)= sum of weighted dense and sparse (scatter-add) messages, in place");
}
