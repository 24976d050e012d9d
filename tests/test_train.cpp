// `weft train` end to end, through the real binary: a run interrupted and resumed from its
// checkpoint ends with exactly the variables of an uninterrupted run; bad flags and corrupt
// checkpoints give clear errors.
#include "tests/TestUtil.h"

#include "core/Checkpoint.h"
#include "data/Graphs.h"
#include "ops/Bf16GemmAmx.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>

namespace fs = std::filesystem;

extern char** environ;

namespace {

/// Sets metadata fields of a checkpoint, its checksums recomputed: a crafted, well-formed file.
void setMetadata(const std::string& path, const std::map<std::string, std::string>& fields) {
  weft::TensorFile f = weft::readSafetensors(path);
  for (const auto& [key, value] : fields) f.metadata[key] = value;
  weft::writeSafetensors(path, f);
}

/// The temporary files of checkpoint saves in a directory.
std::vector<fs::path> temporariesIn(const fs::path& dir) {
  std::vector<fs::path> found;
  if (!fs::exists(dir)) return found;  // a run killed before it made its output directory
  for (const auto& e : fs::directory_iterator(dir)) {
    if (contains(e.path().filename().string(), ".tmp-")) found.push_back(e.path());
  }
  return found;
}

/// Starts `weft ARGS` with its output in `log`, after `shell` (resource limits, say); the process
/// id is the binary's own (the shell execs it).
pid_t startWeft(const std::string& args, const std::string& log, const std::string& shell = "") {
  const std::string command =
      shell + (shell.empty() ? "" : "; ") + "exec " + WEFT_CLI + " " + args + " > " + log + " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char* const*>(argv), environ) == 0);
  return pid;
}

/// Exit status of a started process (128 + N when signal N ended it).
int waitFor(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// A process id that no running process has: a child that has exited and been reaped.
pid_t deadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Every tensor of two checkpoints bit for bit, and their data positions.
void checkSameCheckpoint(const std::string& a, const std::string& b) {
  const weft::TensorFile x = weft::readSafetensors(a);
  const weft::TensorFile y = weft::readSafetensors(b);
  REQUIRE(x.tensors.size() == y.tensors.size());
  for (const auto& [name, t] : x.tensors) {
    CAPTURE(name);
    CHECK(y.tensors.at(name).toDoubles() == t.toDoubles());
  }
  CHECK(x.metadata.at("data_position") == y.metadata.at("data_position"));
}

}  // namespace

TEST_CASE("a resumed run ends exactly where an uninterrupted run does") {
  TempDir dir;
  const std::string common =
      "train mlp --dropout 0.3 --train-size 2000 --test-size 500 --batch 32 --eval-every 40 --log-every 20 --seed 5";
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

TEST_CASE("--resume auto starts afresh without a checkpoint and continues from one") {
  TempDir dir;
  const std::string common = "train mlp --train-size 500 --test-size 100 --batch 32 --eval-every 10 --seed 3";
  const std::string whole = (dir.path / "whole").string(), parts = (dir.path / "parts").string();
  REQUIRE(weftCli(common + " --steps 30 --out " + whole).status == 0);
  const CliRun first = weftCli(common + " --steps 20 --resume auto --out " + parts);
  REQUIRE_MESSAGE(first.status == 0, first.output);
  CHECK_FALSE(contains(first.output, "resumed from"));
  const CliRun again = weftCli(common + " --steps 30 --resume auto --out " + parts);
  REQUIRE_MESSAGE(again.status == 0, again.output);
  CHECK(contains(again.output, "resumed from " + parts + "/checkpoint.safetensors at step 20"));
  const weft::TensorFile a = weft::readSafetensors(whole + "/checkpoint.safetensors");
  const weft::TensorFile b = weft::readSafetensors(parts + "/checkpoint.safetensors");
  for (const auto& [name, t] : a.tensors) {
    CAPTURE(name);
    CHECK(b.tensors.at(name).toDoubles() == t.toDoubles());
  }
  CHECK(weftCli(common + " --steps 30 --resume sometimes --out " + parts).status != 0);
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
  const CliRun r =
      weftCli("train mlp --steps 6 --hidden-width 64 --train-size 500 --test-size 100 --resume --out " + out);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "does not match the model"));
}

TEST_CASE("bench prints one JSON line with timing percentiles") {
  const CliRun r = weftCli("train mlp --bench 5 --train-size 1000 --test-size 100");
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "\"median_ms\""));
  CHECK(contains(r.output, "\"examples_per_s\""));
}

