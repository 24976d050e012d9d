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
//   HEARTBEAT {progress u64, waiting u8, main_thread u8} (member -> coordinator, every second
//           from the roster on): the member's main-thread progress counter, whether its main
//           thread is waiting on a peer, and that thread's scheduler state ('R', 'S', 'D', 't' ...)
//   LEAVE  {} (member -> coordinator): the member finished its part of the job; its connection
//           closing after it is no failure
//   ABORT  after the roster too (coordinator -> member): the job stops, and why (stopJob)
//   CHECKPOINT {reason string} (coordinator -> member, after the roster): the launcher asks the
//           job to stop at its next step with a checkpoint, to start it again at another size
//           (requestCheckpoint; an elastic job whose lost host came back)
//
// Every frame after the handshake, either way, is sealed (ControlSeal, dist/transport/Auth.h): its payload
// ends with an HMAC over its place on the connection, its type and its payload, under a key of
// the connection and direction. A frame that fails it ends the connection: the coordinator
// treats the member as gone, the member its coordinator.
//
// Admission under load: the coordinator serves every connection in its admission from one loop,
// reading frames as they arrive, so a connection that says nothing costs a socket and no thread.
// A connection must prove the secret within 2 s; until it has, it sits in a waiting room of 2,048
// connections, of which one source address may hold half. When the room (or the
// source's half) is full, the oldest connection in it is dropped for the new one, so a flood of
// silent connections at hundreds a second is held for the whole 2 s and cannot keep members out.
// A connection that proved the secret is never dropped. A member told "busy" or "timed out",
// or whose connection closed after its JOIN, tries again with backoff until its own deadline;
// a JOIN on a new connection replaces one whose connection closed. Refused connections are
// logged, at most a few lines a second (dist/transport/LogLimit.h).
//
// After the rendezvous each member keeps its connection and sends heartbeats on it from a
// background thread; the coordinator records what each said and when, on a clock that leaves out
// the coordinator's own scheduling gaps (a paused launcher, a machine too busy to run it), so the
// launcher can tell a member that stopped from a job or machine that paused as a whole. A member
// that sees its connection close has lost its launcher: its heartbeat reports it (joinJob ends
// the process), so no member outlives its job.
#pragma once

#include "dist/transport/Auth.h"
#include "dist/launch/ResourceSpec.h"

#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>
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

/// What the coordinator knows of a member after the rendezvous. Durations are measured on the
/// coordinator's awake clock: time in which the coordinator itself was not scheduled (its
/// process paused, or starved by a busy machine) does not count.
struct MemberLiveness {
  std::chrono::milliseconds silence{0};  ///< since its last heartbeat (or its roster)
  std::chrono::milliseconds stalled{0};  ///< since its progress counter last moved
  /// How long it has beaten without a gap of more than kSteadyGap (0 while silent that long):
  /// a member that beat steadily while another was silent shows that the job was not paused.
  std::chrono::milliseconds steady{0};
  bool connected = true;  ///< false once its connection closed
  std::chrono::milliseconds closedFor{0};  ///< since its connection closed (0 while connected)
  bool left = false;      ///< it sent LEAVE: it finished its part
  uint64_t progress = 0;  ///< its main thread's progress counter
  bool waiting = false;   ///< its main thread was waiting on a peer
  /// Some beat since its progress counter last moved found it waiting on a peer: it waited
  /// through this stall, and if no longer waiting, gave up (a wait that ends moves the counter).
  bool waitedWhileStalled = false;
  char mainThread = '?';  ///< its main thread's scheduler state
};

/// The longest gap between a member's heartbeats (one a second) that still counts as steady.
inline constexpr std::chrono::milliseconds kSteadyGap{2500};

/// What a member's heartbeat reports of its main thread (see dist/launch/Liveness.h).
struct MainThreadSample {
  uint64_t progress = 0;
  bool waiting = false;
  char state = '?';
};

/// What every member receives.
struct Roster {
  int rank = 0;
  int worldSize = 0;
  std::vector<Member> members;           ///< indexed by rank
  std::vector<uint8_t> ncclId;           ///< empty when worker rank 0 sent none
  std::shared_ptr<Heartbeat> heartbeat;  ///< beats while a copy of the roster holds it
};

