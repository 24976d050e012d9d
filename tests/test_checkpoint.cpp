// Checkpoints: the safetensors round trip, atomic writes, refusal of corrupt files and of
// checkpoints that do not match the model.
#include "tests/TestUtil.h"

#include "core/Checkpoint.h"
#include "ops/Ops.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

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

}  // namespace

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
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}") + "1234"), "outside"));
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}") + "12345678"), "needs 12 bytes"));
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}") + "12345678"), "unsupported dtype"));
  CHECK(contains(errorFor(header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}") + "12345678"), "malformed"));
  CHECK(contains(errorFor(header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}") + std::string(12, 'x')),
                 "overlap"));
  CHECK(contains(errorOf([&] { readSafetensors(dir.file("missing.safetensors")); }), "cannot open"));
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
