// doctest glue for the op-testing helpers.
#pragma once

#include "autodiff/GradCheck.h"
#include "testing/OpTest.h"

#include <doctest/doctest.h>

#include <string>

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