/// Serves one rendezvous in a background thread from construction on. Bad connections (no or a
/// wrong secret, another job, malformed frames, silence past the handshake timeout, unexpected or
/// duplicate members) are refused, logged to stderr, and do not disturb the others.
/// How a coordinator admits connections.
struct AdmissionLimits {
  /// Bounds each connection's way from accept to JOIN.
  std::chrono::milliseconds handshakeTimeout{5000};
  /// Bounds its way to proving the secret (or handshakeTimeout, if shorter): a member answers at
  /// once, and one too slow on a busy machine is told "timed out" and tries again.
  std::chrono::milliseconds answerTimeout{2000};
  /// The connections held while they owe their answer, where the limit on open files allows (the
  /// coordinator raises its soft limit up to the hard one for them); one source may hold half.
  size_t waitingRoom = 2048;
};

class Coordinator {
 public:
  /// Listens on spec.bind() at spec.coordinatorPort() (0: any free port). `timeout` bounds the
  /// whole rendezvous.
  Coordinator(const ResourceSpec& spec, const Secret& secret, const JobId& job, std::vector<MemberId> expected,
              std::chrono::milliseconds timeout, AdmissionLimits limits = {});
  /// Stops serving; members still waiting see their connection close.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  /// The port it listens on.
  uint16_t port() const;
  /// How many connections owing their answer one source address may hold: half of the waiting
  /// room (AdmissionLimits::waitingRoom, or fewer where the limit on open files is lower).
  size_t waitingShare() const;
  /// Blocks until every member got its roster and returns the members by rank; throws the
  /// message the members got in ABORT when the rendezvous timed out.
  std::vector<Member> wait();
  /// Once the rosters went out: what each member's heartbeats said. Empty before.
  std::map<MemberId, MemberLiveness> liveness() const;
  /// Tells every member still connected that the job stops, and why (they print it and end).
  void stopJob(const std::string& reason);
  /// Asks every member still connected to stop at its next step with a checkpoint, and why
  /// (their heartbeats hand it to HeartbeatOptions::onCheckpoint).
  void requestCheckpoint(const std::string& reason);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// A member's heartbeats: a background thread sends one every `interval` on the member's
/// coordinator connection until destroyed. When the connection closes or fails (the launcher
/// ended or was killed), or the coordinator stops the job (ABORT), it calls `onLost` once with
/// the reason and stops beating. `sample` reports the main thread's state for each beat (none:
/// zeros). A member that ends without leaving waits up to `verdictWait` in the destructor for
/// the coordinator's ABORT: where another member's end caused this one's failure, the verdict
/// names that member (and onLost ends the process with its status). The coordinator's
/// CHECKPOINT goes to `onCheckpoint` (from the beating thread), and the beats go on.
class Heartbeat {
 public:
  using LostHandler = std::function<void(const std::string& reason)>;
  using Sampler = std::function<MainThreadSample()>;
  /// Owns `fd`, whose frames `seal` seals (dist/transport/Auth.h).
  Heartbeat(int fd, ControlSeal seal, const JobId& job, std::chrono::milliseconds interval, LostHandler onLost = {},
            Sampler sample = {}, std::chrono::milliseconds verdictWait = {}, LostHandler onCheckpoint = {});
  /// Whether the coordinator connection was lost.
  bool lost() const;
  /// Tells the coordinator that this member finished its part (LEAVE); from then on the
  /// connection closing is expected, not a loss. Returns once it was sent (or could not be).
  void leave();
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// How a member's heartbeats go (see Heartbeat).
struct HeartbeatOptions {
  std::chrono::milliseconds interval{1000};
  Heartbeat::LostHandler onLost;
  Heartbeat::Sampler sample;
  std::chrono::milliseconds verdictWait{0};
  Heartbeat::LostHandler onCheckpoint;  ///< the coordinator's CHECKPOINT, with its reason
};

/// The member side: connects to the coordinator, authenticates, joins, and returns the roster,
/// whose `heartbeat` keeps the connection and beats. A connection dropped or timed out before
/// the coordinator admitted it (a coordinator busy with a flood of connections) is tried again
/// with backoff until `timeout`; so is a coordinator not listening yet, or whose host name does not
/// resolve yet, when `coordinatorMayComeLater` (a cluster engine starts the job's first process,
/// which serves the rendezvous, no earlier than the others). Throws with the reason: nothing
/// listening (the launcher is gone), refused (and why), timed out, or aborted (the coordinator's
/// message).
Roster rendezvous(const std::string& address, uint16_t port, const Secret& secret, const JobId& job,
                  const JoinRequest& request, std::chrono::milliseconds timeout, HeartbeatOptions heartbeat = {},
                  bool coordinatorMayComeLater = false);

}  // namespace weft::dist
