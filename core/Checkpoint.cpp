#include "core/Checkpoint.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace weft {
namespace {

const char* safetensorsDType(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

DType parseSafetensorsDType(const std::string& s, const std::string& path, const std::string& name) {
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16, DType::F16}) {
    if (s == safetensorsDType(t)) return t;
  }
  WEFT_THROW("checkpoint {}: tensor '{}' has unsupported dtype '{}'", path, name, s);
}

constexpr uint64_t kMaxHeader = 100u << 20;  // a header beyond 100 MiB is corrupt, not large

}  // namespace

void writeSafetensors(const std::string& path, const TensorFile& file) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    header[name] = {{"dtype", safetensorsDType(t.dtype())}, {"shape", t.shape().dims()}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  const uint64_t size = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(size >> (8 * i));

  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    WEFT_CHECK(out.good(), "cannot write checkpoint {}: cannot open {}", path, temp);
    out.write(reinterpret_cast<const char*>(prefix), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : file.tensors) out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.bytes()));
    out.flush();
    WEFT_CHECK(out.good(), "cannot write checkpoint {}: write to {} failed", path, temp);
  }
  if (FILE* f = std::fopen(temp.c_str(), "rb+")) {  // the data must be on disk before the rename
    ::fsync(::fileno(f));
    std::fclose(f);
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::filesystem::remove(temp);
    WEFT_THROW("cannot write checkpoint {}: rename failed: {}", path, ec.message());
  }
}

TensorFile readSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in.good(), "cannot open checkpoint {}", path);
  in.seekg(0, std::ios::end);
  const auto fileSize = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  WEFT_CHECK(fileSize >= 8, "checkpoint {} is corrupt: {} bytes, shorter than the 8-byte header length", path, fileSize);
  unsigned char prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  uint64_t headerSize = 0;
  for (int i = 7; i >= 0; --i) headerSize = (headerSize << 8) | prefix[i];
  WEFT_CHECK(headerSize <= kMaxHeader && 8 + headerSize <= fileSize,
             "checkpoint {} is corrupt: header length {} does not fit a file of {} bytes", path, headerSize, fileSize);
  std::string text(headerSize, '\0');
  in.read(text.data(), static_cast<std::streamsize>(headerSize));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    WEFT_THROW("checkpoint {} is corrupt: its header is not valid JSON ({})", path, e.what());
  }
  WEFT_CHECK(header.is_object(), "checkpoint {} is corrupt: its header is not a JSON object", path);
  const uint64_t dataSize = fileSize - 8 - headerSize;

  TensorFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, v] : entry.items()) file.metadata[k] = v.get<std::string>();
        continue;
      }
      const DType dtype = parseSafetensorsDType(entry.at("dtype").get<std::string>(), path, name);
      const std::vector<int64_t> dims = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      const Shape shape(dims);
      WEFT_CHECK(shape.isFullyDefined(), "checkpoint {}: tensor '{}' has invalid shape {}", path, name, shape.str());
      WEFT_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1] && offsets[1] <= dataSize,
                 "checkpoint {} is corrupt: tensor '{}' has byte range outside the {} data bytes", path, name, dataSize);
      const uint64_t expected = static_cast<uint64_t>(shape.numel()) * dtypeSize(dtype);
      WEFT_CHECK(offsets[1] - offsets[0] == expected, "checkpoint {} is corrupt: tensor '{}' of {}{} needs {} bytes, has {}",
                 path, name, dtypeName(dtype), shape.str(), expected, offsets[1] - offsets[0]);
      ranges.emplace_back(offsets[0], offsets[1]);
      Tensor t(dtype, shape);
      in.seekg(static_cast<std::streamoff>(8 + headerSize + offsets[0]));
      in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.bytes()));
      WEFT_CHECK(in.good() || t.bytes() == 0, "checkpoint {}: reading tensor '{}' failed", path, name);
      file.tensors[name] = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    WEFT_THROW("checkpoint {} is corrupt: malformed header entry ({})", path, e.what());
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    WEFT_CHECK(ranges[i].first >= ranges[i - 1].second, "checkpoint {} is corrupt: tensors overlap at byte {}", path, ranges[i].first);
  }
  return file;
}

void saveCheckpoint(Session& session, const std::string& path, std::map<std::string, std::string> metadata) {
  TensorFile file;
  for (Node* v : session.graph().variables()) file.tensors[v->name] = session.variable(v).to(cpu());
  file.metadata = std::move(metadata);
  file.metadata["session_step"] = std::to_string(session.step());
  writeSafetensors(path, file);
}

std::map<std::string, std::string> restoreCheckpoint(Session& session, const std::string& path) {
  TensorFile file = readSafetensors(path);
  std::vector<std::string> problems;
  std::map<std::string, bool> used;
  for (Node* v : session.graph().variables()) {
    const Tensor& current = session.variable(v);
    auto it = file.tensors.find(v->name);
    if (it == file.tensors.end()) {
      problems.push_back(fmt::format("variable '{}' is missing", v->name));
    } else if (it->second.dtype() != current.dtype() || it->second.shape() != current.shape()) {
      problems.push_back(fmt::format("variable '{}' is {}{} in the model but {}{} in the checkpoint", v->name,
                                     dtypeName(current.dtype()), current.shape().str(), dtypeName(it->second.dtype()),
                                     it->second.shape().str()));
    }
    used[v->name] = true;
  }
  for (const auto& [name, t] : file.tensors) {
    if (!used.count(name)) problems.push_back(fmt::format("'{}' is not a variable of the model", name));
  }
  if (!problems.empty()) {
    std::string all;
    for (const std::string& p : problems) all += "\n  " + p;
    WEFT_THROW("checkpoint {} does not match the model:{}", path, all);
  }
  for (Node* v : session.graph().variables()) session.variable(v).copyFrom(file.tensors.at(v->name));
  auto step = file.metadata.find("session_step");
  if (step != file.metadata.end()) session.setStep(std::stoull(step->second));
  return file.metadata;
}

}  // namespace weft
