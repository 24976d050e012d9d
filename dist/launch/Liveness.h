// What a member's heartbeats say about its main thread: a progress counter that moves whenever
// the main thread finishes a wait on a peer (and at every step), whether it is waiting on a peer
// now, and its scheduler state from /proc. The launcher compares these across members to name
// the one that actually stopped: a member whose main thread makes no progress while computing
// (or while stopped) and whose peers all wait, rather than the peer that gave up waiting first.
//
//   auto transport = watchWaits(std::make_unique<UcxTransport>(identity));  // its waits are recorded
//   Heartbeat::Sampler sampler = sampleMainThread;                  // what each beat reports
#pragma once

#include "dist/launch/Coordinator.h"
#include "dist/transport/Transport.h"

#include <memory>

namespace weft::dist {

/// Marks the calling thread as the process's main thread (the one whose state beats report).
void markMainThread();
/// The main thread moved on (a step or a wait finished).
void noteProgress();
/// The main thread waits on a peer while one of these lives.
class WaitingOnPeer {
 public:
  WaitingOnPeer();
  ~WaitingOnPeer();
  WaitingOnPeer(const WaitingOnPeer&) = delete;
  WaitingOnPeer& operator=(const WaitingOnPeer&) = delete;
};
/// The main thread's progress, whether it waits, and its state ('R' running, 'S' sleeping, 'D'
/// in the kernel, 'T' stopped, 't' stopped by a tracer, '?' unknown).
MainThreadSample sampleMainThread();

/// A transport whose waits (sends, receives, exchanges, waiting for activity) are recorded as
/// the main thread's waits and progress.
std::unique_ptr<Transport> watchWaits(std::unique_ptr<Transport> inner);

}  // namespace weft::dist
