#include "core/Checkpoint.h"

#include "core/Hash.h"
#include "core/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace weft {
namespace {

namespace fs = std::filesystem;

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

constexpr uint64_t kMaxHeader = 100u << 20;  // a header beyond 100 MiB is corrupt, not large
const std::string kChecksumPrefix = "xxh64:";  // metadata "xxh64:NAME": XXH64 of tensor NAME's bytes
const std::string kMetadataKey = "__metadata__";
const std::string kTemporaryInfix = ".tmp-";

bool isChecksumKey(const std::string& key) { return key.rfind(kChecksumPrefix, 0) == 0; }

/// XXH64 of the metadata other than the checksums, key and value each with its terminating NUL.
uint64_t metadataChecksum(const std::map<std::string, std::string>& metadata) {
  uint64_t h = 0;
  for (const auto& [key, value] : metadata) {
    if (isChecksumKey(key)) continue;
    h = xxh64(key.c_str(), key.size() + 1, h);
    h = xxh64(value.c_str(), value.size() + 1, h);
  }
  return h;
}

std::string systemError() { return std::strerror(errno); }

/// A JSON value for a message, shortened.
std::string shown(const nlohmann::json& value) {
  std::string s = value.dump();
  return s.size() > 64 ? s.substr(0, 61) + "..." : s;
}

// ---- writing ------------------------------------------------------------------------------------

/// A temporary file beside the target, created exclusively; removed unless committed.
class Temporary {
 public:
  explicit Temporary(const std::string& target) : target_(target) {
    for (int n = 0;; ++n) {
      path_ = fmt::format("{}{}{}-{}", target, kTemporaryInfix, ::getpid(), n);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd_ >= 0) return;
      if (errno != EEXIST || n == 99)
        WEFT_THROW("cannot write checkpoint {}: cannot create {}: {}", target, path_, systemError());
    }
  }
  ~Temporary() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;

  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("writing", n == 0 ? "no progress" : systemError());
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  }

  /// fsync, close, rename over the target, fsync the directory.
  void commit() {
    if (::fsync(fd_) != 0) fail("fsync of", systemError());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing", systemError());
    if (::rename(path_.c_str(), target_.c_str()) != 0) fail("renaming", systemError());
    committed_ = true;
    const fs::path parent = fs::path(target_).parent_path();
    const std::string dir = parent.empty() ? "." : parent.string();
    const int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirFd < 0)
      WEFT_THROW("cannot write checkpoint {}: cannot open its directory {} to fsync it: {}", target_, dir,
                 systemError());
    const bool synced = ::fsync(dirFd) == 0;
    const std::string reason = synced ? "" : systemError();
    ::close(dirFd);
    WEFT_CHECK(synced, "cannot write checkpoint {}: fsync of its directory {} failed: {}", target_, dir, reason);
  }

 private:
  [[noreturn]] void fail(const char* what, const std::string& reason) const {
    WEFT_THROW("cannot write checkpoint {}: {} {} failed: {} (the previous checkpoint, if any, is unchanged)", target_,
               what, path_, reason);
  }

  std::string target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

// ---- reading ------------------------------------------------------------------------------------

/// A header entry, validated.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

