// The distribution layer's formats: the resource specification (every validation error names the
// file and the JSON path) and the wire format (round trips of every field type; truncated,
// oversized, trailing-byte, bad-magic and other-job input refused with the field named).
#include "tests/TestUtil.h"

#include "core/JsonLimits.h"
#include "dist/Config.h"
#include "dist/launch/ResourceSpec.h"
#include "dist/transport/Wire.h"
#include "tests/InputTest.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

using namespace weft;
using namespace weft::dist;

namespace {

std::string specError(const std::string& text) {
  return errorOf([&] { ResourceSpec::parse(text, "cluster.json"); });
}

// Both ends of a connected stream socket pair.
struct SocketPair {
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
  FileDescriptor a, b;
};

Deadline in(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

const JobId kJob = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const JobId kOtherJob = {0xff, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

// A frame header with chosen fields, for frames writeFrame would never produce.
std::vector<uint8_t> header(uint32_t magic, uint16_t version, uint16_t type, const JobId& job, uint32_t length) {
  WireWriter w;
  w.putU32(magic);
  w.putU16(version);
  w.putU16(type);
  w.putFixed(job);
  w.putU32(length);
  return w.take();
}

void sendRaw(int fd, const std::vector<uint8_t>& bytes) {
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
}

std::string frameError(const std::vector<uint8_t>& bytes, bool close = false, uint32_t limit = kMaxControlPayload) {
  SocketPair p;
  sendRaw(p.a.get(), bytes);
  if (close) p.a.reset();
  return errorOf([&] { readFrame(p.b.get(), in(200), kJob, limit); });
}

}  // namespace

TEST_CASE("resource spec: the documented example") {
  const ResourceSpec spec = ResourceSpec::parse(R"({"hosts": [{"address": "127.0.0.1", "cpu_workers": 2},
      {"address": "10.0.0.2", "gpus": [0, 1]}], "bind": "0.0.0.0", "coordinator_port": 4000})",
                                                "cluster.json");
  REQUIRE(spec.hosts().size() == 2);
  CHECK(spec.hosts()[0].address == "127.0.0.1");
  CHECK(spec.hosts()[0].slots() == 2);
  CHECK(spec.hosts()[1].gpus == std::vector<int>{0, 1});
  CHECK(spec.bind() == "0.0.0.0");
  CHECK(spec.coordinatorPort() == 4000);
  CHECK(spec.serverCount() == 2);
  const std::vector<WorkerSlot> workers = spec.workers();
  REQUIRE(workers.size() == 4);
  const std::vector<std::string> devices = {"cpu", "cpu", "cuda:0", "cuda:1"};
  for (size_t i = 0; i < workers.size(); ++i) {
    CHECK(workers[i].host == (i < 2 ? 0 : 1));
    CHECK(workers[i].slot == static_cast<int>(i % 2));
    CHECK(workers[i].device == devices[i]);
  }
}

