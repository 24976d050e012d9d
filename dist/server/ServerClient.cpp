// The worker's side of the parameter servers (see the header).
#include "dist/server/ServerClient.h"

#include "core/Error.h"

#include "dist/Registry.h"

#include <cstring>
#include <set>


namespace weft::dist {

ServerClient::ServerClient(TrafficLog& traffic, Transport& transport, int rank, std::vector<int> serverPeers,
                           const ServerPlan& plan, std::chrono::milliseconds timeout, int relay,
                           std::shared_ptr<const SyncPolicy> sync, DType wire)
    : traffic_(traffic), transport_(transport), rank_(rank), replica_(rank), serverPeers_(std::move(serverPeers)),
      plan_(plan), timeout_(timeout), relay_(relay), sync_(std::move(sync)), wire_(wire),
      pushes_(plan.partitions.size(), 0) {
  WEFT_CHECK(static_cast<int>(serverPeers_.size()) >= plan.servers,
             "the plan spreads variables over {} servers, the job has {}", plan.servers, serverPeers_.size());
  id_ = Registry<ServerClient>::instance().add(this);  // only once nothing can throw
}

ServerClient::~ServerClient() { Registry<ServerClient>::instance().remove(id_); }

ServerClient* ServerClient::find(int64_t id) { return Registry<ServerClient>::instance().find(id); }


void ServerClient::goodbye() {
  std::vector<Call> calls;
  if (relay_ >= 0) {
    calls.push_back({-1 - relay_, RequestKind::Goodbye, {}});
  } else {
    for (int s = 0; s < static_cast<int>(serverPeers_.size()); ++s) calls.push_back({-1 - s, RequestKind::Goodbye, {}});
  }
  request(std::move(calls), TrafficKind::Control);
}

std::string ServerClient::describe(const Call& call) const {
  if (call.kind == RequestKind::Goodbye) return fmt::format("GOODBYE to server {}", serverOf(call));
  const Partition& p = plan_.partitions[static_cast<size_t>(call.partition)];
  const ServedVariable& v = plan_.variables[static_cast<size_t>(p.variable)];
  const std::string via = relay_ >= 0 ? fmt::format(" through server {}, this machine's local aggregator", relay_) : "";
  const std::string rows = p.stride == 1 ? fmt::format("rows {}..{}", p.first, p.first + p.rows)
                                         : fmt::format("rows {} mod {}", p.first, p.stride);
  return fmt::format("{} for partition {} ({} of '{}') on server {}{}", requestKindName(call.kind), call.partition,
                     rows, v.variable->name, p.server, via);
}

int ServerClient::destinationOf(const Call& call) const { return relay_ >= 0 ? relay_ : serverOf(call); }

int ServerClient::serverOf(const Call& call) const {
  // A goodbye names server s as partition -1 - s.
  return call.kind == RequestKind::Goodbye ? -1 - call.partition
                                           : plan_.partitions.at(static_cast<size_t>(call.partition)).server;
}

std::vector<std::vector<uint8_t>> ServerClient::request(std::vector<Call> calls, TrafficKind kind) {
  const uint64_t sentBefore = transport_.bytesSent(), receivedBefore = transport_.bytesReceived();
  const Deadline deadline = Clock::now() + timeout_;
  std::map<uint64_t, size_t> pending;  // request id -> call
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    RequestHeader h;
    h.kind = c.kind;
    h.worker = static_cast<uint32_t>(rank_);
    h.id = nextRequest_++;
    const int server = destinationOf(c);
    if (c.kind != RequestKind::Goodbye) {
      const auto p = static_cast<size_t>(c.partition);
      h.partition = static_cast<uint32_t>(c.partition);
      // An APPLY completes the push this worker just made; everything else is for the next version.
      h.clock = c.kind == RequestKind::Apply ? pushes_[p] - 1 : pushes_[p];
      WEFT_CHECK(c.kind != RequestKind::Apply || pushes_[p] > 0, "{} before any push", describe(c));
    }
    try {
      transport_.sendMessage(serverPeers_[static_cast<size_t>(server)], encode(h), c.payload, deadline);
    } catch (const std::exception& e) {
      WEFT_THROW("worker {}: {} failed: {}", rank_, describe(c), e.what());
    }
    if (c.kind == RequestKind::Push) ++pushes_[static_cast<size_t>(c.partition)];
    pending[h.id] = i;
  }
  std::vector<std::vector<uint8_t>> replies(calls.size());
  while (!pending.empty()) {
    // Failures and the deadline are looked at before the messages are taken: a server that
    // answers and then closes (a GOODBYE's acknowledgement) has delivered its answer by then.
    const bool late = Clock::now() >= deadline;
    std::set<int> failed;
    for (const auto& [id, i] : pending) {
      const int peer = serverPeers_[static_cast<size_t>(destinationOf(calls[i]))];
      if (transport_.hasFailed(peer)) failed.insert(peer);
    }
    for (Message& m : transport_.takeMessages(deadline)) {
      // Workers serve nothing, and only the server a request went to answers it.
      if (isRequest(m.header)) continue;
      const ReplyHeader r = decodeReply(m.header);
      auto it = pending.find(r.id);
      if (it == pending.end() || m.from != serverPeers_[static_cast<size_t>(destinationOf(calls[it->second]))])
        continue;
      WEFT_CHECK(r.status == 0, "{}", std::string(m.payload.begin(), m.payload.end()));
      replies[it->second] = std::move(m.payload);
      pending.erase(it);
    }
    for (const auto& [id, i] : pending) {
      const int peer = serverPeers_[static_cast<size_t>(destinationOf(calls[i]))];
      WEFT_CHECK(!failed.count(peer), "worker {}: {} failed: the server failed: {}", rank_, describe(calls[i]),
                 transport_.failureOf(peer));
      WEFT_CHECK(!late, "worker {}: {} got no reply within {} ms", rank_, describe(calls[i]), timeout_.count());
    }
    if (!pending.empty()) transport_.waitForActivity(deadline, std::chrono::milliseconds(1));
  }
  traffic_.record(kind, transport_.bytesSent() - sentBefore, transport_.bytesReceived() - receivedBefore);
  return replies;
}