Entry parseEntry(const std::string& path, const std::string& name, const nlohmann::json& e, uint64_t dataSize) {
  const std::string where = fmt::format("checkpoint {} is corrupt: the header entry of tensor '{}'", path, name);
  WEFT_CHECK(e.is_object(), "{} is {}, not an object", where, shown(e));
  for (const auto& [key, value] : e.items()) {
    WEFT_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", "{} has an unknown field '{}' ({})", where,
               key, shown(value));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"})
    WEFT_CHECK(e.contains(key), "{} has no field '{}'", where, key);

  Entry out{name, DType::F32, {}, 0, 0};
  const nlohmann::json& dtype = e["dtype"];
  bool known = false;
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16, DType::F16}) {
    if (dtype.is_string() && dtype.get<std::string>() == safetensorsDType(t)) {
      out.dtype = t;
      known = true;
    }
  }
  // The other safetensors dtypes make a valid file that weft cannot hold (PyTorch's bool buffers, say).
  static const std::set<std::string> kForeign{"BOOL", "U8",  "I8",      "U16",     "I16",
                                              "U32",  "U64", "F8_E4M3", "F8_E5M2", "C64"};
  WEFT_CHECK(known || !dtype.is_string() || !kForeign.count(dtype.get<std::string>()),
             "checkpoint {}: tensor '{}' has dtype {}, which weft does not support (F32, F64, I32, I64, BF16, F16)",
             path, name, dtype.get<std::string>());
  WEFT_CHECK(known, "{}: field 'dtype' is {}, an unsupported dtype (F32, F64, I32, I64, BF16, F16)", where,
             shown(dtype));

  const nlohmann::json& shape = e["shape"];
  WEFT_CHECK(shape.is_array(), "{}: field 'shape' is {}, not an array", where, shown(shape));
  for (const nlohmann::json& d : shape) {
    const bool valid = d.is_number_unsigned()
                           ? d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                           : d.is_number_integer() && d.get<int64_t>() >= 0;
    WEFT_CHECK(valid, "{}: field 'shape' {} has dimension {}, not an integer in [0, 2^63)", where, shown(shape),
               shown(d));
    out.shape.dims().push_back(d.get<int64_t>());
  }
  uint64_t bytes = 0;
  try {
    bytes = out.shape.bytes(dtypeSize(out.dtype));
  } catch (const Error& err) {
    WEFT_THROW("{}: field 'shape': {}", where, err.what());
  }

  const nlohmann::json& offsets = e["data_offsets"];
  WEFT_CHECK(
      offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
      "{}: field 'data_offsets' is {}, not two byte offsets", where, shown(offsets));
  out.begin = offsets[0].get<uint64_t>();
  out.end = offsets[1].get<uint64_t>();
  WEFT_CHECK(out.begin <= out.end && out.end <= dataSize,
             "{}: field 'data_offsets' {} is a byte range outside the {} data bytes", where, shown(offsets), dataSize);
  WEFT_CHECK(out.end - out.begin == bytes, "{}: {}{} needs {} bytes, field 'data_offsets' {} holds {}", where,
             dtypeName(out.dtype), out.shape.str(), bytes, shown(offsets), out.end - out.begin);
  return out;
}

/// The byte ranges must cover the data exactly once (the safetensors rule against polyglot files).
void checkCoverage(const std::string& path, std::vector<Entry>& entries, uint64_t dataSize) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    WEFT_CHECK(e.begin >= covered, "checkpoint {} is corrupt: tensors '{}' and '{}' overlap at byte {}", path,
               previous ? previous->name : "", e.name, e.begin);
    WEFT_CHECK(e.begin == covered, "checkpoint {} is corrupt: data bytes {} to {} belong to no tensor", path, covered,
               e.begin);
    covered = e.end;
    previous = &e;
  }
  WEFT_CHECK(covered == dataSize, "checkpoint {} is corrupt: data bytes {} to {} belong to no tensor", path, covered,
             dataSize);
}

