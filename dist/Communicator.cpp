// The communication thread (see the header).
#include "dist/Communicator.h"

#include "core/Error.h"

#include "dist/Registry.h"

namespace weft::dist {

Communicator::Communicator(Ring& ring) : ring_(ring), rank_(ring.rank()), size_(ring.size()) {
  thread_ = std::thread([this] { loop(); });
  id_ = Registry<Communicator>::instance().add(this);  // only once nothing can throw
}

Communicator::~Communicator() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
  Registry<Communicator>::instance().remove(id_);
}

Communicator& Communicator::byId(int64_t id) {
  Communicator* communicator = Registry<Communicator>::instance().find(id);
  WEFT_CHECK(communicator != nullptr, "no communicator {} in this process (the graph's collective ops belong to a "
             "runner that no longer exists)", id);
  return *communicator;
}

uint64_t Communicator::submit(std::vector<uint8_t> buffer, Collective collective, TrafficKind kind) {
  std::lock_guard lock(mutex_);
  const uint64_t ticket = nextTicket_++;
  jobs_[ticket] = Job{std::move(buffer), std::move(collective), kind, false};
  queue_.push_back(ticket);
  changed_.notify_all();
  return ticket;
}

std::vector<uint8_t> Communicator::wait(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  auto it = jobs_.find(ticket);
  WEFT_CHECK(it != jobs_.end(), "collective {} was never submitted or was already collected", ticket);
  changed_.wait(lock, [&] { return it->second.done; });
  std::vector<uint8_t> buffer = std::move(it->second.buffer);
  jobs_.erase(it);
  if (failure_) std::rethrow_exception(failure_);
  return buffer;
}

Traffic Communicator::traffic() const {
  std::lock_guard lock(mutex_);
  return traffic_;
}

void Communicator::recordSparseRows(const std::string& variable, int64_t lookups, int64_t touched, int64_t rows) {
  std::lock_guard lock(mutex_);
  SparseRows& r = traffic_.sparseRows[variable];
  ++r.steps;
  r.lookups += lookups;
  r.touched += touched;
  r.rows = rows;
}

void Communicator::recordTraffic(TrafficKind kind, uint64_t sent, uint64_t received) {
  std::lock_guard lock(mutex_);
  traffic_.sent[static_cast<size_t>(kind)] += sent;
  traffic_.received[static_cast<size_t>(kind)] += received;
}

void Communicator::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const uint64_t ticket = queue_.front();
    queue_.pop_front();
    Job& job = jobs_.at(ticket);  // std::map: the reference survives other submissions
    if (!failure_) {
      lock.unlock();
      const uint64_t sentBefore = ring_.transport().bytesSent(), receivedBefore = ring_.transport().bytesReceived();
      const uint64_t acrossBefore[2] = {ring_.bytesSentAcross(), ring_.bytesReceivedAcross()};
      std::exception_ptr error;
      try {
        job.collective(ring_, job.buffer);
      } catch (...) {
        error = std::current_exception();
      }
      const auto kind = static_cast<size_t>(job.kind);
      lock.lock();
      traffic_.sent[kind] += ring_.transport().bytesSent() - sentBefore;
      traffic_.received[kind] += ring_.transport().bytesReceived() - receivedBefore;
      traffic_.sentAcross[kind] += ring_.bytesSentAcross() - acrossBefore[0];
      traffic_.receivedAcross[kind] += ring_.bytesReceivedAcross() - acrossBefore[1];
      if (error) failure_ = error;
    }
    job.done = true;
    changed_.notify_all();
  }
}

}  // namespace weft::dist
