// Checkpoints: the safetensors round trip, atomic and durable writes, checksums, refusal of corrupt
// files (sizes checked without overflow) and of checkpoints that do not match the model.
#include "tests/TestUtil.h"

#include "core/Checkpoint.h"
#include "core/Hash.h"
#include "core/JsonLimits.h"
#include "data/Dataset.h"
#include "ops/Ops.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sys/resource.h>
#include <sys/wait.h>

using namespace weft;
namespace fs = std::filesystem;

namespace {

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void writeAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string header(const std::string& json) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return s + json;
}

/// Files in a directory, by name.
std::vector<std::string> filesIn(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// A process id that no running process has: a child that has exited and been reaped.
pid_t deadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

/// Lowers this process's file size limit (writes beyond it fail with EFBIG) while in scope.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lower = saved_;
    lower.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lower);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_);
  }

 private:
  rlimit saved_{};
  void (*previous_)(int) = nullptr;
};

}  // namespace

TEST_CASE("xxh64 gives the reference values of the xxHash library") {
  auto hash = [](const std::string& s, uint64_t seed) { return xxh64(s.data(), s.size(), seed); };
  CHECK(hash("", 0) == 0xef46db3751d8e999ULL);
  CHECK(hash("a", 0) == 0xd24ec4f1a98c6e5bULL);
  CHECK(hash("abc", 0) == 0x44bc2cf5ad770999ULL);
  CHECK(hash("abc", 7) == 0x9e755206156676d7ULL);
  const std::string long53 = "0123456789abcdefghijklmnopqrstuvwxyz0123456789ABCDEF!";  // stripes, words and bytes
  CHECK(hash(long53, 0) == 0xd1c66e6a2aaf5864ULL);
  CHECK(hash(long53, 7) == 0xcdc4a9b9d7e41c66ULL);
  CHECK(hex64(0xabcULL) == "0000000000000abc");
}

TEST_CASE("element and byte counts refuse to overflow") {
  const int64_t big = int64_t{1} << 40;
  CHECK(contains(errorOf([&] {
                   (void)Shape{big, big}.numel();
                 }),
                 "shape [1099511627776, 1099511627776] has more than 2^63 - 1 elements"));
  CHECK(contains(errorOf([&] { Tensor(f64, Shape{int64_t{1} << 61}); }), "more than 2^64 - 1 bytes"));
  CHECK(Shape{-1, big}.numel() == -1);
  CHECK(Shape{big, 4}.bytes(8) == static_cast<size_t>(big) * 32);
}

TEST_CASE("a header whose sizes overflow or whose fields are invalid is refused, naming the field and the value") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  auto errorFor = [&](const std::string& entry, const std::string& data = "") {
    writeAll(path, header("{\"w\":" + entry + "}") + data);
    return errorOf([&] { readSafetensors(path); });
  };
  // 2^62 f32 elements are 2^64 bytes, which wrapped to the 0 bytes of an empty range.
  std::string e = errorFor(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})");
  CHECK(contains(e, path));
  CHECK(contains(e, "field 'shape': shape [4611686018427387904] of 4-byte elements has more than 2^64 - 1 bytes"));
  e = errorFor(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]})");
  CHECK(contains(e, "more than 2^63 - 1 elements"));
  CHECK(contains(errorFor(R"({"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,0]})"),
                 "has dimension 9223372036854775808"));
  CHECK(contains(errorFor(R"({"dtype":"F32","shape":[-5],"data_offsets":[0,0]})"), "has dimension -5"));
  CHECK(contains(errorFor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8.5]})", "12345678"),
                 "field 'data_offsets' is [0,8.5], not two byte offsets"));
  CHECK(contains(errorFor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1})", "12345678"),
                 "unknown field 'extra'"));
  CHECK(contains(errorFor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", "12345678trailing"),
                 "data bytes 8 to 16 belong to no tensor"));
  CHECK(contains(errorFor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"step":5})", "12345678"),
                 "metadata field 'step' is 5, not a string"));
  CHECK(contains(errorOf([&] { readSafetensors(dir.path.string()); }), "not a regular file"));
}

