// Parsing and validation of the resource specification. Every error names the source and the
// JSON path of the offending value, because a cluster file is edited by hand.
#include "dist/launch/ResourceSpec.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/InputFile.h"
#include "core/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <limits>
#include <set>

namespace weft::dist {
namespace {

using nlohmann::json;

/// A JSON value as a message shows it: compact, cut short, escaped.
std::string shown(const json& value) { return escapeBytes(value.dump(-1, ' ', false, json::error_handler_t::replace)); }

bool isAddressCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
         c == '_' || c == ':' || c == '%';
}

/// Why `address` is not a host name, an IPv4 or IPv6 address (optionally "user@" before it),
/// or "" when it is one. Nothing in it may start like an option or need quoting.
std::string addressProblem(const std::string& address) {
  const size_t at = address.find('@');
  const std::string user = at == std::string::npos ? "" : address.substr(0, at);
  const std::string host = at == std::string::npos ? address : address.substr(at + 1);
  if (address.size() > 255) return fmt::format("is {} bytes long; a host address has at most 255", address.size());
  if (at != std::string::npos && user.empty()) return "has an empty user name before '@'";
  if (host.empty()) return "names no host";
  if (user.starts_with('-') || host.starts_with('-')) return "starts with '-', which ssh would take for an option";
  for (const char c : user) {
    if (!isAddressCharacter(c) || c == ':' || c == '%')
      return fmt::format("has '{}' in its user name", escapeBytes({&c, 1}));
  }
  for (const char c : host) {
    if (!isAddressCharacter(c)) {
      return fmt::format("has '{}', which is not in a host name or an IP address", escapeBytes({&c, 1}));
    }
  }
  return "";
}

// The validator of one document: remembers the source name for its messages.
class SpecParser {
 public:
  explicit SpecParser(std::string source) : source_(std::move(source)) {}

  void checkKeys(const json& object, const std::string& path, const std::set<std::string>& allowed) const {
    for (const auto& [key, value] : object.items()) {
      if (allowed.count(key)) continue;
      std::string list;
      for (const std::string& k : allowed) list += (list.empty() ? "" : ", ") + k;
      fail("{}unknown key '{}' (allowed: {})", path.empty() ? "" : path + ": ", escapeBytes(key), list);
    }
  }

  void checkObject(const json& value, const std::string& path) const {
    if (!value.is_object()) fail("{} must be an object, got {}", path, shown(value));
  }

  int integer(const json& value, const std::string& path) const {
    if (!value.is_number_integer()) fail("{} must be an integer, got {}", path, shown(value));
    const auto v = value.get<int64_t>();
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      fail("{} is {}, out of range", path, v);
    return static_cast<int>(v);
  }

  std::string nonEmptyString(const json& value, const std::string& path) const {
    if (!value.is_string()) fail("{} must be a string, got {}", path, shown(value));
    std::string s = value.get<std::string>();
    if (s.empty()) fail("{} is empty", path);
    return s;
  }

  std::string address(const json& value, const std::string& path) const {
    std::string s = nonEmptyString(value, path);
    const std::string problem = addressProblem(s);
    if (!problem.empty()) fail("{} '{}' {}", path, escapeBytes(s), problem);
    return s;
  }

  HostSpec host(const json& value, const std::string& path) const {
    checkObject(value, path);
    checkKeys(value, path, {"address", "cpu_workers", "gpus", "servers", "launch_prefix"});
    if (!value.contains("address")) fail("{}.address is missing", path);
    HostSpec host;
    host.address = address(value["address"], path + ".address");
    const bool hasCpu = value.contains("cpu_workers"), hasGpus = value.contains("gpus");
    if (hasCpu == hasGpus) {
      fail("{} has {}; give exactly one of cpu_workers or gpus", path,
           hasCpu ? "both cpu_workers and gpus" : "neither cpu_workers nor gpus");
    }
    if (hasCpu) {
      host.cpuWorkers = integer(value["cpu_workers"], path + ".cpu_workers");
      if (host.cpuWorkers < 1) fail("{}.cpu_workers is {}; it must be >= 1", path, host.cpuWorkers);
    } else {
      host.gpus = gpus(value["gpus"], path + ".gpus");
    }
    if (value.contains("servers")) {
      host.servers = integer(value["servers"], path + ".servers");
      if (host.servers < 0) fail("{}.servers is {}; it must be >= 0", path, host.servers);
    }
    if (value.contains("launch_prefix")) {
      const json& prefix = value["launch_prefix"];
      if (!prefix.is_array() || prefix.empty()) fail("{}.launch_prefix must be a non-empty array of strings", path);
      for (size_t i = 0; i < prefix.size(); ++i)
        host.launchPrefix.push_back(nonEmptyString(prefix[i], fmt::format("{}.launch_prefix[{}]", path, i)));
    }
    return host;
  }

  std::vector<int> gpus(const json& value, const std::string& path) const {
    if (!value.is_array()) fail("{} must be an array of GPU indices, got {}", path, shown(value));
    if (value.empty()) fail("{} is empty; list at least one GPU", path);
    std::vector<int> out;
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string at = fmt::format("{}[{}]", path, i);
      const int gpu = integer(value[i], at);
      if (gpu < 0) fail("{} is {}", at, gpu);
      out.push_back(gpu);
    }
    return out;
  }

  uint16_t port(const json& value) const {
    const int p = integer(value, "coordinator_port");
    if (p < 0 || p > 65535) fail("coordinator_port is {}; it must be in 0..65535 (0: any free port)", p);
    return static_cast<uint16_t>(p);
  }

  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    WEFT_THROW("{}: {}", source_, fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  std::string source_;
};

}  // namespace