TEST_CASE("bench names the vector instruction set and the matrix product kernel the build runs") {
  const CliRun r = weftCli("train mlp --bench 2 --train-size 500 --test-size 100");
  REQUIRE(r.status == 0);
#if defined(__AVX512F__)
  CHECK(contains(r.output, "\"isa\":\"AVX-512\""));
  CHECK(contains(r.output, "\"gemm_f32\":\"weft AVX-512\""));
#elif defined(__AVX2__) && defined(__FMA__)
  CHECK(contains(r.output, "\"isa\":\"AVX2\""));
  CHECK(contains(r.output, "\"gemm_f32\":\"weft AVX2\""));
#else
  CHECK(contains(r.output, "\"gemm_f32\":\"OpenBLAS\""));
#endif
  // AMX is chosen at run time (test_gemm checks the choice against /proc/cpuinfo).
  if (weft::blas::detail::amxBf16Usable()) {
    CHECK(contains(r.output, "\"gemm_bf16\":\"weft AMX-BF16\""));
  } else {
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    CHECK(contains(r.output, "\"gemm_bf16\":\"weft AVX512_BF16\""));
#else
    CHECK(contains(r.output, "\"gemm_bf16\":\"none\""));
#endif
  }
}

TEST_CASE("--epochs trains for whole passes over the training data") {
  TempDir dir;
  const CliRun r = weftCli("train mlp --epochs 2 --train-size 640 --test-size 100 --batch 64 --log-every 5 --out " +
                        (dir.path / "epochs").string());
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "for 20 steps"));
  CHECK(weftCli("train mlp --epochs 2 --steps 5").status != 0);
}

TEST_CASE("the MLP trains on MNIST's IDX files with --data and learns them") {
  // 4x4 images whose one lit pixel is the label's: learnable in a few dozen steps.
  auto idx = [](uint32_t magic, std::vector<uint32_t> dims, const std::string& body) {
    std::string out;
    dims.insert(dims.begin(), magic);
    for (const uint32_t v : dims)
      for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
    return out + body;
  };
  auto write = [&](const fs::path& dir, const std::string& split, uint32_t count) {
    std::string pixels, labels;
    for (uint32_t i = 0; i < count; ++i) {
      std::string image(16, '\0');
      image[i % 10] = static_cast<char>(255);
      pixels += image;
      labels.push_back(static_cast<char>(i % 10));
    }
    std::ofstream(dir / (split + "-images-idx3-ubyte"), std::ios::binary) << idx(0x803, {count, 4, 4}, pixels);
    std::ofstream(dir / (split + "-labels-idx1-ubyte"), std::ios::binary) << idx(0x801, {count}, labels);
  };
  TempDir dir;
  write(dir.path, "train", 200);
  write(dir.path, "t10k", 50);
  const CliRun r = weftCli("train mlp --data " + dir.path.string() +
                           " --hidden-width 16 --batch 20 --steps 60 --lr 0.02 --out " + (dir.path / "out").string());
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "accuracy 1.0000"));
  std::ofstream(dir.path / "t10k-labels-idx1-ubyte", std::ios::binary) << idx(0x801, {49}, std::string(49, '\1'));
  const CliRun bad =
      weftCli("train mlp --data " + dir.path.string() + " --steps 1 --out " + (dir.path / "bad").string());
  CHECK(bad.status != 0);
  CHECK(contains(bad.output, "disagree: 50 images, 49 labels"));
}