TEST_CASE("resource spec: defaults, localCpu and load") {
  const ResourceSpec spec = ResourceSpec::parse(R"({"hosts": [{"address": "h", "gpus": [3]}]})", "x.json");
  CHECK(spec.bind() == "127.0.0.1");  // loopback unless asked otherwise
  CHECK(spec.coordinatorPort() == 0);
  CHECK(spec.workers()[0].device == "cuda:3");

  const ResourceSpec local = ResourceSpec::localCpu(3);
  CHECK(local.hosts().size() == 1);
  CHECK(local.workers().size() == 3);
  CHECK(local.bind() == "127.0.0.1");
  CHECK(contains(errorOf([] { ResourceSpec::localCpu(0); }), "workers is 0"));

  const std::string path =
      (std::filesystem::temp_directory_path() / ("weft-spec-" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path) << R"({"hosts": [{"address": "127.0.0.1", "cpu_workers": 0}]})";
  CHECK(errorOf([&] { ResourceSpec::load(path); }) == path + ": hosts[0].cpu_workers is 0; it must be >= 1");
  std::ofstream(path) << R"({"hosts": [{"address": "127.0.0.1", "cpu_workers": 1}]})";
  CHECK(ResourceSpec::load(path).workers().size() == 1);
  std::remove(path.c_str());
  CHECK(contains(errorOf([&] { ResourceSpec::load(path); }), "resource specification " + path + " does not exist"));
}

TEST_CASE("resource spec: a host may be started through a launch prefix (a network namespace)") {
  const ResourceSpec spec = ResourceSpec::parse(
      R"({"hosts": [{"address": "10.1.0.1", "cpu_workers": 1, "launch_prefix": ["ip", "netns", "exec", "h1"]}]})",
      "cluster.json");
  CHECK(spec.hosts()[0].launchPrefix == std::vector<std::string>{"ip", "netns", "exec", "h1"});
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1, "launch_prefix": []}]})") ==
        "cluster.json: hosts[0].launch_prefix must be a non-empty array of strings");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1, "launch_prefix": ["ip", 3]}]})") ==
        "cluster.json: hosts[0].launch_prefix[1] must be a string, got 3");
}

TEST_CASE("resource spec: servers per host default to one and may be set, including to zero") {
  const ResourceSpec spec = ResourceSpec::parse(R"({"hosts": [{"address": "a", "cpu_workers": 1, "servers": 3},
      {"address": "b", "cpu_workers": 1, "servers": 0}, {"address": "c", "cpu_workers": 1}]})",
                                                "cluster.json");
  CHECK(spec.hosts()[0].servers == 3);
  CHECK(spec.hosts()[1].servers == 0);
  CHECK(spec.hosts()[2].servers == 1);
  CHECK(spec.serverCount() == 4);
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1, "servers": -1}]})") ==
        "cluster.json: hosts[0].servers is -1; it must be >= 0");
  CHECK(ResourceSpec::localCpu(2, 2).serverCount() == 2);
}

TEST_CASE("resource spec: toJson reads back as the same specification") {
  const ResourceSpec spec = ResourceSpec::parse(
      R"({"hosts": [{"address": "user@10.1.0.1", "cpu_workers": 2, "servers": 0,
                     "launch_prefix": ["ip", "netns", "exec", "h1"]},
                    {"address": "gpu-box", "gpus": [3, 1], "servers": 2}],
          "bind": "0.0.0.0", "coordinator_port": 4711, "encrypt": true})",
      "cluster.json");
  const ResourceSpec back = ResourceSpec::parse(spec.toJson(), "toJson");
  REQUIRE(back.hosts().size() == 2);
  for (size_t h = 0; h < 2; ++h) {
    CAPTURE(h);
    CHECK(back.hosts()[h].address == spec.hosts()[h].address);
    CHECK(back.hosts()[h].cpuWorkers == spec.hosts()[h].cpuWorkers);
    CHECK(back.hosts()[h].gpus == spec.hosts()[h].gpus);
    CHECK(back.hosts()[h].servers == spec.hosts()[h].servers);
    CHECK(back.hosts()[h].launchPrefix == spec.hosts()[h].launchPrefix);
  }
  CHECK(back.bind() == "0.0.0.0");
  CHECK(back.coordinatorPort() == 4711);
  CHECK(back.encrypt());
  CHECK_FALSE(ResourceSpec::localCpu(2).encrypt());  // authenticated, not encrypted, unless asked
}