TEST_CASE("every single-bit flip of a checkpoint file is refused by its checksums or its validation") {
  TempDir dir;
  TensorFile f;
  f.tensors["w"] = testing::randomTensor(f32, {4}, 1);
  f.tensors["b"] = Tensor::scalar(f64, 3);
  f.metadata["step"] = "7";
  const std::string path = dir.file("c.safetensors");
  writeSafetensors(path, f);
  const TensorFile back = readSafetensors(path, Checksums::Required);
  CHECK(back.metadata == f.metadata);  // the checksums are not part of it
  const std::string good = readAll(path);
  int refused = 0;
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    writeAll(path, bad);
    try {
      readSafetensors(path, Checksums::Required);
      MESSAGE("flipping bit " << bit % 8 << " of byte " << bit / 8 << " was not noticed: " << bad.substr(8));
    } catch (const Error&) {
      ++refused;
    }
  }
  CHECK(refused == static_cast<int>(good.size() * 8));
  // A flipped weight names the tensor and both checksums.
  std::string flipped = good;
  flipped[flipped.size() - 1] = static_cast<char>(flipped.back() ^ 0x10);
  writeAll(path, flipped);
  CHECK(contains(errorOf([&] { readSafetensors(path); }), "tensor 'w' has checksum"));
}

TEST_CASE("a save never writes through a file or link at its temporary name") {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  const std::string victim = dir.write("victim", "precious");
  for (const std::string suffix : {"", "-0"})
    fs::create_symlink(victim, path + ".tmp-" + std::to_string(::getpid()) + suffix);
  TensorFile f;
  f.tensors["x"] = Tensor::scalar(f64, 1);
  writeSafetensors(path, f);
  CHECK(readAll(victim) == "precious");
  CHECK(!fs::is_symlink(path));
  CHECK(readSafetensors(path).tensors.at("x").item() == 1);
}

TEST_CASE("a failed write keeps the previous file, leaves no temporary and says why") {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  TensorFile f;
  f.tensors["x"] = Tensor::scalar(f64, 1);
  writeSafetensors(path, f);
  f.tensors["x"] = Tensor::zeros(f64, {8192});
  std::string e;
  {
    FileSizeLimit limit(16384);
    e = errorOf([&] { writeSafetensors(path, f); });
  }
  CHECK(contains(e, "cannot write checkpoint " + path));
  CHECK(contains(e, std::strerror(EFBIG)));
  CHECK(readSafetensors(path).tensors.at("x").item() == 1);
  CHECK(filesIn(dir.path) == std::vector<std::string>{"c.safetensors"});
}

TEST_CASE("the temporaries of saves whose process died are removed; others are kept") {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  const std::string dead = std::to_string(deadPid());
  dir.write("c.safetensors.tmp-" + dead, std::string(100, 'x'));       // the name of earlier versions
  dir.write("c.safetensors.tmp-" + dead + "-3", std::string(50, 'x'));
  dir.write("c.safetensors.tmp-" + std::to_string(::getppid()) + "-0", "a save in progress");
  dir.write("c.safetensors.tmp-12x", "not a temporary of ours");
  dir.write("d.safetensors.tmp-" + dead + "-0", "another file's");
  const RemovedFiles removed = removeStaleTemporaries(path);
  CHECK(removed.files == 2);
  CHECK(removed.bytes == 150);
  std::vector<std::string> kept{"c.safetensors.tmp-" + std::to_string(::getppid()) + "-0", "c.safetensors.tmp-12x",
                                "d.safetensors.tmp-" + dead + "-0"};
  std::sort(kept.begin(), kept.end());
  CHECK(filesIn(dir.path) == kept);
}

TEST_CASE("tensors of every dtype and metadata survive a round trip") {
  TempDir dir;
  TensorFile f;
  f.tensors["a"] = testing::randomTensor(f32, {3, 4}, 1);
  f.tensors["b/c"] = testing::randomTensor(f64, {5}, 2);
  f.tensors["ids"] = testing::randomInts(i64, {2, 2}, 0, 100, 3);
  f.tensors["small"] = testing::randomInts(i32, {7}, -5, 5, 4);
  f.tensors["scalar"] = Tensor::scalar(f32, 2.5);
  f.tensors["empty"] = Tensor::zeros(f32, {0, 3});
  f.metadata["step"] = "42";
  writeSafetensors(dir.file("x.safetensors"), f);
  const TensorFile g = readSafetensors(dir.file("x.safetensors"));
  CHECK(g.metadata.at("step") == "42");
  REQUIRE(g.tensors.size() == f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    CAPTURE(name);
    CHECK(g.tensors.at(name).dtype() == t.dtype());
    CHECK(g.tensors.at(name).shape() == t.shape());
    CHECK(g.tensors.at(name).toDoubles() == t.toDoubles());
  }
}