TEST_CASE("a resumed language model continues its sampled candidates exactly") {
  TempDir dir;
  const std::string common =
      "train lm --vocab 500 --classes 8 --train-sentences 2000 --heldout-sentences 50 --embed 16 "
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
  const std::string common =
      "train mlp --precision f16 --train-size 2000 --test-size 500 --batch 32 --eval-every 40 --seed 5";
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

TEST_CASE("--precision takes f32, bf16 or f16; f16's skipped steps refuse variables on the parameter servers") {
  CHECK(weftCli("train mlp --precision bf16 --steps 5 --train-size 500 --test-size 100 --out " + TempDir().file("o"))
            .status == 0);
  const CliRun f8 = weftCli("train mlp --precision f8");
  CHECK(f8.status != 0);
  CHECK(contains(f8.output, "--precision"));
  // The LM's embedding and softmax weights live on the server under --arch auto.
  const CliRun served = weftCli("train lm --precision f16 --workers 2 --servers 1 --vocab 500 --classes 10 --embed 16 "
                                "--hidden 32 --sampled 64 --train-sentences 400 --heldout-sentences 20 --batch 16 "
                                "--steps 2 --threads 1 --timeout 30 --out " + TempDir().file("o"));
  CHECK(served.status != 0);
  CHECK(contains(served.output, "which the parameter servers do not see"));
  CHECK(contains(served.output, "--arch ar"));
}

TEST_CASE("--precision bf16 on a CPU adds no op to the step and keeps the products' operands in f32") {
  TempDir dir;
  // Each op of the step's trace, by node name, with the bytes it read and wrote.
  auto opsOf = [&](const std::string& precision) {
    const std::string trace = dir.file(precision + ".json");
    const CliRun r = weftCli("train mlp --bench 2 --precision " + precision +
                             " --train-size 500 --test-size 100 --trace " + trace + " --out " + dir.file(precision));
    REQUIRE_MESSAGE(r.status == 0, r.output);
    std::map<std::string, int64_t> bytes;
    const nlohmann::json events = nlohmann::json::parse(readText(trace));
    for (const auto& e : events["traceEvents"]) {
      if (e.value("ph", "") == "X" && e.contains("args") && e["args"].contains("bytes")) {
        bytes[e["name"].get<std::string>()] = e["args"]["bytes"].get<int64_t>();
      }
    }
    return bytes;
  };
  const auto f32 = opsOf("f32"), bf16 = opsOf("bf16");
  std::vector<std::string> f32Ops, bf16Ops;
  for (const auto& [name, b] : f32) f32Ops.push_back(name);
  for (const auto& [name, b] : bf16) bf16Ops.push_back(name);
  CHECK(!f32Ops.empty());
  CHECK(bf16Ops == f32Ops);
  // The products round their operands inside the kernel: they read and write f32 tensors.
  int products = 0;
  for (const auto& [name, b] : f32) {
    if (name.find("MatMul") == std::string::npos) continue;
    CAPTURE(name);
    CHECK(bf16.at(name) == b);
    ++products;
  }
  CHECK(products == 8);  // three layers: each forward product and two gradient products, less dx of the input
}

TEST_CASE("a checkpoint of a run with other settings is refused, naming each, unless --resume-changed") {
  TempDir dir;
  const std::string base = "train mlp --train-size 500 --test-size 100 --log-every 5 --out " + dir.file("run");
  REQUIRE(weftCli(base + " --steps 5 --lr 0.002 --seed 3 --batch 16 --weight-decay 0 --dropout 0.1").status == 0);
  const std::string changed = base + " --lr 0.003 --seed 4 --batch 32 --weight-decay 0.01 --dropout 0.2";
  const CliRun refused = weftCli(changed + " --steps 10 --resume");
  CHECK(refused.status != 0);
  for (const char* difference :
       {"--lr: 0.002 in the checkpoint, 0.003 now", "--seed: 3 in the checkpoint, 4 now",
        "--batch: 16 in the checkpoint, 32 now", "--weight-decay: 0 in the checkpoint, 0.01 now",
        "--dropout: 0.1 in the checkpoint, 0.2 now", "the training data's hash", "resume with --resume-changed"}) {
    CHECK_MESSAGE(contains(refused.output, difference), refused.output);
  }
  CHECK(!contains(refused.output, "--hidden-width"));
  const CliRun changedRun = weftCli(changed + " --steps 10 --resume-changed");
  REQUIRE_MESSAGE(changedRun.status == 0, changedRun.output);
  CHECK(contains(changedRun.output, "--resume-changed: continuing"));
  CHECK(contains(changedRun.output, "resumed from"));
  // The checkpoints written since record the new settings.
  const CliRun plain = weftCli(changed + " --steps 15 --resume");
  CHECK_MESSAGE(plain.status == 0, plain.output);
}

TEST_CASE("a checkpoint of another corpus with the same vocabulary is refused") {
  TempDir dir;
  std::string forward, backward;  // the same sentences, words in the other order: the same vocabulary
  for (int i = 0; i < 200; ++i) {
    const int a = i % 7, b = (i * 3 + 1) % 7, c = (i / 7) % 7;
    forward += fmt::format("w{} w{} w{}\n", a, b, c);
    backward += fmt::format("w{} w{} w{}\n", c, b, a);
  }
  const std::string common =
      "train lm --embed 8 --hidden 8 --sampled 0 --batch 8 --eval-batch 2 --eval-batches 1 --out " + dir.file("lm");
  const CliRun first = weftCli(common + " --steps 3 --data " + dir.write("forward.txt", forward));
  REQUIRE_MESSAGE(first.status == 0, first.output);
  const CliRun other = weftCli(common + " --steps 6 --resume --data " + dir.write("backward.txt", backward));
  CHECK(other.status != 0);
  CHECK_MESSAGE(contains(other.output, "the training data's hash: "), other.output);
  CHECK(!contains(other.output, "does not match the model"));
  // The same text under another name is the same data.
  const CliRun same = weftCli(common + " --steps 6 --resume --data " + dir.write("copy.txt", forward));
  CHECK_MESSAGE(same.status == 0, same.output);
}

TEST_CASE("a checkpoint with a negative step, or a data position other than its step, is refused naming the field") {
  TempDir dir;
  const std::string out = dir.file("run");
  const std::string path = out + "/checkpoint.safetensors";
  const std::string run = "train mlp --train-size 500 --test-size 100 --steps 8 --resume --out " + out;
  REQUIRE(weftCli("train mlp --train-size 500 --test-size 100 --steps 4 --out " + out).status == 0);
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> crafted{
      {{{"step", "-3"}, {"data_position", "-3"}}, "metadata field 'step' is -3, outside [0, "},
      {{{"step", "4"}, {"data_position", "9223372036854775807"}},
       "metadata field 'data_position' is 9223372036854775807, but a run at step 4"},
      {{{"step", "4x"}}, "metadata field 'step' is '4x', not an integer"},
  };
  for (const auto& [fields, message] : crafted) {
    CAPTURE(message);
    setMetadata(path, fields);
    const CliRun r = weftCli(run);
    CHECK(r.status != 0);
    CHECK_MESSAGE(contains(r.output, message), r.output);
    CHECK(contains(r.output, path));
    setMetadata(path, {{"step", "4"}, {"data_position", "4"}});
  }
}

TEST_CASE("a failed save stops the run with the reason and keeps the previous checkpoint") {
  TempDir dir;
  const std::string out = dir.file("run");
  const std::string common =
      "train mlp --train-size 500 --test-size 100 --checkpoint-every 5 --eval-every 5 --out " + out;
  REQUIRE(weftCli(common + " --steps 5").status == 0);
  // Writes beyond 64 KiB fail (EFBIG): the checkpoint's, not the log's.
  const pid_t pid = startWeft(common + " --steps 10 --resume", dir.file("log"), "trap '' XFSZ; ulimit -f 128");
  const int status = waitFor(pid);
  const std::string log = readText(dir.file("log"));
  CHECK(status == 1);
  CHECK_MESSAGE(contains(log, "cannot write checkpoint " + out + "/checkpoint.safetensors"), log);
  CHECK(contains(log, std::strerror(EFBIG)));
  CHECK(weft::readSafetensors(out + "/checkpoint.safetensors").metadata.at("step") == "5");
  CHECK(temporariesIn(out).empty());
}

TEST_CASE("temporary files of interrupted saves are removed when the next run starts") {
  TempDir dir;
  const std::string out = dir.file("run");
  fs::create_directories(out);
  const std::string dead = std::to_string(deadPid());
  std::ofstream(out + "/checkpoint.safetensors.tmp-" + dead) << std::string(1000, 'x');
  std::ofstream(out + "/checkpoint.safetensors.tmp-" + dead + "-0") << std::string(24, 'x');
  const CliRun r = weftCli("train mlp --train-size 500 --test-size 100 --steps 2 --out " + out);
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "removed 2 temporary files (1024 bytes)"));
  CHECK(temporariesIn(out).empty());
}