ResourceSpec ResourceSpec::load(const std::string& path) {
  InputFile in(path, "resource specification", kMaxResourceSpecBytes);
  return parse(in.readAll(), in.name());
}

ResourceSpec ResourceSpec::parse(const std::string& text, const std::string& sourceName) {
  const SpecParser p(sourceName);
  if (text.size() > kMaxResourceSpecBytes)
    p.fail("{} bytes; a specification holds at most {}", text.size(), kMaxResourceSpecBytes);
  if (const auto at = jsonNestingBeyond(text, kMaxJsonDepth))
    p.fail("arrays or objects nest deeper than {} levels (at byte {})", kMaxJsonDepth, *at);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    p.fail("not valid JSON ({})", escapeBytes(e.what(), 300));
  }
  if (!doc.is_object()) p.fail("the top level must be an object, got {}", shown(doc));
  p.checkKeys(doc, "", {"hosts", "bind", "coordinator_port", "encrypt"});
  if (!doc.contains("hosts")) p.fail("hosts is missing");
  const json& hosts = doc["hosts"];
  if (!hosts.is_array()) p.fail("hosts must be an array, got {}", shown(hosts));
  if (hosts.empty()) p.fail("hosts is empty; list at least one host");

  ResourceSpec spec;
  for (size_t i = 0; i < hosts.size(); ++i) spec.hosts_.push_back(p.host(hosts[i], fmt::format("hosts[{}]", i)));
  if (doc.contains("bind")) spec.bind_ = p.address(doc["bind"], "bind");
  if (doc.contains("coordinator_port")) spec.coordinatorPort_ = p.port(doc["coordinator_port"]);
  if (doc.contains("encrypt")) {
    if (!doc["encrypt"].is_boolean()) p.fail("encrypt must be true or false, got {}", shown(doc["encrypt"]));
    spec.encrypt_ = doc["encrypt"].get<bool>();
  }
  return spec;
}

std::optional<ResourceSpec> ResourceSpec::fromEnvironment() {
  const char* text = std::getenv(kResourcesVariable);
  if (text == nullptr) return std::nullopt;
  return parse(text, kResourcesVariable);
}

std::string ResourceSpec::toJson() const {
  json hosts = json::array();
  for (const HostSpec& h : hosts_) {
    json host{{"address", h.address}, {"servers", h.servers}};
    if (h.cpuWorkers > 0) host["cpu_workers"] = h.cpuWorkers;
    else host["gpus"] = h.gpus;
    if (!h.launchPrefix.empty()) host["launch_prefix"] = h.launchPrefix;
    hosts.push_back(std::move(host));
  }
  json doc{{"hosts", std::move(hosts)}, {"bind", bind_}, {"coordinator_port", coordinatorPort_}};
  if (encrypt_) doc["encrypt"] = true;
  return doc.dump();
}

ResourceSpec ResourceSpec::localCpu(int workers, int servers) {
  WEFT_CHECK(workers >= 1, "localCpu: workers is {}; it must be >= 1", workers);
  WEFT_CHECK(servers >= 0, "localCpu: servers is {}; it must be >= 0", servers);
  ResourceSpec spec;
  spec.hosts_.push_back(HostSpec{"127.0.0.1", workers, {}, servers, {}});
  return spec;
}

ResourceSpec ResourceSpec::resized(const std::vector<int>& workersPerHost) const {
  WEFT_CHECK(workersPerHost.size() == hosts_.size(), "resized: {} worker counts for {} hosts", workersPerHost.size(),
             hosts_.size());
  ResourceSpec out = *this;
  out.hosts_.clear();
  for (size_t h = 0; h < hosts_.size(); ++h) {
    const int keep = workersPerHost[h];
    WEFT_CHECK(keep >= 0 && keep <= hosts_[h].slots(), "resized: host {} ({}) has {} workers, not {}", h,
               hosts_[h].address, hosts_[h].slots(), keep);
    if (keep == 0) continue;
    HostSpec host = hosts_[h];
    if (host.cpuWorkers > 0) {
      host.cpuWorkers = keep;
    } else {
      host.gpus.resize(static_cast<size_t>(keep));
    }
    out.hosts_.push_back(std::move(host));
  }
  WEFT_CHECK(!out.hosts_.empty(), "resized: no host keeps a worker");
  return out;
}

std::vector<std::string> sshCommand(const std::string& address, const std::string& remoteCommand) {
  return {"ssh", "-o", "BatchMode=yes", "--", address, remoteCommand};
}

int ResourceSpec::serverCount() const {
  int n = 0;
  for (const HostSpec& h : hosts_) n += h.servers;
  return n;
}

std::vector<WorkerSlot> ResourceSpec::workers() const {
  std::vector<WorkerSlot> out;
  for (size_t h = 0; h < hosts_.size(); ++h) {
    const HostSpec& host = hosts_[h];
    for (int s = 0; s < host.slots(); ++s) {
      const std::string device =
          host.cpuWorkers > 0 ? "cpu" : fmt::format("cuda:{}", host.gpus[static_cast<size_t>(s)]);
      out.push_back(WorkerSlot{static_cast<int>(h), s, device});
    }
  }
  return out;
}

std::string ResourceSpec::sharedGpu() const {
  for (size_t h = 0; h < hosts_.size(); ++h) {
    const std::vector<int>& gpus = hosts_[h].gpus;
    for (size_t i = 0; i < gpus.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (gpus[j] == gpus[i]) return fmt::format("hosts[{}].gpus[{}] is {}, which hosts[{}].gpus[{}] lists too", h, i,
                                                   gpus[i], h, j);
  }
  return "";
}

}  // namespace weft::dist
