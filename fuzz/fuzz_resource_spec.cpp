// Fuzz target: the resource specification parser (dist/launch/ResourceSpec.h).
#include "dist/launch/ResourceSpec.h"
#include "fuzz/Fuzz.h"

#include <cstdlib>

std::vector<std::string> weftFuzzSeeds() {
  return {R"({"hosts": [{"address": "127.0.0.1", "cpu_workers": 2}, {"address": "10.0.0.2", "gpus": [0, 1]}],
              "bind": "127.0.0.1", "coordinator_port": 0})",
          R"({"hosts": [{"address": "alice@h1", "cpu_workers": 1, "servers": 0,
              "launch_prefix": ["ip", "netns", "exec", "h1"]}], "coordinator_port": 65535})",
          R"({"hosts": [{"address": "fe80::1%eth0", "gpus": [3]}], "bind": "0.0.0.0"})"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  weft::fuzz::refusalsAllowed([&] {
    const weft::dist::ResourceSpec spec = weft::dist::ResourceSpec::parse(text, "fuzz.json");
    for (const weft::dist::HostSpec& h : spec.hosts()) {
      if (h.address.empty() || h.address[0] == '-' || h.slots() < 1) std::abort();
    }
    spec.workers();
  });
  return 0;
}