// SIGKILL at random moments, half of them while a save is in progress; WEFT_KILL_TRIALS sets the
// number of kills (12).
TEST_CASE("runs killed during saves leave checkpoints that load, and the resumed run is exact") {
  const char* env = std::getenv("WEFT_KILL_TRIALS");
  const int trials = env ? std::atoi(env) : 12;
  TempDir dir;
  // Each trial advances the run by a few steps, so the run outlasts the trials.
  const std::string common = fmt::format(
      "train mlp --hidden-width 256 --train-size 2000 --test-size 100 --batch 32 --dropout 0.2 "
      "--checkpoint-every 1 --eval-every 100000 --log-every 100000 --seed 7 --steps {}",
      50 + 15 * trials);
  const std::string whole = dir.file("whole"), out = dir.file("killed");
  REQUIRE(weftCli(common + " --out " + whole).status == 0);
  const std::string path = out + "/checkpoint.safetensors";
  std::mt19937 rng(2024);
  auto uniform = [&](int lo, int hi) {
    return std::chrono::microseconds(std::uniform_int_distribution<int>(lo, hi)(rng));
  };
  int killedInSave = 0, finished = 0, temporariesLeft = 0, temporariesRefused = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const pid_t pid = startWeft(common + (fs::exists(path) ? " --resume" : "") + " --out " + out, dir.file("log"));
    const std::string temporary = path + ".tmp-" + std::to_string(pid) + "-0";
    int status = -1;
    auto exited = [&] {
      int s = 0;
      if (::waitpid(pid, &s, WNOHANG) != pid) return false;
      status = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
      return true;
    };
    if (trial % 2 == 0) {
      std::this_thread::sleep_for(uniform(0, 150000));  // anywhere: starting, training, saving
    } else {
      // While the run's first save is being written.
      const auto start = std::chrono::steady_clock::now();
      while (!fs::exists(temporary) && !exited() &&
             std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      std::this_thread::sleep_for(uniform(0, 800));
    }
    killedInSave += fs::exists(temporary);
    if (status < 0) {
      ::kill(pid, SIGKILL);
      status = waitFor(pid);
    }
    CHECK_MESSAGE((status == 128 + SIGKILL || status == 0), readText(dir.file("log")));
    finished += status == 0;
    if (fs::exists(path)) CHECK_NOTHROW(weft::readSafetensors(path, weft::Checksums::Required));
    for (const fs::path& temp : temporariesIn(out)) {
      ++temporariesLeft;
      try {
        weft::readSafetensors(temp.string(), weft::Checksums::Required);
      } catch (const weft::Error&) {
        ++temporariesRefused;
      }
    }
  }
  MESSAGE(trials << " kills, " << killedInSave << " with a save in progress, " << finished << " runs finished first; "
                 << temporariesLeft << " temporary files found after the kills, " << temporariesRefused
                 << " of them refused as incomplete");
  const CliRun last = weftCli(common + (fs::exists(path) ? " --resume" : "") + " --out " + out);
  REQUIRE_MESSAGE(last.status == 0, last.output);
  CHECK(temporariesIn(out).empty());
  checkSameCheckpoint(whole + "/checkpoint.safetensors", path);
}