/// Checks the recorded checksums and takes them out of the metadata.
void verifyChecksums(const std::string& path, TensorFile& file, Checksums required) {
  std::map<std::string, std::string> recorded;
  for (auto it = file.metadata.begin(); it != file.metadata.end();) {
    if (!isChecksumKey(it->first)) {
      ++it;
      continue;
    }
    recorded[it->first.substr(kChecksumPrefix.size())] = it->second;
    it = file.metadata.erase(it);
  }
  for (const auto& [name, value] : recorded) {
    uint64_t actual = 0;
    if (name == kMetadataKey) {
      actual = metadataChecksum(file.metadata);
    } else {
      auto t = file.tensors.find(name);
      WEFT_CHECK(t != file.tensors.end(),
                 "checkpoint {} is corrupt: metadata field '{}{}' is the checksum of a tensor it does not hold", path,
                 kChecksumPrefix, name);
      actual = xxh64(t->second.raw(), t->second.bytes());
    }
    WEFT_CHECK(value == hex64(actual),
               "checkpoint {} is corrupt: {} has checksum {}, but metadata field '{}{}' records '{}'", path,
               name == kMetadataKey ? std::string("the metadata") : "tensor '" + name + "'", hex64(actual),
               kChecksumPrefix, name, value);
  }
  if (required == Checksums::Required) {
    WEFT_CHECK(recorded.count(kMetadataKey), "checkpoint {} has no checksum of its metadata (metadata field '{}{}')",
               path, kChecksumPrefix, kMetadataKey);
    for (const auto& [name, t] : file.tensors) {
      WEFT_CHECK(recorded.count(name), "checkpoint {} has no checksum of tensor '{}' (metadata field '{}{}')", path,
                 name, kChecksumPrefix, name);
    }
  }
}

/// The process id of a temporary file name "TARGET.tmp-PID" or "TARGET.tmp-PID-N", or 0.
pid_t temporaryOwner(const std::string& name, const std::string& target) {
  const std::string prefix = target + kTemporaryInfix;
  if (name.rfind(prefix, 0) != 0) return 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  pid_t pid = 0;
  auto [p, ec] = std::from_chars(first, last, pid);
  if (ec != std::errc() || pid <= 0) return 0;
  if (p != last) {
    unsigned n = 0;
    auto [q, ec2] = std::from_chars(p + 1, last, n);
    if (*p != '-' || ec2 != std::errc() || q != last) return 0;
  }
  return pid;
}

}  // namespace

void writeSafetensors(const std::string& path, const TensorFile& file) {
  std::map<std::string, std::string> metadata = file.metadata;
  for (const auto& [key, value] : metadata) {
    WEFT_CHECK(!isChecksumKey(key), "cannot write checkpoint {}: metadata key '{}' is reserved for checksums", path,
               key);
  }
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    WEFT_CHECK(name != kMetadataKey, "cannot write checkpoint {}: '{}' is not a tensor name safetensors allows", path,
               name);
    WEFT_CHECK(t.device().type == DeviceType::CPU, "cannot write checkpoint {}: tensor '{}' is on {}, not the host",
               path, name, t.device().str());
    header[name] = {{"dtype", safetensorsDType(t.dtype())},
                    {"shape", t.shape().dims()},
                    {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
    metadata[kChecksumPrefix + name] = hex64(xxh64(t.raw(), t.bytes()));
  }
  metadata[kChecksumPrefix + kMetadataKey] = hex64(metadataChecksum(metadata));
  header[kMetadataKey] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i)
    prefix[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  Temporary temp(path);
  temp.write(prefix.data(), prefix.size());
  temp.write(text.data(), text.size());
  for (const auto& [name, t] : file.tensors) temp.write(t.raw(), t.bytes());
  temp.commit();
}

TensorFile readSafetensors(const std::string& path, Checksums checksums) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  WEFT_CHECK(fs::exists(status), "cannot open checkpoint {}: {}", path, ec ? ec.message() : "no such file");
  WEFT_CHECK(fs::is_regular_file(status), "cannot open checkpoint {}: not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in.good(), "cannot open checkpoint {}: {}", path, systemError());
  const uint64_t fileSize = fs::file_size(path, ec);
  WEFT_CHECK(!ec, "cannot open checkpoint {}: {}", path, ec.message());
  WEFT_CHECK(fileSize >= 8, "checkpoint {} is corrupt: {} bytes, shorter than the 8-byte header length", path,
             fileSize);
  unsigned char prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  uint64_t headerSize = 0;
  for (int i = 7; i >= 0; --i) headerSize = (headerSize << 8) | prefix[i];
  WEFT_CHECK(in.good() && headerSize <= kMaxHeader && headerSize <= fileSize - 8,
             "checkpoint {} is corrupt: header length {} does not fit a file of {} bytes", path, headerSize, fileSize);
  std::string text(headerSize, '\0');
  in.read(text.data(), static_cast<std::streamsize>(headerSize));
  WEFT_CHECK(in.good(), "checkpoint {}: reading its header failed", path);
  // nlohmann::json takes a NUL for the end of its input; the padding safetensors allows is spaces.
  const size_t nul = text.find('\0');
  WEFT_CHECK(nul == std::string::npos, "checkpoint {} is corrupt: its header holds a NUL byte at offset {}", path,
             8 + nul);
  if (const auto at = jsonNestingBeyond(text, kMaxJsonDepth))
    WEFT_THROW("checkpoint {} is corrupt: its header nests arrays or objects deeper than {} levels (at byte {})", path,
               kMaxJsonDepth, 8 + *at);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    WEFT_THROW("checkpoint {} is corrupt: its header is not valid JSON ({})", path, e.what());
  }
  WEFT_CHECK(header.is_object(), "checkpoint {} is corrupt: its header is {}, not a JSON object", path, shown(header));
  const uint64_t dataSize = fileSize - 8 - headerSize;

  TensorFile file;
  std::vector<Entry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name != kMetadataKey) {
      entries.push_back(parseEntry(path, name, entry, dataSize));
      continue;
    }
    WEFT_CHECK(entry.is_object(), "checkpoint {} is corrupt: field '{}' is {}, not an object", path, kMetadataKey,
               shown(entry));
    for (const auto& [key, value] : entry.items()) {
      WEFT_CHECK(value.is_string(), "checkpoint {} is corrupt: metadata field '{}' is {}, not a string", path, key,
                 shown(value));
      file.metadata[key] = value.get<std::string>();
    }
  }
  checkCoverage(path, entries, dataSize);
  // Every size is now known to fit the file, so nothing below allocates more than it holds.
  for (const Entry& e : entries) {
    Tensor t(e.dtype, e.shape);
    in.seekg(static_cast<std::streamoff>(8 + headerSize + e.begin));
    in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.bytes()));
    WEFT_CHECK(in.good(), "checkpoint {}: reading tensor '{}' failed", path, e.name);
    file.tensors[e.name] = std::move(t);
  }
  verifyChecksums(path, file, checksums);
  return file;
}