TEST_CASE("resource spec: a launched process reads its job's specification from WEFT_RESOURCES") {
  ::unsetenv(kResourcesVariable);
  CHECK_FALSE(ResourceSpec::fromEnvironment().has_value());
  ::setenv(kResourcesVariable, ResourceSpec::localCpu(3, 2).toJson().c_str(), 1);
  const std::optional<ResourceSpec> spec = ResourceSpec::fromEnvironment();
  REQUIRE(spec.has_value());
  CHECK(spec->workers().size() == 3);
  CHECK(spec->serverCount() == 2);
  ::setenv(kResourcesVariable, R"({"hosts": []})", 1);
  CHECK(errorOf([] { ResourceSpec::fromEnvironment(); }) == "WEFT_RESOURCES: hosts is empty; list at least one host");
  ::setenv(kResourcesVariable, std::string(kMaxResourceSpecBytes + 1, ' ').c_str(), 1);
  CHECK(errorOf([] { ResourceSpec::fromEnvironment(); }) ==
        fmt::format("WEFT_RESOURCES: {} bytes; a specification holds at most {}", kMaxResourceSpecBytes + 1,
                    kMaxResourceSpecBytes));
  ::unsetenv(kResourcesVariable);
}

TEST_CASE("resource spec: arrays or objects nested past the limit are refused before parsing") {
  const std::string deep = R"({"hosts": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK(specError(deep) == fmt::format("cluster.json: arrays or objects nest deeper than {} levels (at byte {})",
                                       kMaxJsonDepth, 10 + kMaxJsonDepth - 1));
}

TEST_CASE("resource spec: every error names the file and the JSON path") {
  CHECK(contains(specError("{"), "cluster.json: not valid JSON"));
  CHECK(specError("[1]") == "cluster.json: the top level must be an object, got [1]");
  CHECK(specError(R"({"hosts": [], "bnd": "x"})") ==
        "cluster.json: unknown key 'bnd' (allowed: bind, coordinator_port, encrypt, hosts)");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1}], "encrypt": "yes"})") ==
        "cluster.json: encrypt must be true or false, got \"yes\"");
  CHECK(specError("{}") == "cluster.json: hosts is missing");
  CHECK(specError(R"({"hosts": {}})") == "cluster.json: hosts must be an array, got {}");
  CHECK(specError(R"({"hosts": []})") == "cluster.json: hosts is empty; list at least one host");
  CHECK(specError(R"({"hosts": [3]})") == "cluster.json: hosts[0] must be an object, got 3");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1, "gpu": [0]}]})") ==
        "cluster.json: hosts[0]: unknown key 'gpu' (allowed: address, cpu_workers, gpus, launch_prefix, servers)");
  CHECK(specError(R"({"hosts": [{"cpu_workers": 1}]})") == "cluster.json: hosts[0].address is missing");
  CHECK(specError(R"({"hosts": [{"address": "", "cpu_workers": 1}]})") == "cluster.json: hosts[0].address is empty");
  CHECK(specError(R"({"hosts": [{"address": 7, "cpu_workers": 1}]})") ==
        "cluster.json: hosts[0].address must be a string, got 7");
  CHECK(specError(
            R"({"hosts": [{"address": "a", "cpu_workers": 1}, {"address": "b", "cpu_workers": 1, "gpus": [0]}]})") ==
        "cluster.json: hosts[1] has both cpu_workers and gpus; give exactly one of cpu_workers or gpus");
  CHECK(specError(R"({"hosts": [{"address": "a"}]})") ==
        "cluster.json: hosts[0] has neither cpu_workers nor gpus; give exactly one of cpu_workers or gpus");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": -2}]})") ==
        "cluster.json: hosts[0].cpu_workers is -2; it must be >= 1");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 2.5}]})") ==
        "cluster.json: hosts[0].cpu_workers must be an integer, got 2.5");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1e12}]})") ==
        "cluster.json: hosts[0].cpu_workers must be an integer, got 1000000000000.0");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 10000000000}]})") ==
        "cluster.json: hosts[0].cpu_workers is 10000000000, out of range");
  CHECK(specError(R"({"hosts": [{"address": "a", "gpus": 0}]})") ==
        "cluster.json: hosts[0].gpus must be an array of GPU indices, got 0");
  CHECK(specError(R"({"hosts": [{"address": "a", "gpus": []}]})") ==
        "cluster.json: hosts[0].gpus is empty; list at least one GPU");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1}, {"address": "b", "gpus": [-1]}]})") ==
        "cluster.json: hosts[1].gpus[0] is -1");
  CHECK(specError(R"({"hosts": [{"address": "a", "gpus": [0, "1"]}]})") ==
        "cluster.json: hosts[0].gpus[1] must be an integer, got \"1\"");
  CHECK(specError(R"({"hosts": [{"address": "a", "gpus": [0]}], "bind": ""})") == "cluster.json: bind is empty");
  CHECK(specError(R"({"hosts": [{"address": "a", "gpus": [0]}], "coordinator_port": 70000})") ==
        "cluster.json: coordinator_port is 70000; it must be in 0..65535 (0: any free port)");
  CHECK(specError(R"({"hosts": [{"address": "a", "gpus": [0]}], "coordinator_port": -1})") ==
        "cluster.json: coordinator_port is -1; it must be in 0..65535 (0: any free port)");
}