TEST_CASE("--amp trains an AMP model on worker threads, reporting each epoch, its metrics and a trace") {
  TempDir dir;
  const std::string out = (dir.path / "tree").string(), trace = (dir.path / "trace.json").string();
  const CliRun r = weftCli("train tree_lstm --amp --epochs 2 --target 0 --train-size 60 --eval-size 20 --workers 2 "
                           "--max-active-keys 3 --min-update-frequency 4 --out " + out + " --trace " + trace);
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "epoch   2 | train loss"));
  CHECK(contains(r.output, "\"mode\":\"async\""));
  const std::string metrics = readText(out + "/metrics.jsonl");
  CHECK(contains(metrics, "\"staleness_mean\""));
  CHECK(contains(metrics, "\"worker_utilisation\""));
  const std::string events = readText(trace);
  for (const char* part : {"amp worker 0", "amp worker 1", "\"forward\"", "\"backward\"", "\"update\""})
    CHECK(contains(events, part));
}

TEST_CASE("--amp --minibatch trains synchronously") {
  TempDir dir;
  const CliRun r = weftCli(
      "train list_reduction --amp --minibatch 8 --epochs 1 --target 0 --train-size 40 --eval-size 8 "
      "--replicas 2 --out " +
      (dir.path / "lr").string());
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "sync, minibatch 8"));
  CHECK(contains(r.output, "\"mode\":\"sync\""));
}

TEST_CASE("--amp takes the zoo's model names and --steps, and weft train --help names the AMP mode and models") {
  TempDir dir;
  // gnn is the GGSNN under --amp as in the zoo; --steps counts training instances.
  const CliRun r = weftCli("train gnn --amp --steps 12 --target 0 --train-size 40 --eval-size 8 --out " +
                           (dir.path / "gnn").string());
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "\"model\":\"gnn\""));
  CHECK(contains(r.output, "epoch   1"));
  CHECK_FALSE(contains(r.output, "epoch   2"));
  const CliRun help = weftCli("train --help");
  CHECK(contains(help.output, "--amp"));
  CHECK(contains(help.output, "tree_lstm"));
  const CliRun ampOnly = weftCli("train tree_lstm");
  CHECK(ampOnly.status != 0);
  CHECK(contains(ampOnly.output, "tree_lstm trains asynchronously only: weft train tree_lstm --amp"));
}

TEST_CASE("weft graph MODEL --amp prints the AMP graph, as text or DOT") {
  const CliRun text = weftCli("graph ggsnn --amp");
  REQUIRE_MESSAGE(text.status == 0, text.output);
  CHECK(contains(text.output, "by_type"));
  CHECK(contains(text.output, "flatmap"));
  const CliRun dot = weftCli("graph tree_lstm --amp --dot");
  REQUIRE(dot.status == 0);
  CHECK(contains(dot.output, "digraph amp"));
}

