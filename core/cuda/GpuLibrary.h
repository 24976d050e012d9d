// GPU libraries opened when first called, not linked: a process of a CUDA build that computes on
// the CPU never maps cuBLAS, cuDNN or NCCL (their loading and relocation cost a process about
// 150 MB of resident memory). Each library's functions that weft calls are defined under their
// own names by WEFT_GPU_FORWARD, whose first call opens the library and looks the function up;
// the definitions must match the library's header, which the compiler checks.
#pragma once

#include <mutex>
#include <string>

namespace weft::cuda {

class GpuLibrary {
 public:
  /// `path` is where the build found the library; its file name (the soname) is tried first,
  /// through the loader's search path, then `path` itself.
  GpuLibrary(std::string name, std::string path) : name_(std::move(name)), path_(std::move(path)) {}

  /// The address of `function`, opening the library on first use. Throws weft::Error naming the
  /// library, the files tried and the loader's reason, or the missing function.
  void* function(const char* function);

 private:
  void open();

  std::string name_, path_;
  std::once_flag opened_;
  void* handle_ = nullptr;
  std::string failure_;
};

}  // namespace weft::cuda

/// Defines `name` with the signature `params` (as the library's header declares it) to call the
/// library's own `name` with `args`.
#define WEFT_GPU_FORWARD(library, result, name, params, args)                                 \
  extern "C" result name params {                                                            \
    static const auto real = reinterpret_cast<result(*) params>((library).function(#name)); \
    return real args;                                                                        \
  }