TEST_CASE("the file follows the safetensors layout") {
  TempDir dir;
  TensorFile f;
  f.tensors["w"] = Tensor::fromVector<float>({1, 2}, {2});
  writeSafetensors(dir.file("w.safetensors"), f);
  const std::string bytes = readAll(dir.file("w.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  CHECK(n % 8 == 0);
  const std::string json = bytes.substr(8, n);
  CHECK(contains(json, "\"w\":{\"data_offsets\":[0,8],\"dtype\":\"F32\",\"shape\":[2]}"));
  CHECK(bytes.size() == 8 + n + 8);
}

TEST_CASE("a write leaves no temporary file and replaces the old checkpoint") {
  TempDir dir;
  TensorFile f;
  f.tensors["x"] = Tensor::scalar(f64, 1);
  writeSafetensors(dir.file("c.safetensors"), f);
  f.tensors["x"] = Tensor::scalar(f64, 2);
  writeSafetensors(dir.file("c.safetensors"), f);
  CHECK(readSafetensors(dir.file("c.safetensors")).tensors.at("x").item() == 2);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);
}

TEST_CASE("corrupt files are refused with the reason") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  auto errorFor = [&](const std::string& bytes) {
    writeAll(path, bytes);
    return errorOf([&] { readSafetensors(path); });
  };
  CHECK(contains(errorFor("abc"), "shorter than the 8-byte header length"));
  CHECK(contains(errorFor(header("{\"a\":1") ), "not valid JSON"));
  CHECK(contains(errorFor(std::string(8, '\xff')), "does not fit"));
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}") + "1234"),
                 "outside"));
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}") + "12345678"),
                 "needs 12 bytes"));
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}") + "12345678"),
                 "unsupported dtype"));
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}") + "12345678"),
                 "has no field 'data_offsets'"));
  CHECK(contains(errorFor(header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}") +
                          std::string(12, 'x')),
                 "overlap"));
  CHECK(contains(errorOf([&] { readSafetensors(dir.file("missing.safetensors")); }), "cannot open"));
}

TEST_CASE("a header of deeply nested arrays is refused naming the file, before anything recurses over it") {
  TempDir dir;
  const std::string path = dir.file("nested.safetensors");
  const int levels = 100000;  // 200 KB, under the header limit; printing it would overflow the stack
  writeAll(path, header(std::string(levels, '[') + std::string(levels, ']')));
  const std::string e = errorOf([&] { readSafetensors(path); });
  CHECK(contains(e, path));
  CHECK(contains(e, fmt::format("nests arrays or objects deeper than {} levels (at byte {})", kMaxJsonDepth,
                                8 + kMaxJsonDepth)));
  // As deep as allowed, it gets as far as the check that the header is an object.
  writeAll(path, header(std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']')));
  CHECK(contains(errorOf([&] { readSafetensors(path); }), "not a JSON object"));
}