TEST_CASE("weft graph MODEL --stages S prints each stage's memory, and --memory-per-stage bounds it") {
  const CliRun cut = weftCli("graph mlp --stages 2 --microbatches 2");
  REQUIRE_MESSAGE(cut.status == 0, cut.output);
  CHECK(contains(cut.output, "stage 0: "));
  CHECK(contains(cut.output, ", optimizer state "));
  CHECK(contains(cut.output, "activations 2 x "));  // 1f1b: stage 0 of 2 holds two micro-batches
  CHECK(contains(weftCli("graph mlp --stages 2 --microbatches 2 --schedule gpipe --memory-per-stage 2GiB").output,
                 "activations 2 x "));
  const CliRun tight = weftCli("graph mlp --stages 2 --memory-per-stage 1kB");
  CHECK(tight.status != 0);
  CHECK(contains(tight.output,
                 "no cut of the step into 2 pipeline stages keeps every stage within 1.0 kB (1000 bytes;"));
  const CliRun unit = weftCli("graph mlp --stages 2 --memory-per-stage 12XB");
  CHECK(unit.status != 0);
  CHECK(contains(unit.output, "'12XB' is not a number of bytes"));
}

TEST_CASE("--schedule-file: orders that deadlock or miss an action are refused before the job starts, naming it") {
  TempDir dir;
  const std::string deadlock = (dir.path / "deadlock.txt").string(), missing = (dir.path / "missing.txt").string();
  std::ofstream(deadlock) << "F0 B0 F1 B1\nF1 F0 B0 B1\n";
  std::ofstream(missing) << "F0 F1 B0 B1\nF0 B0 F1\n";
  const std::string flags = "train mlp --steps 1 --stages 2 --microbatches 2 --out " + (dir.path / "run").string();
  const CliRun stuck = weftCli(flags + " --schedule-file " + deadlock);
  CHECK(stuck.status != 0);
  CHECK_MESSAGE(
      contains(stuck.output, "schedule file " + deadlock +
                                 ": the pipeline orders deadlock: stage 0 at B0, stage 1 at F1 can never run"),
      stuck.output);
  CHECK_FALSE(contains(stuck.output, "training mlp"));
  const CliRun incomplete = weftCli(flags + " --schedule-file " + missing);
  CHECK(incomplete.status != 0);
  CHECK_MESSAGE(contains(incomplete.output, "schedule file " + missing + ": stage 1 never runs B1"), incomplete.output);
  CHECK(weftCli(flags + " --schedule zb --schedule-file " + missing).status != 0);  // one schedule or the other
}

TEST_CASE("weft graph --stages --schedule-file prints each stage's actions and the step they make") {
  TempDir dir;
  const std::string plan = (dir.path / "plan.txt").string();
  std::ofstream(plan) << "F0 F1 B0 B1\nF0 B0 F1 B1\n";
  const CliRun cut = weftCli("graph mlp --stages 2 --microbatches 2 --schedule-file " + plan);
  REQUIRE_MESSAGE(cut.status == 0, cut.output);
  // F = 1, B = 2: stage 1 runs F1 at 4 (after B0), B1 from 5 to 7; stage 0 runs B1 from 7 to 9.
  CHECK_MESSAGE(contains(cut.output, "schedule file " + plan + ", 2 micro-batches: a step of 9 units when a forward "
                                     "takes 1 and a backward 2 (B and W 1 each)"),
                cut.output);
  CHECK(contains(cut.output, "stage 0: idle 33%, holds the activations of at most 2 micro-batches: F0 F1 B0 B1\n"));
  CHECK(contains(cut.output, "stage 1: idle 33%, holds the activations of at most 1 micro-batch: F0 B0 F1 B1\n"));
}

TEST_CASE("weft graph --schedule zbv cuts 4 stages for 2 processes and prints each process's stages and actions") {
  const CliRun cut = weftCli("graph mlp --stages 2 --microbatches 2 --schedule zbv");
  REQUIRE_MESSAGE(cut.status == 0, cut.output);
  CHECK_MESSAGE(contains(cut.output, "stage 3: "), cut.output);
  // F = B = W = 1 per stage: 6M + S - 1 = 13 units, each process idle S - 1 = 1 of them.
  CHECK_MESSAGE(contains(cut.output, "schedule zbv, 2 micro-batches: a step of 13 units"), cut.output);
  CHECK(contains(cut.output, "process 0 (stages 0, 3): idle 8%"));
  CHECK(contains(cut.output, "process 1 (stages 1, 2): idle 8%"));
}

