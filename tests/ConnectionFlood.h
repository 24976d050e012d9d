// An outsider on the same machine flooding a TCP listener on loopback, as one would a job's
// coordinator: while alive, each of its threads opens a connection to 127.0.0.1:port every
// `interval` (refused ones too, until something listens there) and keeps its newest 256 open,
// silent. Coming from 127.0.0.1, the flood shares its source address with a local job's members.
#pragma once

#include "dist/transport/Wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

class ConnectionFlood {
 public:
  explicit ConnectionFlood(uint16_t port, int threads = 1,
                           std::chrono::microseconds interval = std::chrono::milliseconds(1))
      : interval_(interval) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this, port] { flood(port); });
  }
  ~ConnectionFlood() {
    running_ = false;
    for (std::thread& t : threads_) t.join();
  }
  ConnectionFlood(const ConnectionFlood&) = delete;
  ConnectionFlood& operator=(const ConnectionFlood&) = delete;

  /// The connections that were accepted so far.
  uint64_t opened() const { return opened_; }

 private:
  void flood(uint16_t port) {
    std::deque<weft::dist::FileDescriptor> held;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    while (running_) {
      weft::dist::FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
        ++opened_;
        held.push_back(std::move(fd));
        if (held.size() > 256) held.pop_front();
      }
      std::this_thread::sleep_for(interval_);
    }
  }
  const std::chrono::microseconds interval_;
  std::atomic<bool> running_{true};
  std::atomic<uint64_t> opened_{0};
  std::vector<std::thread> threads_;
};