TEST_CASE("resource spec: a GPU listed twice is shared by a pipeline's stages and refused to data-parallel workers") {
  const ResourceSpec spec = ResourceSpec::parse(R"({"hosts": [{"address": "a", "gpus": [1, 0, 1]}]})", "cluster.json");
  CHECK(spec.workers().size() == 3);
  CHECK(spec.workers()[2].device == "cuda:1");
  CHECK(spec.sharedGpu() == "hosts[0].gpus[2] is 1, which hosts[0].gpus[0] lists too");
  CHECK(ResourceSpec::parse(R"({"hosts": [{"address": "a", "gpus": [1, 0]}, {"address": "b", "gpus": [0]}]})",
                            "cluster.json")
            .sharedGpu() == "");  // the same index on two hosts is two GPUs
  Config config;
  const JobShape job{3, 1, spec.sharedGpu()};
  CHECK(errorOf([&] { checkConfig(config, job); }) ==
        "hosts[0].gpus[2] is 1, which hosts[0].gpus[0] lists too: data-parallel GPU workers sum their gradients "
        "through NCCL, which refuses two workers on one GPU; list each GPU once (the stages of a pipeline, --stages, "
        "may share one)");
  config.pipeline.stages = 3;
  checkConfig(config, {3, 0, spec.sharedGpu()});  // throws nothing
}

TEST_CASE("wire: every field type round-trips") {
  WireWriter w;
  w.putU8(0xab);
  w.putU16(0xbeef);
  w.putU32(0xdeadbeef);
  w.putU64(0x0123456789abcdefull);
  w.putI64(-42);
  w.putFixed(kJob);
  w.putBytes(std::vector<uint8_t>{9, 8, 7});
  w.putBytes({});
  w.putString("worker 0");
  w.putString("");
  w.putShape(Shape({-1, 3, 0}));
  w.putShape(Shape());
  w.putU32(2);  // a count of two u64 elements
  w.putU64(5);
  w.putU64(6);

  WireReader r(w.bytes(), "TEST");
  CHECK(r.getU8("a") == 0xab);
  CHECK(r.getU16("b") == 0xbeef);
  CHECK(r.getU32("c") == 0xdeadbeef);
  CHECK(r.getU64("d") == 0x0123456789abcdefull);
  CHECK(r.getI64("e") == -42);
  CHECK(r.getFixed<16>("f") == kJob);
  CHECK(r.getBytes("g") == std::vector<uint8_t>{9, 8, 7});
  CHECK(r.getBytes("h").empty());
  CHECK(r.getString("i") == "worker 0");
  CHECK(r.getString("j").empty());
  CHECK(r.getShape("k") == Shape({-1, 3, 0}));
  CHECK(r.getShape("l") == Shape());
  CHECK(r.getCount("m", 8) == 2);
  CHECK(r.getU64("n") == 5);
  CHECK(r.getU64("o") == 6);
  CHECK(r.remaining() == 0);
  r.finish();
}