void ServerClient::keepPulledRows() {
  WEFT_CHECK(sync_->synchronous(), "keeping pulled rows needs BSP, under which a clock's rows are fixed; {} moves "
             "them between pulls", sync_->name());
  keepRows_ = true;
  kept_.assign(plan_.partitions.size(), {});
}

void ServerClient::forgetPulledRows() {
  if (keepRows_) kept_.assign(plan_.partitions.size(), {});
}

ServerClient::KeptRows& ServerClient::keptAt(int partition) {
  KeptRows& kept = kept_.at(static_cast<size_t>(partition));
  if (kept.clock != pushes_[static_cast<size_t>(partition)]) {
    kept = KeptRows{};
    kept.clock = pushes_[static_cast<size_t>(partition)];
  }
  return kept;
}

std::vector<std::vector<uint8_t>> ServerClient::pullWhole(std::vector<Call> calls, TrafficKind kind) {
  if (!keepRows_) return request(std::move(calls), kind);
  std::vector<Call> missing;
  for (const Call& c : calls) {
    WEFT_CHECK(c.kind == RequestKind::PullAll, "pullWhole takes PULL_ALL calls, not {}", describe(c));
    if (!keptAt(c.partition).whole) missing.push_back(c);
  }
  std::vector<std::vector<uint8_t>> replies = request(missing, kind);
  for (size_t j = 0; j < missing.size(); ++j)
    kept_[static_cast<size_t>(missing[j].partition)].whole = std::move(replies[j]);
  std::vector<std::vector<uint8_t>> out;
  for (const Call& c : calls) out.push_back(*kept_[static_cast<size_t>(c.partition)].whole);
  return out;
}

std::vector<std::vector<uint8_t>> ServerClient::pullRows(std::vector<Call> calls, TrafficKind kind) {
  if (!keepRows_) return request(std::move(calls), kind);
  const auto idsOf = [](const std::vector<uint8_t>& payload) {
    std::vector<int64_t> ids(payload.size() / sizeof(int64_t));
    if (!ids.empty()) std::memcpy(ids.data(), payload.data(), ids.size() * sizeof(int64_t));
    return ids;
  };
  std::vector<Call> missing;
  for (const Call& c : calls) {
    WEFT_CHECK(c.kind == RequestKind::PullRows, "pullRows takes PULL_ROWS calls, not {}", describe(c));
    const KeptRows& kept = keptAt(c.partition);
    std::vector<int64_t> absent;
    for (int64_t id : idsOf(c.payload))
      if (!kept.at.count(id)) absent.push_back(id);
    if (absent.empty()) continue;
    const auto* bytes = reinterpret_cast<const uint8_t*>(absent.data());
    missing.push_back({c.partition, RequestKind::PullRows, {bytes, bytes + absent.size() * sizeof(int64_t)}});
  }
  const std::vector<std::vector<uint8_t>> replies = request(missing, kind);
  for (size_t j = 0; j < missing.size(); ++j) {
    KeptRows& kept = kept_[static_cast<size_t>(missing[j].partition)];
    const std::vector<int64_t> ids = idsOf(missing[j].payload);
    const Partition& part = plan_.partitions[static_cast<size_t>(missing[j].partition)];
    const size_t rowBytes = wireOf(plan_.variables[static_cast<size_t>(part.variable)]).bytes();
    WEFT_CHECK(replies[j].size() == ids.size() * rowBytes, "worker {}: {} returned {} bytes for {} rows of {}", rank_,
               describe(missing[j]), replies[j].size(), ids.size(), rowBytes);
    for (size_t i = 0; i < ids.size(); ++i) kept.at.emplace(ids[i], kept.rows.size() + i * rowBytes);
    kept.rows.insert(kept.rows.end(), replies[j].begin(), replies[j].end());
  }
  std::vector<std::vector<uint8_t>> out;
  for (const Call& c : calls) {
    const KeptRows& kept = kept_[static_cast<size_t>(c.partition)];
    const Partition& part = plan_.partitions[static_cast<size_t>(c.partition)];
    const size_t rowBytes = wireOf(plan_.variables[static_cast<size_t>(part.variable)]).bytes();
    std::vector<uint8_t>& rows = out.emplace_back();
    for (int64_t id : idsOf(c.payload)) {
      const auto from = kept.rows.begin() + static_cast<std::ptrdiff_t>(kept.at.at(id));
      rows.insert(rows.end(), from, from + static_cast<std::ptrdiff_t>(rowBytes));
    }
  }
  return out;
}

}  // namespace weft::dist
