#include "core/cuda/GpuLibrary.h"

#include "core/Error.h"

#include <dlfcn.h>

#include <filesystem>

namespace weft::cuda {

void GpuLibrary::open() {
  const std::string soname = std::filesystem::path(path_).filename().string();
  std::string reasons;
  for (const std::string& file : {soname, path_}) {
    // RTLD_LOCAL: the library's symbols do not become candidates for anyone else's lookups.
    handle_ = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) return;
    const char* reason = ::dlerror();
    reasons += fmt::format("; {}: {}", file, reason != nullptr ? reason : "unknown reason");
  }
  failure_ = fmt::format("the GPU library {} could not be loaded{}", name_, reasons);
}

void* GpuLibrary::function(const char* function) {
  std::call_once(opened_, [this] { open(); });
  WEFT_CHECK(handle_ != nullptr, "{}", failure_);
  void* address = ::dlsym(handle_, function);
  WEFT_CHECK(address != nullptr, "the GPU library {} ({}) has no function {}", name_, path_, function);
  return address;
}

}  // namespace weft::cuda