TEST_CASE("--amp reports an unknown model and bad data files by name") {
  CHECK(weftCli("train resnet --amp").status != 0);
  TempDir dir;
  const std::string trees = (dir.path / "trees.txt").string();
  std::ofstream(trees) << "(3 (2 good) (4 film))\n(1 (2 bad)\n";
  const CliRun r = weftCli("train tree_lstm --amp --epochs 1 --data " + trees);
  CHECK(r.status != 0);
  CHECK(contains(r.output, trees + ":2"));
}

TEST_CASE("--amp --processes trains over worker processes exactly as one process does, synchronously, its payloads "
          "encrypted with --encrypt") {
  TempDir dir;
  const std::string common = "train list_reduction --amp --dtype f64 --minibatch 8 --max-active-keys 2 --epochs 2 "
                             "--target 0 --train-size 48 --eval-size 8 --hidden 16 ";
  const std::string one = (dir.path / "one.safetensors").string(), two = (dir.path / "two.safetensors").string();
  const CliRun a = weftCli(common + "--workers 2 --out " + (dir.path / "a").string() + " --save " + one);
  REQUIRE_MESSAGE(a.status == 0, a.output);
  for (const std::string encrypt : {"", "--encrypt "}) {
    CAPTURE(encrypt);
    const CliRun b = weftCli(common + encrypt + "--processes 2 --workers 1 --out " + (dir.path / "b").string() +
                             " --save " + two);
    REQUIRE_MESSAGE(b.status == 0, b.output);
    CHECK(contains(b.output, "2 process(es) of 1 workers"));
    CHECK(contains(b.output, "the payloads between the job's processes are encrypted") == !encrypt.empty());
    const weft::TensorFile x = weft::readSafetensors(one), y = weft::readSafetensors(two);
    REQUIRE(x.tensors.size() == y.tensors.size());
    for (const auto& [name, t] : x.tensors) {
      CAPTURE(name);
      if (t.dtype() == weft::f64) CHECK(relativeDifference(y.tensors.at(name), t) < 1e-12);
    }
  }
  // One process has no one to encrypt for.
  const CliRun alone = weftCli(common + "--encrypt --workers 2 --out " + (dir.path / "c").string());
  CHECK(alone.status != 0);
  CHECK(contains(alone.output, "--encrypt encrypts what a job's processes send each other: it needs --processes"));
}

