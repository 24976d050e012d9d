// Trains a zoo model twice through the real `weft train` and compares the checkpoints: the
// equivalence check of distributed training (tests that define WEFT_CLI).
#pragma once

#include "tests/TestUtil.h"

#include "core/Checkpoint.h"

#include <algorithm>
#include <cmath>
#include <string>

/// Checks that the checkpoints in directories `a` and `b` hold the same variables, each within
/// `tolerance` (relativeDifference), and nothing else.
inline void checkSameCheckpoints(const std::string& a, const std::string& b, double tolerance) {
  const weft::TensorFile expected = weft::readSafetensors(a + "/checkpoint.safetensors");
  const weft::TensorFile got = weft::readSafetensors(b + "/checkpoint.safetensors");
  REQUIRE(expected.tensors.size() == got.tensors.size());
  for (const auto& [name, t] : expected.tensors) {
    CAPTURE(name);
    CHECK(relativeDifference(got.tensors.at(name), t) <= tolerance);
  }
}

/// Trains `model` once with `flags` and `singleFlags` (such as its device) and once with `flags`
/// and `distFlags` (workers or cluster, architecture, servers); checks every variable (optimizer
/// slots and the step counter included) agrees within `tolerance`.
inline void checkSameVariablesAs(const std::string& model, const std::string& flags, const std::string& distFlags,
                                 double tolerance, const std::string& singleFlags = "") {
  TempDir dir;
  const std::string single = (dir.path / "single").string(), parallel = (dir.path / "parallel").string();
  const CliRun one = weftCli("train " + model + " " + flags + " " + singleFlags + " --out " + single);
  REQUIRE_MESSAGE(one.status == 0, one.output);
  const CliRun many = weftCli("train " + model + " " + flags + " " + distFlags + " --out " + parallel);
  REQUIRE_MESSAGE(many.status == 0, many.output);
  checkSameCheckpoints(single, parallel, tolerance);
}
