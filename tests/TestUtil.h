// doctest glue for the op-testing helpers.
#pragma once

#include "autodiff/GradCheck.h"
#include "models/ZooModel.h"
#include "testing/OpTest.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

/// Checks a tensor against reference values (in double) within tol.
#define CHECK_CLOSE(actual, expected, tol)                                  \
  do {                                                                      \
    const std::string weftMismatch_ = ::weft::testing::compare((actual), (expected), (tol)); \
    CHECK_MESSAGE(weftMismatch_.empty(), weftMismatch_);                    \
  } while (0)

/// Checks a gradient-check report.
#define CHECK_GRADIENTS(report)                            \
  do {                                                     \
    const ::weft::GradCheckReport weftReport_ = (report);  \
    CHECK_MESSAGE(weftReport_.ok, weftReport_.detail);     \
  } while (0)

/// Runs the rest of the test case once per floating dtype, as SUBCASEs named "f32" and "f64".
#define FOR_EACH_FLOAT_DTYPE(dt) \
  ::weft::DType dt = ::weft::f32; \
  SUBCASE("f32") { dt = ::weft::f32; } \
  SUBCASE("f64") { dt = ::weft::f64; }

/// The message of the weft::Error `f` throws, or "" (and a failed check) when it throws none.
template <class F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const ::weft::Error& e) {
    return e.what();
  }
  FAIL_CHECK("expected a weft::Error");
  return "";
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Largest |a - b| of a tensor relative to its largest |b| (1 when b is all zeros).
inline double relativeDifference(const weft::Tensor& a, const weft::Tensor& b) {
  const std::vector<double> x = a.toDoubles(), y = b.toDoubles();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / (scale > 0 ? scale : 1.0);
}

/// Runs body(0) .. body(n - 1) on n threads; returns each one's error message ("" when none).
inline std::vector<std::string> onThreads(size_t n, const std::function<void(size_t)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        body(i);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

/// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("weft-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path / name).string(); }
  /// Writes `bytes` to a file in the directory and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = file(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

  std::filesystem::path path;
};

/// Sets a zoo model's option by name, as the trainer does from the command line.
template <class T>
void setOption(::weft::models::ZooModel& model, const std::string& name, T value) {
  for (::weft::models::ModelOption& o : model.options()) {
    if (o.name == name) {
      *std::get<T*>(o.target) = value;
      return;
    }
  }
  FAIL("no option " << name);
}

#ifdef WEFT_CLI
/// What a run of the real `weft` binary returned: its exit status and its stdout + stderr.
struct CliRun {
  int status;
  std::string output;
};

/// Runs `weft ARGS` (the binary this build made) and captures its output.
inline CliRun weftCli(const std::string& args) {
  const std::filesystem::path log =
      std::filesystem::temp_directory_path() / ("weft-cli-" + std::to_string(::getpid()) + ".log");
  const int status = std::system((std::string(WEFT_CLI) + " " + args + " > " + log.string() + " 2>&1").c_str());
  std::ifstream in(log);
  CliRun r{status, std::string(std::istreambuf_iterator<char>(in), {})};
  std::filesystem::remove(log);
  return r;
}
#endif