TEST_CASE("--amp --resume continues after the checkpoint's last epoch and ends as the uninterrupted run") {
  TempDir dir;
  const std::string common =
      "train list_reduction --amp --dtype f64 --minibatch 8 --max-active-keys 2 --target 0 "
      "--train-size 48 --eval-size 8 --hidden 16 --processes 2 --workers 1 ";
  const std::string whole = (dir.path / "whole.safetensors").string(),
                    resumed = (dir.path / "resumed.safetensors").string();
  const CliRun a = weftCli(common + "--epochs 3 --out " + (dir.path / "a").string() + " --save " + whole);
  REQUIRE_MESSAGE(a.status == 0, a.output);
  const std::string out = (dir.path / "b").string();
  const CliRun first = weftCli(common + "--epochs 1 --out " + out);
  REQUIRE_MESSAGE(first.status == 0, first.output);
  const weft::TensorFile checkpoint = weft::readSafetensors(out + "/checkpoint.safetensors");
  CHECK(checkpoint.metadata.at("epoch") == "1");
  CHECK(checkpoint.tensors.count("linear/Adam/linear/weight/m") == 1);  // optimizer state, of process 1's transform
  const CliRun rest = weftCli(common + "--epochs 3 --resume --out " + out + " --save " + resumed);
  REQUIRE_MESSAGE(rest.status == 0, rest.output);
  CHECK(contains(rest.output, "resumed from " + out + "/checkpoint.safetensors after epoch 1"));
  CHECK_FALSE(contains(rest.output, "epoch   1 |"));
  CHECK(contains(rest.output, "epoch   3 |"));
  const weft::TensorFile x = weft::readSafetensors(whole), y = weft::readSafetensors(resumed);
  REQUIRE(x.tensors.size() == y.tensors.size());
  for (const auto& [name, t] : x.tensors) {
    CAPTURE(name);
    // Gradients summed across processes arrive in any order: equal to rounding.
    CHECK(relativeDifference(y.tensors.at(name), t) < 1e-12);
  }
  // metrics.jsonl continues: epoch 1's line from the first run, then epochs 2 and 3.
  std::ifstream metrics(out + "/metrics.jsonl");
  std::vector<int64_t> epochs;
  for (std::string line; std::getline(metrics, line);)
    if (const auto j = nlohmann::json::parse(line); j.contains("epoch")) epochs.push_back(j["epoch"].get<int64_t>());
  CHECK(epochs == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("--amp --resume refuses a checkpoint of other settings, naming them; --resume auto starts without one") {
  TempDir dir;
  const std::string common =
      "train mlp --amp --epochs 1 --target 0 --train-size 16 --eval-size 4 --out " + (dir.path / "run").string() + " ";
  const CliRun fresh = weftCli(common + "--resume auto");
  REQUIRE_MESSAGE(fresh.status == 0, fresh.output);
  CHECK_FALSE(contains(fresh.output, "resumed from"));
  const CliRun changed = weftCli(common + "--resume --lr 0.5");
  CHECK(changed.status != 0);
  CHECK(contains(changed.output, "was written by a run with other settings"));
  CHECK(contains(changed.output, "--lr: "));
  CHECK(contains(changed.output, " in the checkpoint, 0.5 now"));
  const CliRun missing = weftCli("train mlp --amp --epochs 1 --resume --out " + (dir.path / "none").string());
  CHECK(missing.status != 0);
  CHECK(contains(missing.output,
                 "--resume: no checkpoint at " + (dir.path / "none").string() + "/checkpoint.safetensors"));
}

TEST_CASE(
    "--amp ggsnn --task deduction trains on a graph file whose one node labelled 1 is the answer, and refuses two") {
  TempDir dir;
  const std::string good = (dir.path / "deduction.graphs").string(), bad = (dir.path / "bad.graphs").string();
  std::vector<weft::data::Example> graphs = weft::data::basicDeduction({4, 6}, 40, 2);
  const weft::data::GraphFileInfo info{weft::data::kDeductionFeatures, weft::data::kDeductionEdgeTypes, true, false};
  weft::data::saveGraphs(good, info, graphs);
  const CliRun r = weftCli("train ggsnn --amp --task deduction --epochs 1 --target 0 --data " + good + " --out " +
                           (dir.path / "run").string());
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(contains(r.output, "accuracy (answers)"));
  graphs[3]["labels"] = weft::Tensor::full(weft::i64, {10}, 1);
  weft::data::saveGraphs(bad, info, graphs);
  const CliRun refused = weftCli("train ggsnn --amp --task deduction --epochs 1 --data " + bad);
  CHECK(refused.status != 0);
  CHECK(contains(refused.output, "graph 3 must label exactly one node 1"));
}

TEST_CASE("--amp --cluster runs the worker processes of a specification's hosts, and refuses parameter servers") {
  TempDir dir;
  const std::string cluster = (dir.path / "cluster.json").string(), withServers = (dir.path / "servers.json").string();
  std::ofstream(cluster) << R"({"hosts": [{"address": "127.0.0.1", "cpu_workers": 1, "servers": 0},
                                          {"address": "127.0.0.1", "cpu_workers": 1, "servers": 0}]})";
  std::ofstream(withServers) << R"({"hosts": [{"address": "127.0.0.1", "cpu_workers": 2}]})";
  const std::string common = "train mlp --amp --dtype f64 --minibatch 8 --max-active-keys 1 --epochs 1 --target 0 "
                             "--train-size 32 --eval-size 8 --hidden 8 --workers 1 ";
  const std::string one = (dir.path / "one.safetensors").string(), hosts = (dir.path / "hosts.safetensors").string();
  const CliRun a = weftCli(common + "--out " + (dir.path / "a").string() + " --save " + one);
  REQUIRE_MESSAGE(a.status == 0, a.output);
  const CliRun b =
      weftCli(common + "--cluster " + cluster + " --out " + (dir.path / "b").string() + " --save " + hosts);
  REQUIRE_MESSAGE(b.status == 0, b.output);
  CHECK(contains(b.output, "2 process(es) of 1 workers"));
  const weft::TensorFile x = weft::readSafetensors(one), y = weft::readSafetensors(hosts);
  for (const auto& [name, t] : x.tensors) {
    CAPTURE(name);
    if (t.dtype() == weft::f64) CHECK(relativeDifference(y.tensors.at(name), t) < 1e-12);
  }
  const CliRun refused = weftCli(common + "--cluster " + withServers);
  CHECK(refused.status != 0);
  CHECK(contains(refused.output, "lists 1 parameter server(s); AMP jobs run workers only"));
}

TEST_CASE("--input-threads is for resnet's image folders; a model whose examples are cheap refuses it, naming it") {
  const CliRun refused = weftCli("train mlp --input-threads 2 --steps 1");
  CHECK(refused.status != 0);
  CHECK_MESSAGE(contains(refused.output, "--input-threads 2: mlp makes its examples cheaply"), refused.output);
  CHECK(weftCli("train resnet --input-threads 0 --steps 1").status != 0);
}