TEST_CASE("wire: integers are little-endian") {
  WireWriter w;
  w.putU32(kWireMagic);
  CHECK(std::string(w.bytes().begin(), w.bytes().end()) == "WEFT");
}

TEST_CASE("wire: lengths are checked before reading, naming the field") {
  WireWriter w;
  w.putU32(70000);
  for (int i = 0; i < 12; ++i) w.putU8(0);
  WireReader claims(w.bytes(), "HELLO");
  CHECK(errorOf([&] { claims.getBytes("worker_address"); }) ==
        "message HELLO: field 'worker_address' claims 70000 bytes, 12 remain");

  const std::vector<uint8_t> two = {1, 2};
  WireReader shortRead(two, "JOIN");
  CHECK(errorOf([&] { shortRead.getU32("host"); }) == "message JOIN: field 'host' needs 4 bytes, 2 remain");
  WireReader fixed(two, "AUTH");
  CHECK(errorOf([&] { fixed.getFixed<32>("client_nonce"); }) ==
        "message AUTH: field 'client_nonce' needs 32 bytes, 2 remain");

  WireWriter big;
  big.putU32(kMaxStringBytes + 1);
  WireReader string(big.bytes(), "ABORT");
  CHECK(errorOf([&] { string.getString("reason"); }) ==
        fmt::format("message ABORT: field 'reason' claims {} bytes, over its {}-byte limit", kMaxStringBytes + 1,
                    kMaxStringBytes));
  WireReader limited(w.bytes(), "JOIN");
  CHECK(contains(errorOf([&] { limited.getBytes("nccl_id", 128); }),
                 "field 'nccl_id' claims 70000 bytes, over its 128-byte limit"));

  WireWriter count;
  count.putU32(1000000);
  count.putU64(0);
  WireReader list(count.bytes(), "ROSTER");
  CHECK(errorOf([&] { list.getCount("members", 17); }) ==
        "message ROSTER: field 'members' claims 1000000 entries of at least 17 bytes, 8 bytes remain");

  WireWriter rank;
  rank.putU32(65);
  WireReader shape(rank.bytes(), "TENSOR");
  CHECK(errorOf([&] { shape.getShape("shape"); }) == "message TENSOR: field 'shape' has rank 65, over the limit of 64");
  WireWriter dims;
  dims.putShape(Shape({2}));
  dims.putU32(1);
  dims.putI64(-5);
  WireReader negative(dims.bytes(), "TENSOR");
  CHECK(negative.getShape("a") == Shape({2}));
  CHECK(errorOf([&] { negative.getShape("b"); }) == "message TENSOR: field 'b' dimension 0 is -5");

  WireReader trailing(two, "AUTH_OK");
  trailing.getU8("x");
  CHECK(errorOf([&] { trailing.finish(); }) == "message AUTH_OK: 1 trailing bytes after the last field");
}

TEST_CASE("wire: message type names") {
  CHECK(messageTypeName(MessageType::Challenge) == "CHALLENGE");
  CHECK(messageTypeName(MessageType::AuthOk) == "AUTH_OK");
  CHECK(messageTypeName(MessageType::Roster) == "ROSTER");
  CHECK(messageTypeName(uint16_t{99}) == "type 99");
  CHECK(toHex(std::vector<uint8_t>{0x00, 0xab, 0x0f}) == "00ab0f");
}

TEST_CASE("frames: round trip over a socket") {
  SocketPair p;
  WireWriter w;
  w.putString("127.0.0.1:4000");
  writeFrame(p.a.get(), MessageType::Join, kJob, w.bytes(), in(1000));
  writeFrame(p.a.get(), MessageType::AuthOk, kJob, {}, in(1000));
  const Frame f = readFrame(p.b.get(), in(1000), kJob);
  CHECK(f.type == MessageType::Join);
  WireReader r = f.reader();
  CHECK(r.getString("address") == "127.0.0.1:4000");
  r.finish();
  const Frame empty = readFrame(p.b.get(), in(1000), kJob);
  CHECK(empty.type == MessageType::AuthOk);
  CHECK(empty.payload.empty());
}