TEST_CASE("JSON nesting is counted outside strings only") {
  CHECK_FALSE(jsonNestingBeyond(R"({"a":[1,{"b":"[[[{{{"}]})", 3));
  CHECK(jsonNestingBeyond(R"({"a":[1,{"b":[]}]})", 3) == 13u);
  CHECK_FALSE(jsonNestingBeyond(R"(["\\",["\"[["]])", 2));  // an escaped quote does not end the string
  CHECK(jsonNestingBeyond(R"(["\\",[["]]])", 2) == 7u);    // the quote after an escaped backslash does
  CHECK_FALSE(jsonNestingBeyond("]]]]][[", 2));               // closers do not lend depth
}

TEST_CASE("a checkpoint restores variables and the random step") {
  TempDir dir;
  Graph g;
  Output w = g.variable("w", f32, {3}, Initializer::normal(0, 1));
  Node* bump = assignAdd(w, g.constant(Tensor::full(f32, {3}, 1)));
  const Output dropped = dropout(w, 0.5, 1);
  Session s(g);
  s.run({dropped}, {}, {bump});
  s.run({dropped}, {}, {bump});
  s.run(bump);  // draws nothing: the random step stays at 2
  const std::vector<double> saved = s.variable("w").toDoubles();
  saveCheckpoint(s, dir.file("c.safetensors"), {{"note", "hi"}});
  s.run({dropped}, {}, {bump});

  Session fresh(g);
  const auto meta = restoreCheckpoint(fresh, dir.file("c.safetensors"));
  CHECK(meta.at("note") == "hi");
  CHECK(fresh.variable("w").toDoubles() == saved);
  CHECK(fresh.step() == 2);
}

TEST_CASE("a variable the session holds a shard of is saved whole, and restored as its elements") {
  TempDir dir;
  Graph g;
  g.variable("w", f32, {2, 3}, Initializer::zeros());
  g.shardVariable(g.find("w"), 2, 3);
  Session s(g);
  CHECK(s.variable("w").shape() == Shape{3});
  CHECK(contains(errorOf([&] { saveCheckpoint(s, dir.file("c.safetensors")); }),
                 "the session holds a shard of 'w', and its whole value was not given"));
  CHECK(contains(errorOf([&] {
          saveCheckpoint(s, dir.file("c.safetensors"), {}, {{"w", Tensor::full(f32, {3}, 1)}});
        }),
        "the whole value given for 'w' is f32[3], the variable is f32[2, 3]"));
  const Tensor whole = Tensor::fromVector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  saveCheckpoint(s, dir.file("c.safetensors"), {}, {{"w", whole}});
  CHECK(readSafetensors(dir.file("c.safetensors")).tensors.at("w").toDoubles() == whole.toDoubles());

  Session fresh(g);
  WholeValues wholes;
  restoreCheckpoint(fresh, dir.file("c.safetensors"), &wholes);
  CHECK(fresh.variable("w").toDoubles() == std::vector<double>{2, 3, 4});
  CHECK(wholes.at("w").toDoubles() == whole.toDoubles());
}

TEST_CASE("a checkpoint of another model is refused, naming every difference, and changes nothing") {
  TempDir dir;
  {
    Graph g;
    g.variable("w", f32, {3}, Initializer::zeros());
    g.variable("old", f32, {1}, Initializer::zeros());
    Session s(g);
    saveCheckpoint(s, dir.file("c.safetensors"));
  }
  Graph g;
  g.variable("w", f32, {4}, Initializer::constant(7));
  g.variable("new", f32, {1}, Initializer::zeros());
  Session s(g);
  const std::string msg = errorOf([&] { restoreCheckpoint(s, dir.file("c.safetensors")); });
  CHECK(contains(msg, "'w' is f32[4] in the model but f32[3] in the checkpoint"));
  CHECK(contains(msg, "'new' is missing"));
  CHECK(contains(msg, "'old' is not a variable of the model"));
  CHECK(s.variable("w").at(0) == 7);
}

TEST_CASE("restoring needs a checksum of every tensor and a valid session step") {
  TempDir dir;
  Graph g;
  g.variable("w", f32, {2}, Initializer::constant(3));
  Session s(g);
  const std::string path = dir.file("c.safetensors");
  // A safetensors file of another tool: no checksums.
  writeAll(path,
           header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"session_step":"0"}})") +
               std::string(8, '\0'));
  CHECK(readSafetensors(path).tensors.count("w") == 1);
  CHECK(contains(errorOf([&] { restoreCheckpoint(s, path); }), "no checksum"));
  for (const std::string step : {"x12", "-1", ""}) {
    CAPTURE(step);
    saveCheckpoint(s, path);
    TensorFile f = readSafetensors(path);
    f.metadata["session_step"] = step;
    writeSafetensors(path, f);
    CHECK(contains(errorOf([&] { restoreCheckpoint(s, path); }), "metadata field 'session_step' is"));
  }
  CHECK(s.variable("w").at(0) == 3);
}

TEST_CASE("a batch position at the end of int64 is refused, not wrapped") {
  std::vector<data::Example> examples;
  for (int i = 0; i < 6; ++i) examples.push_back({{"x", Tensor::scalar(f32, i)}});
  data::Batcher batches(data::Dataset(examples), {2, true, 1, {}, 0, 0, {}});
  batches.seek(std::numeric_limits<int64_t>::max() - 1);
  batches.next();
  CHECK(contains(errorOf([&] { batches.next(); }), "batch position 9223372036854775807"));
}

TEST_CASE("the data hash covers the examples' values, fields, dtypes and shapes") {
  auto hashOf = [](const std::vector<data::Example>& examples) { return data::Dataset(examples).hash(); };
  const uint64_t base = hashOf({{{"x", Tensor::fromVector<float>({1, 2}, {2})}}});
  CHECK(hashOf({{{"x", Tensor::fromVector<float>({1, 2}, {2})}}}) == base);
  CHECK(hashOf({{{"x", Tensor::fromVector<float>({1, 3}, {2})}}}) != base);
  CHECK(hashOf({{{"y", Tensor::fromVector<float>({1, 2}, {2})}}}) != base);
  CHECK(hashOf({{{"x", Tensor::fromVector<float>({1, 2}, {1, 2})}}}) != base);
  CHECK(hashOf({{{"x", Tensor::fromVector<int32_t>({1, 2}, {2})}}}) != base);
}
