// The GPU libraries are opened when first called, not linked: a process that computes on the CPU
// maps none of them (a CUDA build's CPU process keeps ~150 MB of resident memory that way), and
// each opens, without a GPU, when weft first calls one of its functions.
#include "tests/TestUtil.h"

#include "ops/Ops.h"

#include <fstream>
#include <string>

#ifdef WEFT_HAVE_CUDA
#include <cublas_v2.h>
#endif
#ifdef WEFT_HAVE_CUDNN
#include <cudnn.h>
#endif
#ifdef WEFT_HAVE_NCCL
#include <nccl.h>
#endif

using namespace weft;

namespace {

/// Whether a library whose file name starts with `stem` is mapped into this process.
bool mapped(const std::string& stem) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/" + stem) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

// First in the file: the cases below open the libraries.
TEST_CASE("a process that trains on the CPU maps none of the GPU libraries") {
  Graph g;
  Output x = g.placeholder("x", f32, {4, 8});
  Output w = g.variable("w", f32, {8, 3}, Initializer::constant(0.5));
  Output loss = mean(square(matmul(x, w)));
  Session s(g, {2});
  CHECK(s.run({loss}, {{x, Tensor::full(f32, {4, 8}, 1.0)}})[0].item() == doctest::Approx(16.0));
  for (const char* library : {"libcudart.so", "libcublas", "libcublasLt", "libcudnn", "libnccl"}) {
    CAPTURE(library);
    CHECK_FALSE(mapped(library));
  }
}

#ifdef WEFT_HAVE_CUDA
TEST_CASE("cuBLAS opens when weft first calls it, without a GPU") {
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED)) == "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(mapped("libcublas"));
}
#endif

#ifdef WEFT_HAVE_CUDNN
TEST_CASE("cuDNN opens when weft first calls it, without a GPU") {
  CHECK(std::string(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)) == "CUDNN_STATUS_BAD_PARAM");
  CHECK(mapped("libcudnn"));
}
#endif

#ifdef WEFT_HAVE_NCCL
TEST_CASE("NCCL opens when weft first calls it, without a GPU") {
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)).find("invalid argument") != std::string::npos);
  CHECK(mapped("libnccl"));
}
#endif
