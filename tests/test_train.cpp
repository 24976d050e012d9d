// `weft train` end to end, through the real binary: a run interrupted and resumed from its
// checkpoint ends with exactly the variables of an uninterrupted run; bad flags and corrupt
// checkpoints give clear errors.
#include "tests/TestUtil.h"

#include "core/Checkpoint.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

TEST_CASE("a resumed run ends exactly where an uninterrupted run does") {
  TempDir dir;
  const std::string common = "train mlp --dropout 0.3 --train-size 2000 --test-size 500 --batch 32 --eval-every 40 --log-every 20 --seed 5";
  const std::string whole = (dir.path / "whole").string(), parts = (dir.path / "parts").string();
  REQUIRE(weftCli(common + " --steps 120 --out " + whole).status == 0);
  REQUIRE(weftCli(common + " --steps 80 --out " + parts).status == 0);
  const CliRun resumed = weftCli(common + " --steps 120 --resume --out " + parts);
  REQUIRE_MESSAGE(resumed.status == 0, resumed.output);
  CHECK(contains(resumed.output, "resumed from"));
  const weft::TensorFile a = weft::readSafetensors(whole + "/checkpoint.safetensors");
  const weft::TensorFile b = weft::readSafetensors(parts + "/checkpoint.safetensors");
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    CAPTURE(name);
    CHECK(b.tensors.at(name).toDoubles() == t.toDoubles());
  }
  CHECK(a.metadata.at("data_position") == b.metadata.at("data_position"));
}

TEST_CASE("resuming without a checkpoint, or from a corrupt one, fails with a message") {
  TempDir dir;
  const std::string out = (dir.path / "none").string();
  CliRun r = weftCli("train mlp --steps 5 --resume --out " + out);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "no checkpoint at"));
  fs::create_directories(out);
  std::ofstream(out + "/checkpoint.safetensors") << "garbage!";
  r = weftCli("train mlp --steps 5 --resume --out " + out);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "corrupt"));
}

TEST_CASE("a checkpoint of another configuration is refused") {
  TempDir dir;
  const std::string out = (dir.path / "cfg").string();
  REQUIRE(weftCli("train mlp --steps 3 --train-size 500 --test-size 100 --out " + out).status == 0);
  const CliRun r = weftCli("train mlp --steps 6 --hidden-width 64 --train-size 500 --test-size 100 --resume --out " + out);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "does not match the model"));
}

TEST_CASE("bench prints one JSON line with timing percentiles") {
  const CliRun r = weftCli("train mlp --bench 5 --train-size 1000 --test-size 100");
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "\"median_ms\""));
  CHECK(contains(r.output, "\"examples_per_s\""));
}

TEST_CASE("--epochs trains for whole passes over the training data") {
  TempDir dir;
  const CliRun r = weftCli("train mlp --epochs 2 --train-size 640 --test-size 100 --batch 64 --log-every 5 --out " +
                        (dir.path / "epochs").string());
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "for 20 steps"));
  CHECK(weftCli("train mlp --epochs 2 --steps 5").status != 0);
}

TEST_CASE("a resumed language model continues its sampled candidates exactly") {
  TempDir dir;
  const std::string common = "train lm --vocab 500 --classes 8 --train-sentences 2000 --heldout-sentences 50 --embed 16 "
                             "--hidden 16 --sampled 64 --batch 16 --eval-every 10 --log-every 10 --seed 2";
  const std::string whole = (dir.path / "lm-whole").string(), parts = (dir.path / "lm-parts").string();
  REQUIRE(weftCli(common + " --steps 30 --out " + whole).status == 0);
  REQUIRE(weftCli(common + " --steps 20 --out " + parts).status == 0);
  const CliRun resumed = weftCli(common + " --steps 30 --resume --out " + parts);
  REQUIRE_MESSAGE(resumed.status == 0, resumed.output);
  const weft::TensorFile a = weft::readSafetensors(whole + "/checkpoint.safetensors");
  const weft::TensorFile b = weft::readSafetensors(parts + "/checkpoint.safetensors");
  for (const auto& [name, t] : a.tensors) {
    CAPTURE(name);
    CHECK(b.tensors.at(name).toDoubles() == t.toDoubles());
  }
}

TEST_CASE("bad flags are reported") {
  const CliRun r = weftCli("train mlp --steps -3");
  CHECK(r.status != 0);
  CHECK(contains(r.output, "--steps"));
  CHECK(weftCli("train nosuchmodel").status != 0);
}

TEST_CASE("--precision f16 trains with a loss scale that the checkpoint carries and a resume continues") {
  TempDir dir;
  const std::string common = "train mlp --precision f16 --train-size 2000 --test-size 500 --batch 32 --eval-every 40 --seed 5";
  const std::string whole = (dir.path / "whole").string(), parts = (dir.path / "parts").string();
  const CliRun run = weftCli(common + " --steps 80 --out " + whole);
  REQUIRE_MESSAGE(run.status == 0, run.output);
  REQUIRE(weftCli(common + " --steps 40 --out " + parts).status == 0);
  REQUIRE(weftCli(common + " --steps 80 --resume --out " + parts).status == 0);
  const weft::TensorFile a = weft::readSafetensors(whole + "/checkpoint.safetensors");
  const weft::TensorFile b = weft::readSafetensors(parts + "/checkpoint.safetensors");
  CHECK(a.tensors.at("loss_scale").item() == 65536);
  for (const auto& [name, t] : a.tensors) {
    CAPTURE(name);
    CHECK(b.tensors.at(name).toDoubles() == t.toDoubles());
  }
}

TEST_CASE("--precision takes f32, bf16 or f16, and f16 only in one process") {
  CHECK(weftCli("train mlp --precision bf16 --steps 5 --train-size 500 --test-size 100 --out " + TempDir().file("o")).status == 0);
  const CliRun f8 = weftCli("train mlp --precision f8");
  CHECK(f8.status != 0);
  CHECK(contains(f8.output, "--precision"));
  const CliRun distributed = weftCli("train mlp --precision f16 --workers 2");
  CHECK(distributed.status != 0);
  CHECK(contains(distributed.output, "use --precision bf16 with --workers"));
}
