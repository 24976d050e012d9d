// Fuzz target: the control-plane wire decoder (dist/transport/Wire.h). The first byte picks the mode:
//   odd:  the rest is what a peer sends on a socket: readFrame, then the payload read with the
//         schema of the frame's type (REFUSED through expectType, JOIN and ROSTER field by field);
//   even: the rest is a small program of WireReader calls (its first byte: how many opcodes
//         follow) run over the payload after it, with round trips through WireWriter.
#include "dist/transport/Wire.h"
#include "fuzz/Fuzz.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

namespace {

using namespace weft::dist;

constexpr size_t kMaxFrameInput = 32 << 10;  // fits a socket buffer, so writing never blocks

/// Reads what the opcodes say; aborts when a value does not survive a WireWriter round trip.
void runProgram(std::span<const uint8_t> ops, WireReader& r) {
  for (const uint8_t op : ops) {
    switch (op % 11) {
      case 0:
        r.getU8("u8");
        break;
      case 1:
        r.getU16("u16");
        break;
      case 2:
        r.getU32("u32");
        break;
      case 3:
        r.getU64("u64");
        break;
      case 4:
        r.getI64("i64");
        break;
      case 5:
        r.getBytes("bytes", 1u << 12);
        break;
      case 6: {
        const std::string s = r.getString("string");
        WireWriter w;
        w.putString(s);
        WireReader back(w.bytes(), "round trip");
        if (back.getString("string") != s) std::abort();
        break;
      }
      case 7: {
        const weft::Shape shape = r.getShape("shape");
        WireWriter w;
        w.putShape(shape);
        WireReader back(w.bytes(), "round trip");
        if (!(back.getShape("shape") == shape)) std::abort();
        break;
      }
      case 8: {
        const uint32_t n = r.getCount("count", op / 11 + 1);
        for (uint32_t i = 0; i < n && i < 64; ++i) r.getU8("element");
        break;
      }
      case 9:
        r.getFixed<16>("fixed");
        break;
      default:
        r.finish();
        break;
    }
  }
}

void frameMode(std::span<const uint8_t> bytes) {
  if (bytes.size() > kMaxFrameInput) bytes = bytes.first(kMaxFrameInput);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  weft::dist::FileDescriptor reader(fds[0]), writer(fds[1]);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(writer.get(), bytes.data() + done, bytes.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::shutdown(writer.get(), SHUT_WR);
  weft::fuzz::refusalsAllowed([&] {
    const Frame frame = readFrame(reader.get(), Clock::now() + std::chrono::milliseconds(100), JobId{}, 1u << 16);
    WireReader r = frame.reader();
    switch (frame.type) {
      case MessageType::Challenge:
        r.getFixed<32>("server_nonce");
        break;
      case MessageType::Auth:
        r.getFixed<32>("client_nonce");
        r.getFixed<32>("client_mac");
        break;
      case MessageType::AuthOk:
        r.getFixed<32>("server_mac");
        break;
      case MessageType::Refused:
        expectType(frame, MessageType::AuthOk);
        break;
      case MessageType::Join: {
        r.getU8("role");
        r.getU32("host");
        r.getU32("slot");
        r.getBytes("transport_address");
        r.getBytes("nccl_id");
        break;
      }
      case MessageType::Roster: {
        r.getU32("rank");
        r.getU32("world_size");
        const uint32_t members = r.getCount("members", 9);
        for (uint32_t i = 0; i < members; ++i) {
          r.getU8("role");
          r.getU32("host");
          r.getU32("slot");
          r.getBytes("transport_address");
        }
        break;
      }
      case MessageType::Abort:
      case MessageType::Checkpoint:
        r.getString("reason");
        break;
      case MessageType::Heartbeat:
        r.getU64("progress");
        r.getU8("waiting");
        r.getU8("main_thread");
        break;
      case MessageType::Leave:
        break;
    }
    r.finish();
  });
}

void programMode(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return;
  const size_t n = std::min<size_t>(bytes[0] % 24, bytes.size() - 1);
  const std::span<const uint8_t> ops = bytes.subspan(1, n), payload = bytes.subspan(1 + n);
  WireReader r(payload, "FUZZ");
  weft::fuzz::refusalsAllowed([&] { runProgram(ops, r); });
}

}  // namespace

std::vector<std::string> weftFuzzSeeds() {
  std::vector<std::string> seeds;
  auto frameSeed = [&](MessageType type, const std::string& payload) {
    const std::vector<uint8_t> frame =
        encodeFrame(type, JobId{}, {reinterpret_cast<const uint8_t*>(payload.data()), payload.size()});
    std::string seed(1, '\x01');
    seed.append(frame.begin(), frame.end());
    seeds.push_back(std::move(seed));
  };
  using weft::fuzz::littleEndian;
  const std::string nonce(32, '\x11'), mac(32, '\x22'), address(12, '\x07');
  frameSeed(MessageType::Challenge, nonce);
  frameSeed(MessageType::Auth, nonce + mac);
  frameSeed(MessageType::AuthOk, mac);
  frameSeed(MessageType::Refused, littleEndian(8, 4) + "bad HMAC");
  // JOIN: role, host, slot, transport address, NCCL id; ROSTER: rank, world size, members.
  frameSeed(MessageType::Join, littleEndian(1, 1) + littleEndian(0, 4) + littleEndian(1, 4) + littleEndian(12, 4) +
                                   address + littleEndian(0, 4));
  frameSeed(MessageType::Roster, littleEndian(0, 4) + littleEndian(2, 4) + littleEndian(1, 4) + littleEndian(1, 1) +
                                     littleEndian(0, 8) + littleEndian(12, 4) + address);
  frameSeed(MessageType::Abort, littleEndian(4, 4) + "stop");
  frameSeed(MessageType::Heartbeat, littleEndian(7, 8) + littleEndian(0, 1) + "R");
  frameSeed(MessageType::Leave, "");
  frameSeed(MessageType::Checkpoint, littleEndian(21, 4) + "host 2 answers again");
  // Programs: u32, string, shape, count over payloads that hold them.
  WireWriter fields;
  fields.putU32(42);
  fields.putString("worker 3");
  fields.putShape(weft::Shape({-1, 4, 5}));
  fields.putU32(2);
  fields.putU16(7);
  const std::string ops = {'\x05', '\x02', '\x06', '\x07', '\x08', '\x0a'};
  std::string program(1, '\0');
  program += ops;
  program.append(fields.bytes().begin(), fields.bytes().end());
  seeds.push_back(std::move(program));
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  if (data[0] & 1)
    frameMode(rest);
  else
    programMode(rest);
  return 0;
}
