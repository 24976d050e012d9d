// Between the processes of a job: the transport's thread that carries node messages and credit,
// failures told to every process, and the epoch protocol the followers run.
#include "dist/amp/AmpRuntime.h"

#include "core/Error.h"
#include "dist/transport/Transport.h"
#include "dist/amp/RuntimeState.h"

#include <fmt/format.h>

#include <algorithm>

namespace weft::amp {

/// Stops the run with `message` (the first failure wins); another process's failure also goes
/// to the controller, which stops every process.
void Runtime::Impl::fail(std::string message) {
  {
    std::lock_guard<std::mutex> lock(doneMutex);
    if (!failure.empty()) return;
    failure = message;
    doneChanged.notify_all();
  }
  tellFailure(message);
}

/// Sends a failure on: from a process to the controller, from the controller to every process.
void Runtime::Impl::tellFailure(const std::string& message) {
  if (processes.count == 1) return;
  WireMessage m = control(WireKind::Failed);
  m.reason = message;
  if (processes.rank != 0) post(0, std::move(m));
  else
    for (int r = 1; r < processes.count; ++r) post(r, m);
}

void Runtime::Impl::post(int rank, WireMessage m) {
  std::lock_guard<std::mutex> lock(outboxMutex);
  outbox.emplace_back(rank, std::move(m));
}

/// The transport's thread: sends what the workers and the controller posted, and hands what
/// arrives to the workers (node messages), the controller (credit) or the main thread (the
/// epoch protocol).
void Runtime::Impl::commLoop() {
  dist::Transport& transport = *processes.transport;
  auto lastTraffic = Clock::now();
  try {
    while (!commStopping) {
      std::vector<std::pair<int, WireMessage>> sending;
      {
        std::lock_guard<std::mutex> lock(outboxMutex);
        sending.swap(outbox);
      }
      for (auto& [rank, m] : sending) {
        try {
          auto [header, payload] = encode(m);
          transport.sendMessage(processes.peers.at(static_cast<size_t>(rank)), header, payload,
                                Clock::now() + options.timeout);
        } catch (const std::exception& e) {
          WEFT_THROW("sending to process {}: {}", rank, e.what());
        }
      }
      transport.progress();
      std::vector<dist::Message> arrived = transport.takeMessages(Clock::now() + options.timeout);
      // A message that cannot be taken stops the run; the thread goes on carrying the news.
      for (dist::Message& raw : arrived) {
        try {
          receive(raw);
        } catch (const std::exception& e) {
          fail(fmt::format("amp: process {} could not take a message: {}", processes.rank, e.what()));
        }
      }
      for (int r = 0; r < processes.count; ++r)
        if (r != processes.rank && transport.hasFailed(processes.peers[static_cast<size_t>(r)]))
          WEFT_THROW("process {} failed: {}", r, transport.failureOf(processes.peers[static_cast<size_t>(r)]));
      // Workers cannot wake a wait on the transport, so while messages flow the wait is short
      // (what they post leaves soon) and grows when the job is quiet.
      const auto now = Clock::now();
      if (!sending.empty() || !arrived.empty()) lastTraffic = now;
      else
        transport.waitForActivity(now + options.timeout, now - lastTraffic < std::chrono::milliseconds(2)
                                                             ? std::chrono::microseconds(20)
                                                             : std::chrono::microseconds(500));
    }
  } catch (const std::exception& e) {
    fail(fmt::format("amp: process {} lost its connection: {}", processes.rank, e.what()));
    std::lock_guard<std::mutex> lock(doneMutex);
    WireMessage lost = control(WireKind::Failed);
    lost.reason = e.what();
    controlInbox.emplace_back(-1, std::move(lost));
    doneChanged.notify_all();
  }
  commEnded = true;
}

int Runtime::Impl::rankOfPeer(int peer) const {
  for (int r = 0; r < processes.count; ++r)
    if (processes.peers[static_cast<size_t>(r)] == peer && r != processes.rank) return r;
  WEFT_THROW("amp: a message came from peer {}, which is no process of this job", peer);
}

void Runtime::Impl::receive(const dist::Message& raw) {
  const int from = rankOfPeer(raw.from);
  processed.fetch_add(1);  // progress, as the controller's stall check counts it
  WireMessage m = decode(raw.header, raw.payload);
  switch (m.kind) {
    case WireKind::Forward:
    case WireKind::Backward: {
      WEFT_CHECK(m.node >= 0 && m.node < static_cast<int>(nodes.size()) && isLocal(nodes[static_cast<size_t>(m.node)]),
                 "amp: process {} sent a message for node {}, which process {} does not run", from, m.node,
                 processes.rank);
      const amp::Node& target = graph.node(m.node);
      const int ports = m.kind == WireKind::Forward ? static_cast<int>(target.inputs.size()) : target.outputs;
      WEFT_CHECK(m.port >= 0 && m.port < ports, "amp: process {} sent node '{}' a message on port {} of {}", from,
                 target.name, m.port, ports);
      dispatch({m.kind == WireKind::Forward ? Task::Kind::Forward : Task::Kind::Backward, m.node, m.port,
                std::move(m.tensor), m.state, m.credit});
      break;
    }
    case WireKind::Credit: {
      WEFT_CHECK(processes.rank == 0, "amp: process {} returned credit to process {}, not the controller", from,
                 processes.rank);
      Flow measured{{}, {}, m.loss, m.hits, m.count, true};
      giveBack(m.state.instance, std::move(m.credit), measured);
      break;
    }
    case WireKind::Failed:
      fail(fmt::format("{} (process {})", m.reason, from));
      [[fallthrough]];
    default: {
      std::lock_guard<std::mutex> lock(doneMutex);
      if (m.kind == WireKind::Report) reports[static_cast<size_t>(from)] = std::move(m.report);
      controlInbox.emplace_back(from, std::move(m));
      doneChanged.notify_all();
    }
  }
}

/// Waits (the main thread) for a message of the epoch protocol; a failure anywhere throws it.
/// The first message of the epoch protocol of one of `kinds`. Messages from different
/// processes (and, over UCX, from one) may come in any order, so others wait their turn.
std::pair<int, WireMessage> Runtime::Impl::nextControl(std::unique_lock<std::mutex>& lock,
                                                       std::initializer_list<WireKind> kinds) {
  auto wanted = [&] {
    return std::find_if(controlInbox.begin(), controlInbox.end(), [&](const auto& entry) {
      return std::find(kinds.begin(), kinds.end(), entry.second.kind) != kinds.end();
    });
  };
  // Waits as long as messages move here; a whole timeout without any is a stalled job.
  for (int64_t seen = processed.load();;) {
    if (doneChanged.wait_for(lock, options.timeout, [&] { return !failure.empty() || wanted() != controlInbox.end(); }))
      break;
    const int64_t now = processed.load();
    WEFT_CHECK(now != seen, "amp: process {} heard nothing from the other processes for {:.0f} s", processes.rank,
               seconds(options.timeout));
    seen = now;
  }
  if (!failure.empty()) throw Error(failure);
  auto it = wanted();
  auto next = std::move(*it);
  controlInbox.erase(it);
  return next;
}

/// The epoch of a process other than the controller's: its workers answer messages while it
/// waits for the controller's updates (synchronous training) and the end of the epoch, when it
/// checks that nothing is left and reports.
void Runtime::Impl::followEpoch() {
  std::unique_lock<std::mutex> lock(doneMutex);
  for (;;) {
    WireMessage m = nextControl(lock, {WireKind::Update, WireKind::EpochEnd}).second;
    if (m.kind == WireKind::Update) {
      lock.unlock();
      queueUpdates(m.instances);
      lock.lock();
      doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
      if (!failure.empty()) throw Error(failure);
      post(0, control(WireKind::Updated));
      continue;
    }
    epochTotals = m;
    break;
  }
  doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
  if (!failure.empty()) throw Error(failure);
  lock.unlock();
  checkDrained();
  WireMessage report = control(WireKind::Report);
  report.report = encodeReport(localReport());
  post(0, std::move(report));
}

void Runtime::abort(const std::string& reason) { impl_->tellFailure(reason); }

bool Runtime::anyProcess(bool mine) {
  Impl& m = *impl_;
  if (m.processes.count == 1) return mine;
  std::unique_lock<std::mutex> lock(m.doneMutex);
  if (m.processes.rank != 0) {
    m.post(0, control(WireKind::Vote, mine ? 1 : 0));
    return m.nextControl(lock, {WireKind::Verdict}).second.instances != 0;
  }
  bool any = mine;
  for (int r = 1; r < m.processes.count; ++r) any = m.nextControl(lock, {WireKind::Vote}).second.instances != 0 || any;
  for (int r = 1; r < m.processes.count; ++r) m.post(r, control(WireKind::Verdict, any ? 1 : 0));
  return any;
}

int64_t Runtime::resume(const std::optional<ResumePoint>& point) {
  Impl& m = *impl_;
  if (m.processes.rank != 0) {
    std::unique_lock<std::mutex> lock(m.doneMutex);
    WireMessage message = m.nextControl(lock, {WireKind::Resume}).second;
    lock.unlock();
    if (message.instances > 0) m.restoreLocal(decodeReport(message.report).variables);
    return message.instances;
  }
  if (!point) {
    for (int r = 1; r < m.processes.count; ++r) m.post(r, control(WireKind::Resume, 0));
    return 0;
  }
  WEFT_CHECK(point->position > 0, "amp: resuming at position {}; a checkpoint comes after some work", point->position);
  std::vector<ProcessReport> shares(static_cast<size_t>(m.processes.count));
  try {
    for (const auto& [name, value] : point->variables)
      shares[static_cast<size_t>(m.processOf(m.transformOwning(name).worker))].variables.emplace_back(name, value);
    m.restoreLocal(shares[0].variables);
  } catch (const std::exception& e) {
    m.tellFailure(e.what());  // the others wait for their share: they stop now, not at the timeout
    throw;
  }
  for (int r = 1; r < m.processes.count; ++r) {
    WireMessage message = control(WireKind::Resume, point->position);
    message.report = encodeReport(shares[static_cast<size_t>(r)]);
    m.post(r, std::move(message));
    for (const auto& [name, value] : shares[static_cast<size_t>(r)].variables) m.remoteVariables[name] = value.clone();
  }
  return point->position;
}

}  // namespace weft::amp
