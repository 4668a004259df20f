// The Python module pgc_hvd._C. Importing it loads this library, whose static registrations
// (library.cpp, cuda/library_cuda.cpp) define the torch ops torch.ops.pgc_hvd.*; the module
// itself only answers whether the CUDA kernels were compiled in. Python callers use
// pgc_hvd.ops, which documents every op and holds its pure-PyTorch reference.
#include <pybind11/pybind11.h>

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
  m.doc() = "pgc_hvd compiled kernels, registered as the torch ops torch.ops.pgc_hvd.* (CPU "
            "with OpenMP; CUDA when built with a toolkit); see pgc_hvd.ops";
  m.def("cuda_compiled", &cuda_compiled, "True when the CUDA kernels were compiled in");
}
