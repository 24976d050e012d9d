// doctest glue for the op-testing helpers.
#pragma once

#include "autodiff/GradCheck.h"
#include "testing/OpTest.h"

#include <doctest/doctest.h>

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
