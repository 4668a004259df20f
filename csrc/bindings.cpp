// pybind11 module pgc_hvd._C: the compiled hot path of pgc_hvd. Python callers use
// pgc_hvd.ops, which documents every op and holds its pure-PyTorch reference.
#include <torch/extension.h>

#include "coded_accumulate.h"

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
}