TEST_CASE("frames: a large payload crosses the socket buffer") {
  SocketPair p;
  const std::vector<uint8_t> payload(4 << 20, 0x5a);  // far beyond the socket buffer: both sides wait
  std::thread writer([&] { writeFrame(p.a.get(), MessageType::Roster, kJob, payload, in(5000)); });
  const Frame f = readFrame(p.b.get(), in(5000), kJob);
  writer.join();
  CHECK(f.payload == payload);
}

TEST_CASE("frames: bad headers are refused, naming what is wrong") {
  CHECK(frameError(header(0x50545448, kWireVersion, 1, kJob, 0)) ==
        "bad frame magic 0x50545448 (expected 0x54464557, \"WEFT\"): not a weft peer");
  CHECK(frameError(header(kWireMagic, 2, 1, kJob, 0)) ==
        "frame version 2 is not supported (this build speaks version 1)");
  CHECK(frameError(header(kWireMagic, kWireVersion, 99, kJob, 0)) == "frame type 99 is not a weft message type");
  CHECK(frameError(header(kWireMagic, kWireVersion, 5, kOtherJob, 0)) ==
        "frame JOIN belongs to job ffee0000000000000000000000000000, expected job 0102030405060708090a0b0c0d0e0f10");
  CHECK(frameError(header(kWireMagic, kWireVersion, 6, kJob, 70000), false, 65536) ==
        "frame ROSTER claims a payload of 70000 bytes, over the 65536-byte limit");
}

TEST_CASE("frames: an assembler takes a frame as its bytes arrive, one at a time, and then the next") {
  SocketPair p;
  const std::vector<uint8_t> first = encodeFrame(MessageType::Auth, kJob, std::vector<uint8_t>(64, 7));
  const std::vector<uint8_t> second = encodeFrame(MessageType::AuthOk, kJob, {});
  FrameAssembler assembler(kJob, 64);
  for (size_t i = 0; i + 1 < first.size(); ++i) {
    sendRaw(p.a.get(), {first[i]});
    REQUIRE_FALSE(assembler.receive(p.b.get()).has_value());
  }
  sendRaw(p.a.get(), {first.back()});
  sendRaw(p.a.get(), second);
  const std::optional<Frame> auth = assembler.receive(p.b.get());
  REQUIRE(auth.has_value());
  CHECK(auth->type == MessageType::Auth);
  CHECK(auth->payload == std::vector<uint8_t>(64, 7));
  const std::optional<Frame> ok = assembler.receive(p.b.get());  // the next frame waited in the socket
  REQUIRE(ok.has_value());
  CHECK(ok->type == MessageType::AuthOk);
  CHECK_FALSE(assembler.receive(p.b.get()).has_value());
}

TEST_CASE("frames: an assembler refuses a bad header before its payload arrives, and names a closed peer") {
  SocketPair p;
  sendRaw(p.a.get(), header(kWireMagic, kWireVersion, 2, kJob, 65));
  FrameAssembler assembler(kJob, 64);
  CHECK(errorOf([&] { assembler.receive(p.b.get()); }) ==
        "frame AUTH claims a payload of 65 bytes, over the 64-byte limit");
  SocketPair q;
  sendRaw(q.a.get(), {'W', 'E'});
  q.a.reset();
  FrameAssembler closed(kJob, 64);
  CHECK(errorOf([&] { closed.receive(q.b.get()); }) == "connection closed by the peer after 2 bytes of a frame");
}

