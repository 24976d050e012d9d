// Test helpers for loaders of untrusted files: a FIFO that a loader must refuse without blocking.
#pragma once

#include "tests/TestUtil.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>

/// Makes a FIFO named `name` in `dir`; returns its path.
inline std::string makeFifo(const TempDir& dir, const std::string& name) {
  const std::string path = dir.file(name);
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  return path;
}

/// The weft::Error that `load` throws for the FIFO at `fifo`. A loader that blocks on the FIFO
/// fails the check after two seconds and is then released by a writer that closes at once (it
/// sees an empty file), so the test fails instead of hanging.
template <class F>
std::string fifoError(const std::string& fifo, F&& load) {
  auto result = std::async(std::launch::async, [&] {
    try {
      load();
    } catch (const ::weft::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  if (result.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    FAIL_CHECK("the loader blocked on the FIFO " << fifo);
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) ::close(fd);
  }
  return result.get();
}
