// Rendezvous: how a job's processes find each other. The coordinator listens on TCP; every
// process connects, proves it holds the job secret (Auth.h), and sends JOIN with its identity
// (role, host, slot) and its transport address. Once every expected member has joined, each
// gets the ROSTER: its rank, the world size, every member's identity and address, and the NCCL
// unique id that worker rank 0 brought. Ranks depend only on identities, never on arrival order:
// workers first, ordered by (host, slot), then servers ordered by host. If the members are not
// all there before the timeout, the ones that joined get ABORT naming the missing ones.
//
//   JOIN   {role u8, host u32, slot u32, transport_address bytes, nccl_id bytes (0 or 128),
//           client_address bytes}
//   ROSTER {rank u32, world_size u32, members: count u32 x {role u8, rank u32, host u32, slot u32,
//           transport_address bytes, client_address bytes}, nccl_id bytes}
//   ABORT  {reason string}
//   HEARTBEAT {} (member -> coordinator, every second from the roster on)
//
// After the rendezvous each member keeps its connection and sends heartbeats on it from a
// background thread; the coordinator records when it last heard from each, so the launcher can
// tell a member that froze (stopped, or cut off by the network) from one that is merely slow.
#pragma once

#include "dist/Auth.h"
#include "dist/ResourceSpec.h"

#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace weft::dist {

enum class Role : uint8_t { Worker = 0, Server = 1 };

/// Who a process is in the resource specification: its role, host, and slot among the host's
/// workers or servers.
struct MemberId {
  Role role = Role::Worker;
  int host = 0;
  int slot = 0;
  auto operator<=>(const MemberId&) const = default;  // (role, host, slot): the rank order
};
/// "worker 1 of host 0", "server of host 2" (slot 0), "server 1 of host 2".
std::string describe(const MemberId& id);
/// Every worker of the specification, then every server.
std::vector<MemberId> expectedMembers(const ResourceSpec& spec);

inline constexpr size_t kNcclIdBytes = 128;  // sizeof(ncclUniqueId)

/// What a process sends when it joins.
struct JoinRequest {
  MemberId id;
  std::vector<uint8_t> address;  ///< its transport address (e.g. a UCX worker address)
  std::vector<uint8_t> ncclId;   ///< worker rank 0's NCCL unique id, or empty
  /// A worker's second transport address, the one its requests to parameter servers come from
  /// (a UCX worker of its own, so they never queue behind collectives); empty for servers.
  std::vector<uint8_t> clientAddress;
};

/// One member as the roster lists it.
struct Member {
  MemberId id;
  int rank = 0;
  std::vector<uint8_t> address;
  std::vector<uint8_t> clientAddress;  ///< see JoinRequest
};

class Heartbeat;

/// What every member receives.
struct Roster {
  int rank = 0;
  int worldSize = 0;
  std::vector<Member> members;  ///< indexed by rank
  std::vector<uint8_t> ncclId;  ///< empty when worker rank 0 sent none
  std::shared_ptr<Heartbeat> heartbeat;  ///< beats while a copy of the roster holds it
};

/// Serves one rendezvous in a background thread from construction on. Bad connections (no or a
/// wrong secret, another job, malformed frames, silence past the handshake timeout, unexpected or
/// duplicate members) are refused, logged to stderr, and do not disturb the others.
class Coordinator {
 public:
  /// Listens on spec.bind() at spec.coordinatorPort() (0: any free port). `timeout` bounds the
  /// whole rendezvous; `handshakeTimeout` bounds each connection's way from accept to JOIN.
  Coordinator(const ResourceSpec& spec, const Secret& secret, const JobId& job, std::vector<MemberId> expected,
              std::chrono::milliseconds timeout,
              std::chrono::milliseconds handshakeTimeout = std::chrono::seconds(5));
  /// Stops serving; members still waiting see their connection close.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  /// The port it listens on.
  uint16_t port() const;
  /// Blocks until every member got its roster and returns the members by rank; throws the
  /// message the members got in ABORT when the rendezvous timed out.
  std::vector<Member> wait();
  /// Once the rosters went out: how long ago each member's last heartbeat (or its roster)
  /// arrived; a member whose connection closed is silent from then on. Empty before.
  std::map<MemberId, std::chrono::milliseconds> silences() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// A member's heartbeats: a background thread sends one every `interval` on the member's
/// coordinator connection until destroyed (or until the coordinator is gone).
class Heartbeat {
 public:
  Heartbeat(int fd, const JobId& job, std::chrono::milliseconds interval);  // owns fd
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The member side: connects to the coordinator, authenticates, joins, and returns the roster,
/// whose `heartbeat` keeps the connection and beats every `heartbeatInterval`. Throws with the
/// reason: refused (and why), timed out, or aborted (the coordinator's message).
Roster rendezvous(const std::string& address, uint16_t port, const Secret& secret, const JobId& job,
                  const JoinRequest& request, std::chrono::milliseconds timeout,
                  std::chrono::milliseconds heartbeatInterval = std::chrono::seconds(1));

}  // namespace weft::dist
