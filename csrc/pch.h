// The headers every C++ translation unit of pgc_hvd._C includes, precompiled once per build
// (CMakeLists.txt, target_precompile_headers): ATen alone is ~15 s of parsing per file on the
// 2-core build machine, and the extension has 16 C++ files. Nothing here is pgc_hvd's own.
#pragma once
#include <ATen/ATen.h>
#include <torch/library.h>
