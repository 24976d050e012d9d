// The parameter servers' synchronisation rule, in one object that ParameterServer,
// LocalAggregator and ServerClient consult instead of each writing it inline; what a server does
// with a partition's pushes under it is the strategy it makes (makeUpdates). A sender's clock
// for a partition counts the gradients it has pushed there; a partition's version counts the
// updates applied to it. The rule says when a server takes a push, when the pushes of a version
// are complete, when a pull may be answered, what a machine's aggregator may keep and forward,
// and what a worker may assume about values it has pulled.
//
// BSP (bulk synchronous parallel, the sparsity-aware Parallax paper's mode): every sender
// pushes each partition once per version, the update waits for all of them, and a pull for
// clock c waits for version c, so every worker reads what one process would.
//
// The asynchronous modes of the DSSP paper: each sender's push is an update of its own, applied
// as soon as its sender's APPLY (with that sender's extras: learning rate, step, clipping scale)
// arrives, and a pull reads the partition as it is. ASP answers every pull at once; SSP(s) and
// DSSP [s_L, s_U] hold a sender's pull while it is too far ahead of the slowest sender (a
// StalenessGate per partition, dist/server/Staleness.h). There the rules below read `version` as the
// sender's own updates applied, and the pushes of an update are its sender's alone.
#pragma once

#include "dist/server/Staleness.h"

#include <cstdint>
#include <memory>
#include <string>

namespace weft::dist {

class PartitionUpdates;

class SyncPolicy {
 public:
  virtual ~SyncPolicy() = default;
  /// "BSP", "ASP", "SSP(s=3)", "DSSP(s_L=3, s_U=15)", for messages.
  virtual std::string name() const = 0;
  /// Whether an update aggregates one push of every sender (BSP).
  virtual bool synchronous() const = 0;
  /// Asynchronous modes: the gate of one partition's `senders` senders; nullptr when pulls never
  /// wait for other senders (ASP).
  virtual std::unique_ptr<StalenessGate> makeGate(int senders) const = 0;
  /// Server: how one partition of `senders` senders turns their pushes into updates, with the
  /// state that takes (dist/server/PartitionUpdates.h). The policy must outlive what it makes.
  virtual std::unique_ptr<PartitionUpdates> makeUpdates(int senders) const = 0;
  /// The most clocks a sender may be ahead of the slowest when its pull is answered; -1 when
  /// unbounded (ASP); 0 under BSP.
  virtual int64_t stalenessBound() const = 0;

  /// Server: throws, saying why, when a push for `clock` cannot be taken at `version`.
  virtual void checkPush(uint64_t clock, uint64_t version) const = 0;
  /// Server: whether `pushed` of the `senders` pushes of a version are all the update waits for.
  virtual bool pushesComplete(int pushed, int senders) const = 0;
  /// Server: throws, saying why, when worker 0's APPLY for `clock` cannot run at `version`.
  virtual void checkApply(uint64_t clock, uint64_t version) const = 0;
  /// Server: throws, saying why, when a pull for `clock` asks further ahead of `version` than
  /// any worker can be (so no sender can queue pulls without bound).
  virtual void checkPull(uint64_t clock, uint64_t version) const = 0;
  /// Server: whether a pull for `clock` may be answered at `version` (otherwise it waits).
  virtual bool pullReady(uint64_t clock, uint64_t version) const = 0;

  /// Aggregator: whether a machine's pushes for a clock go out once `pushed` of its `members`
  /// workers have pushed.
  virtual bool machinePushReady(int pushed, int members) const = 0;
  /// Aggregator: the oldest clock whose pulled values a pull for `clock` may still read; what it
  /// keeps of older ones is dropped.
  virtual uint64_t oldestReadable(uint64_t clock) const = 0;

  /// Client: whether the servers' values stay as a worker last pulled them until that worker
  /// pushes again (so a worker that pulled every variable may read its local copy till then).
  virtual bool valuesWaitForOwnPush() const = 0;
};

/// Bulk synchronous parallel: every sender pushes once per version, and pulls for clock c see
/// version c exactly.
std::shared_ptr<const SyncPolicy> bspPolicy();
/// Asynchronous parallel: every push applied as it comes, no pull waits for another sender.
std::shared_ptr<const SyncPolicy> aspPolicy();
/// Stale synchronous parallel: a sender's pull waits while it is more than `staleness` clocks
/// ahead of the slowest sender.
std::shared_ptr<const SyncPolicy> sspPolicy(int staleness);
/// Dynamic SSP: `lower` clocks ahead, plus the extra iterations (up to `upper`) the DSSP
/// controller grants the fastest sender.
std::shared_ptr<const SyncPolicy> dsspPolicy(int lower, int upper);
/// "bsp", "asp", "ssp:S" or "dssp:SL:SU" (the --sync flag); throws naming the value otherwise.
std::shared_ptr<const SyncPolicy> parseSyncPolicy(const std::string& text);

}  // namespace weft::dist