RemovedFiles removeStaleTemporaries(const std::string& path) {
  RemovedFiles removed;
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const pid_t owner = temporaryOwner(entry.path().filename().string(), target.filename().string());
    if (owner == 0) continue;
    // A running process other than this one may be saving: its file is not stale.
    if (owner != ::getpid() && (::kill(owner, 0) == 0 || errno == EPERM)) continue;
    std::error_code sizeError;
    const uint64_t bytes = entry.is_regular_file(sizeError) ? entry.file_size(sizeError) : 0;
    if (fs::remove(entry.path(), sizeError)) {
      ++removed.files;
      removed.bytes += sizeError ? 0 : bytes;
    }
  }
  return removed;
}

void copyShardOf(const Node& variable, const Tensor& whole, Tensor& shard) {
  const int64_t offset = Graph::shardOffsetOf(variable);
  WEFT_CHECK(whole.shape() == Graph::wholeShapeOf(variable) && whole.dtype() == shard.dtype() &&
                 offset + shard.numel() <= whole.numel(),
             "the whole value of shard '{}' is {}{}, not {}{}", variable.name, dtypeName(whole.dtype()),
             whole.shape().str(), dtypeName(shard.dtype()), Graph::wholeShapeOf(variable).str());
  const Tensor host = whole.to(cpu());
  Tensor part(shard.dtype(), shard.shape());
  std::memcpy(part.raw(),
              static_cast<const uint8_t*>(host.raw()) + offset * static_cast<int64_t>(dtypeSize(host.dtype())),
              part.bytes());
  shard.copyFrom(part);
}

