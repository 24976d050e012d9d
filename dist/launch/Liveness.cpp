// The main thread's liveness record (see the header).
#include "dist/launch/Liveness.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>

namespace weft::dist {

namespace {

std::atomic<uint64_t> progress{0};
std::atomic<int> waiting{0};
std::atomic<pid_t> mainThread{0};

// The state letter of /proc/self/task/TID/stat: the field after the parenthesised name.
char threadState(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return '?';
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

class WatchedTransport final : public Transport {
 public:
  explicit WatchedTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  std::vector<uint8_t> address() const override { return inner_->address(); }
  int connect(std::span<const uint8_t> peerAddress, EndpointName peerName) override {
    return inner_->connect(peerAddress, peerName);
  }
  void send(int peer, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline) override {
    waited([&] { inner_->send(peer, tag, bytes, deadline); });
  }
  void startSend(int peer, uint64_t tag, std::span<const uint8_t> bytes) override {
    inner_->startSend(peer, tag, bytes);
  }
  void finishSends(Deadline deadline) override {
    waited([&] { inner_->finishSends(deadline); });
  }
  void receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer) override {
    waited([&] { inner_->receive(tag, into, deadline, fromPeer); });
  }
  void exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer, uint64_t receiveTag,
                std::span<uint8_t> into, Deadline deadline) override {
    waited([&] { inner_->exchange(sendPeer, sendTag, bytes, receivePeer, receiveTag, into, deadline); });
  }
  void sendMessage(int peer, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                   Deadline deadline) override {
    waited([&] { inner_->sendMessage(peer, header, payload, deadline); });
  }
  std::vector<Message> takeMessages(Deadline deadline) override { return inner_->takeMessages(deadline); }
  void progress() override { inner_->progress(); }
  void waitForActivity(Deadline deadline, std::chrono::microseconds longest) override {
    waited([&] { inner_->waitForActivity(deadline, longest); });
  }
  bool hasFailed(int peer) const override { return inner_->hasFailed(peer); }
  std::string failureOf(int peer) const override { return inner_->failureOf(peer); }
  void closeAll(Deadline deadline) override {
    waited([&] { inner_->closeAll(deadline); });
  }
  void closeNow() override { inner_->closeNow(); }
  void limitPayloads(uint64_t bytes) override { inner_->limitPayloads(bytes); }
  uint64_t rejected() const override { return inner_->rejected(); }
  void acceptOnly(std::vector<EndpointName> members) override { inner_->acceptOnly(std::move(members)); }
  uint64_t bytesSent() const override { return inner_->bytesSent(); }
  uint64_t bytesReceived() const override { return inner_->bytesReceived(); }

 private:
  template <typename F>
  void waited(F&& wait) {
    {
      const WaitingOnPeer mark;
      wait();
    }
    noteProgress();
  }
  std::unique_ptr<Transport> inner_;
};

}  // namespace

void markMainThread() { mainThread = static_cast<pid_t>(::syscall(SYS_gettid)); }
void noteProgress() { progress.fetch_add(1, std::memory_order_relaxed); }
WaitingOnPeer::WaitingOnPeer() { waiting.fetch_add(1, std::memory_order_relaxed); }
WaitingOnPeer::~WaitingOnPeer() { waiting.fetch_sub(1, std::memory_order_relaxed); }

MainThreadSample sampleMainThread() {
  MainThreadSample s;
  s.progress = progress.load(std::memory_order_relaxed);
  s.waiting = waiting.load(std::memory_order_relaxed) > 0;
  const pid_t tid = mainThread.load();
  s.state = tid > 0 ? threadState(tid) : '?';
  return s;
}

std::unique_ptr<Transport> watchWaits(std::unique_ptr<Transport> inner) {
  return std::make_unique<WatchedTransport>(std::move(inner));
}

}  // namespace weft::dist