TEST_CASE("frames: truncation, silence and refusals") {
  std::vector<uint8_t> partial = header(kWireMagic, kWireVersion, 5, kJob, 10);
  partial.resize(20);
  CHECK(frameError(partial, true) == "connection closed by the peer after 20 of 28 bytes of a frame header");
  std::vector<uint8_t> shortPayload = header(kWireMagic, kWireVersion, 5, kJob, 10);
  shortPayload.insert(shortPayload.end(), {1, 2, 3});
  CHECK(frameError(shortPayload, true) ==
        "connection closed by the peer after 3 of 10 bytes of the payload of frame JOIN");

  const auto start = Clock::now();
  CHECK(frameError(shortPayload) ==
        "timed out: 3 of 10 bytes of the payload of frame JOIN arrived before the deadline");
  CHECK(Clock::now() - start < std::chrono::seconds(2));

  SocketPair p;
  sendRefusal(p.a.get(), kJob, "bad HMAC");
  const Frame refused = readFrame(p.b.get(), in(1000), kJob);
  CHECK(errorOf([&] { expectType(refused, MessageType::AuthOk); }) == "refused by the peer: bad HMAC");
  writeFrame(p.a.get(), MessageType::Abort, kJob, {}, in(1000));
  const Frame abort = readFrame(p.b.get(), in(1000), kJob);
  CHECK(errorOf([&] { expectType(abort, MessageType::Roster); }) == "expected a ROSTER frame, got ABORT");

  p.b.reset();
  CHECK(contains(errorOf([&] { writeFrame(p.a.get(), MessageType::Join, kJob, {}, in(1000)); }),
                 "sending frame JOIN failed"));
}

TEST_CASE("resource spec: addresses are host names or IP addresses, never ssh options") {
  CHECK(specError(R"({"hosts": [{"address": "-oProxyCommand=touch /tmp/x", "cpu_workers": 1}]})") ==
        "cluster.json: hosts[0].address '-oProxyCommand=touch /tmp/x' starts with '-', which ssh would take for an "
        "option");
  CHECK(specError(R"({"hosts": [{"address": "me@-oX", "cpu_workers": 1}]})") ==
        "cluster.json: hosts[0].address 'me@-oX' starts with '-', which ssh would take for an option");
  CHECK(specError(R"({"hosts": [{"address": "a b", "cpu_workers": 1}]})") ==
        "cluster.json: hosts[0].address 'a b' has ' ', which is not in a host name or an IP address");
  CHECK(specError(R"({"hosts": [{"address": "a", "cpu_workers": 1}], "bind": "-x"})") ==
        "cluster.json: bind '-x' starts with '-', which ssh would take for an option");
  for (const char* good : {"node-1.example.org", "10.0.0.2", "fe80::1%eth0", "alice@gpu_box"}) {
    CHECK(ResourceSpec::parse(fmt::format(R"({{"hosts": [{{"address": "{}", "cpu_workers": 1}}]}})", good), "c")
              .hosts()[0]
              .address == good);
  }
  // ssh's options end before the host, whatever the host is.
  CHECK(sshCommand("-oProxyCommand=x", "true") ==
        std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "--", "-oProxyCommand=x", "true"});
}

TEST_CASE("resource spec: quoted keys and values are escaped; a FIFO or directory is refused") {
  const std::string e = specError("{\"hosts\": [], \"\\u001b[2Jk\": 1}");
  CHECK(e == "cluster.json: unknown key '\\x1b[2Jk' (allowed: bind, coordinator_port, encrypt, hosts)");
  CHECK(specError("{\"hosts\": \"\\u009b1m\"}") == "cluster.json: hosts must be an array, got \"\\xc2\\x9b1m\"");
  TempDir dir;
  CHECK(contains(errorOf([&] { ResourceSpec::load(dir.path.string()); }), "is a directory"));
  const std::string fifo = makeFifo(dir, "spec.fifo");
  CHECK(contains(fifoError(fifo, [&] { ResourceSpec::load(fifo); }), fifo + " is a FIFO"));
}

TEST_CASE("frames: a peer's refusal reason is escaped") {
  WireWriter w;
  w.putString("no\x1b[2J");
  const Frame refused{MessageType::Refused, w.bytes()};
  CHECK(errorOf([&] { expectType(refused, MessageType::AuthOk); }) == "refused by the peer: no\\x1b[2J");
}