void saveCheckpoint(Session& session, const std::string& path, std::map<std::string, std::string> metadata,
                    const WholeValues& wholes) {
  TensorFile file;
  for (Node* v : session.graph().variables()) {
    if (!Graph::isShard(*v)) {
      file.tensors[v->name] = session.variable(v).to(cpu());
      continue;
    }
    const auto whole = wholes.find(v->name);
    WEFT_CHECK(whole != wholes.end(), "saving checkpoint {}: the session holds a shard of '{}', and its whole value "
               "was not given", path, v->name);
    WEFT_CHECK(whole->second.shape() == Graph::wholeShapeOf(*v) && whole->second.dtype() == v->outputs[0].dtype,
               "saving checkpoint {}: the whole value given for '{}' is {}{}, the variable is {}{}", path, v->name,
               dtypeName(whole->second.dtype()), whole->second.shape().str(), dtypeName(v->outputs[0].dtype),
               Graph::wholeShapeOf(*v).str());
    file.tensors[v->name] = whole->second.to(cpu());
  }
  file.metadata = std::move(metadata);
  file.metadata["session_step"] = std::to_string(session.step());
  writeSafetensors(path, file);
}

std::map<std::string, std::string> restoreCheckpoint(Session& session, const std::string& path, WholeValues* wholes) {
  TensorFile file = readSafetensors(path, Checksums::Required);
  std::vector<std::string> problems;
  std::map<std::string, bool> used;
  for (Node* v : session.graph().variables()) {
    const Tensor& current = session.variable(v);
    const Shape shape = Graph::wholeShapeOf(*v);
    auto it = file.tensors.find(v->name);
    if (it == file.tensors.end()) {
      problems.push_back(fmt::format("variable '{}' is missing", v->name));
    } else if (it->second.dtype() != current.dtype() || it->second.shape() != shape) {
      problems.push_back(fmt::format("variable '{}' is {}{} in the model but {}{} in the checkpoint", v->name,
                                     dtypeName(current.dtype()), shape.str(), dtypeName(it->second.dtype()),
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
  const int64_t step = metadataInteger(file.metadata, path, "session_step", 0);
  for (Node* v : session.graph().variables()) {
    const Tensor& value = file.tensors.at(v->name);
    if (!Graph::isShard(*v)) {
      session.variable(v).copyFrom(value);
      continue;
    }
    copyShardOf(*v, value, session.variable(v));
    if (wholes) (*wholes)[v->name] = value;
  }
  session.setStep(static_cast<uint64_t>(step));
  return file.metadata;
}

int64_t metadataInteger(const std::map<std::string, std::string>& metadata, const std::string& path,
                        const std::string& key, int64_t min, int64_t max) {
  auto it = metadata.find(key);
  WEFT_CHECK(it != metadata.end(), "checkpoint {} has no metadata field '{}'", path, key);
  const std::string& text = it->second;
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  WEFT_CHECK(ec == std::errc() && end == text.data() + text.size() && !text.empty(),
             "checkpoint {}: metadata field '{}' is '{}', not an integer", path, key, text);
  WEFT_CHECK(value >= min && value <= max, "checkpoint {}: metadata field '{}' is {}, outside [{}, {}]", path, key,
             value, min, max);
  return value;
}

std::vector<std::string> settingDifferences(const std::map<std::string, std::string>& settings,
                                            const std::map<std::string, std::string>& metadata,
                                            const std::function<std::string(const std::string& key)>& describe) {
  std::vector<std::string> differences;
  for (const auto& [key, now] : settings) {
    auto it = metadata.find(key);
    if (it == metadata.end()) {
      differences.push_back(fmt::format("{}: not recorded in the checkpoint, {} now", describe(key), now));
    } else if (it->second != now) {
      differences.push_back(fmt::format("{}: {} in the checkpoint, {} now", describe(key), it->second, now));
    }
  }
  for (const auto& [key, value] : metadata)
    if (key.rfind("run.", 0) == 0 && !settings.count(key))
      differences.push_back(fmt::format("{}: {} in the checkpoint, not a setting now", describe(key), value));
  return differences;
}

}  // namespace weft
