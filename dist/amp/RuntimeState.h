// The AMP runtime's state, shared by the files that implement it (not a public header): what each
// node holds between messages, the tasks and queues of the workers, the instances in flight, and
// `Runtime::Impl`, whose members are defined by responsibility:
//
//     NodeSemantics.cpp  forward, backward and update of each node kind
//     Scheduling.cpp     the workers' queues and loop, credit and completion of instances
//     ProcessLink.cpp    messages between processes, failures, the followers' epoch protocol
//     Replicas.cpp       replicas averaging their variables
//     Reports.cpp        epoch reports, stall reports
//     AmpRuntime.cpp     construction, the controller's epoch, checkpoints' variables
#pragma once

#include "amp/AmpGraph.h"
#include "dist/amp/AmpRuntime.h"
#include "dist/amp/AmpWire.h"
#include "dist/amp/CompiledNode.h"
#include "dist/transport/Message.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace weft::amp {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// The trace track of a worker ("amp worker 3"), for core/Trace.h.
const char* workerTrack(int worker);

/// What a node keeps of a forward message until its backward message comes.
struct Kept {
  std::vector<Tensor> tensors;
  std::vector<State> states;
  std::vector<int64_t> widths;
  int origin = 0;
  int64_t version = 0;
};

/// Messages of one state (or one group key) arriving on several inputs, or several gradients
/// answering one message.
struct Join {
  std::vector<Tensor> parts;
  std::vector<State> states;
  std::vector<int64_t> order;
  int arrived = 0;
  int expected = 0;
  Credit credit{};  // what the held messages carried
};

struct ReplicaGroup {
  std::mutex mutex;
  int members = 0;
  int64_t round = 0;
  std::vector<std::vector<Tensor>> posted;  // per member, this round
  int postedCount = 0;
  std::vector<Tensor> average;
  int64_t averageRound = -1;
  std::atomic<int64_t> rounds{0};  // averages made, since the last report
};

struct NodeRt {
  const amp::Node* spec = nullptr;
  int worker = 0;
  std::unique_ptr<Compiled> compiled;
  std::unordered_map<State, Kept, StateHash> kept;
  std::unordered_map<State, Join, StateHash> joins;        // forward joins (concat, transforms, groups)
  std::unordered_map<State, Join, StateHash> gradJoins;    // backward joins (broadcast, split, flatmap, ungroup)
  std::unordered_map<State, std::pair<State, int>, StateHash> parentOf;  // ungroup / flatmap children
  int minUpdateFrequency = 1;
  int64_t updates = 0;
  int64_t gradientsSinceUpdate = 0;
  std::unordered_set<int64_t> instancesSinceUpdate;
  // replicas
  ReplicaGroup* replicas = nullptr;
  int replicaIndex = 0;
  int64_t updatesSinceSync = 0;
  int64_t postedRound = -1;
  std::vector<Tensor> postedValues;
  // counts since the last report
  std::vector<int64_t> sent, answered;  // per output: forward messages sent, backward ones received
  int64_t forwards = 0, backwards = 0, gradients = 0, updatesReported = 0;
  int64_t stalenessSum = 0, stalenessMax = 0, stalenessCount = 0;
  double busy = 0;
};

struct Task {
  enum class Kind { Forward, Backward, Update } kind = Kind::Forward;
  int node = 0;
  int port = 0;  // forward: the input it arrives on; backward: the output it answers
  Tensor payload;
  State state;
  Credit credit{};  // the share of its instance's credit (see Flow)
};

/// An instance starts with the whole credit (1), which every message of it carries a share of
/// (an exact dyadic fraction, dist/amp/AmpWire.h): a task's credit is split among the messages it
/// sends, held with a message that waits in a join (and merged when the join completes), and
/// returned to the controller by a task that sends nothing. The controller has the whole credit
/// back exactly when nothing of the instance is left anywhere, in this process or another
/// (termination detection by weight throwing).
/// What the task being processed produces: its credit, the messages it sends and the loss it
/// measured. The worker splits the credit and sends the messages after the node returns.
struct Flow {
  Credit credit;
  std::vector<Task> out;
  double loss = 0, hits = 0, count = 0;
  bool measured = false;
};

/// The flow of the task this thread is running (null outside one).
extern thread_local Flow* currentFlow;

struct Worker {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<Task> forward, backward, control;
  std::thread thread;
  double busy = 0;
  std::atomic<int> currentNode{-1};
  std::atomic<int64_t> currentSince{0};
};

struct InstanceRecord {
  std::mutex mutex;  // guards `data`, which another process's instance gets on first use
  std::shared_ptr<const Instance> data;
  Credit returned;  // credit back at the controller (under the controller's lock)
  double loss = 0, hits = 0, count = 0;
};


/// Instances active at the controller over an epoch: their peak and the time integral of their
/// count, which give the report's peak and mean.
struct Activity {
  Clock::time_point lastChange;
  int active = 0, peak = 0;
  double activeTime = 0;

  void change(int delta) {
    const Clock::time_point now = Clock::now();
    activeTime += active * seconds(now - lastChange);
    lastChange = now;
    active += delta;
    peak = std::max(peak, active);
  }
};

struct Runtime::Impl {
  Graph& graph;
  AmpOptions options;
  AmpProcesses processes;
  std::vector<NodeRt> nodes;
  std::vector<std::unique_ptr<Worker>> workers;  // this process's
  std::deque<ReplicaGroup> replicaGroups;
  std::atomic<bool> stopping{false};
  bool training = true;

  // the run in progress
  std::vector<std::unique_ptr<InstanceRecord>> records;
  const std::function<Pumped(int64_t)>* make = nullptr;
  int64_t firstInstance = 0, nextInstanceId = 0;
  std::mutex doneMutex;
  std::condition_variable doneChanged;
  std::vector<int64_t> finished;
  std::atomic<int64_t> outstandingTasks{0};
  std::atomic<int64_t> processed{0};
  std::string failure;
  int64_t stuckInstance = -1;

  // between processes (processes.count > 1): a thread owns the transport
  std::thread comm;
  std::atomic<bool> commStopping{false}, commEnded{false};
  std::mutex outboxMutex;
  std::vector<std::pair<int, WireMessage>> outbox;       // (rank, message)
  std::deque<std::pair<int, WireMessage>> controlInbox;  // epoch protocol, for the main thread
  std::vector<std::vector<uint8_t>> reports;             // per rank, this epoch's
  std::map<std::string, Tensor> remoteVariables;
  WireMessage epochTotals;  // the controller's loss and accuracy of the epoch (another process)

  Impl(Graph& g, AmpOptions o, AmpProcesses p) : graph(g), options(std::move(o)), processes(std::move(p)) {}

  int globalWorkers() const { return options.workers * processes.count; }
  int processOf(int worker) const { return worker / options.workers; }
  bool isLocal(const NodeRt& n) const { return processOf(n.worker) == processes.rank; }
  Worker& localWorker(const NodeRt& n) { return *workers[static_cast<size_t>(n.worker % options.workers)]; }

  // ---- node behaviour (NodeSemantics.cpp) ----

  void process(NodeRt& n, Task& t);
  void forward(NodeRt& n, const Task& t);
  void backward(NodeRt& n, const Task& t);
  void transformForward(NodeRt& n, const Task& t);
  void transformBackward(NodeRt& n, const Task& t);
  void lossForward(NodeRt& n, const Task& t);
  void groupForward(NodeRt& n, const Task& t);
  void expandForward(NodeRt& n, const Task& t);
  void expandBackward(NodeRt& n, const Task& t);
  /// Applies the mean per instance of the gathered gradients: over the `instances` of a synchronous
  /// minibatch (those that never reached this node add zero), or, asynchronously, over the
  /// instances the gradients came from.
  void update(NodeRt& n, int64_t instances = 0);
  Kept takeKept(NodeRt& n, const State& s, const char* what);
  void keep(NodeRt& n, const State& s, Kept k);
  /// Collects one message per input for state s; true (and the payloads) once all arrived.
  bool joinInputs(NodeRt& n, const Task& t, std::vector<Tensor>& payloads);
  FeedMap feedsFor(const Compiled& c, const std::vector<Tensor>& payloads, const std::vector<Tensor>& stateValues);
  std::vector<Tensor> stateValues(const NodeRt& n, const State& s);
  static Shape partShape(const amp::Node& spec, size_t missing, const std::vector<Tensor>& parts);

  // ---- replicas (Replicas.cpp) ----

  /// Every replicaSyncEvery updates a replica posts its variables; the last of a round to post
  /// averages them, and each replica then moves to that average plus what it learned since it posted.
  void exchangeWithReplicas(NodeRt& n);
  std::vector<Tensor*> trainedValues(NodeRt& n);
  static Tensor concatRows(const std::vector<Tensor>& parts);

  // ---- workers, messages and credit (Scheduling.cpp) ----

  void workerLoop(int index);
  /// Sends a node's task to its worker's queue, here or in another process; inside a task, after
  /// the task (finishFlow).
  void push(int node, Task task);
  void dispatch(Task task);
  void sendForward(int node, int output, Tensor payload, const State& state);
  void sendBackward(const amp::Node& node, int input, Tensor grad, const State& state);
  /// Sends what a task produced, each message with a share of its credit; a task that sent
  /// nothing returns its credit, and what a loss measured goes to the controller either way.
  /// A measured loss returns with a share of its own, so the instance cannot finish before the
  /// controller has its loss.
  void finishFlow(Flow& flow, const State& state);
  void giveBack(int64_t instance, Credit credit, const Flow& measured);
  /// A message that waits in a join keeps its credit there until the join completes.
  void hold(Join& j);
  void release(Join& j);
  InstanceRecord& record(int64_t instance);
  /// The data of an instance; a process other than the controller's makes it on first use, as
  /// the controller did (every process's model makes the same instances).
  const Instance& instanceOf(const State& s);
  void queueUpdates(int64_t instances);
  void stopWorkers();
  std::vector<NodeRt*> parameterised();

  // ---- between processes (ProcessLink.cpp) ----

  /// Stops the run with `message` (the first failure wins); another process's failure also goes
  /// to the controller, which stops every process.
  void fail(std::string message);
  /// Sends a failure on: from a process to the controller, from the controller to every process.
  void tellFailure(const std::string& message);
  void post(int rank, WireMessage m);
  /// The transport's thread: sends what the workers and the controller posted, and hands what
  /// arrives to the workers (node messages), the controller (credit) or the main thread (the
  /// epoch protocol).
  void commLoop();
  int rankOfPeer(int peer) const;
  void receive(const dist::Message& raw);
  /// Waits (the main thread) for the first message of the epoch protocol of one of `kinds`; a
  /// failure anywhere throws it. Messages from different processes (and, over UCX, from one) may
  /// come in any order, so others wait their turn.
  std::pair<int, WireMessage> nextControl(std::unique_lock<std::mutex>& lock, std::initializer_list<WireKind> kinds);
  /// A follower's epoch: it answers the controller's updates and reports at the end.
  void followEpoch();

  // ---- reports (Reports.cpp) ----

  EpochReport summarise(int64_t count, Clock::time_point start, double activeTime, int peak);
  ProcessReport localReport();
  /// Why nothing moves: the worker busy in one node the longest, or the nodes holding messages
  /// that wait for others which will never come.
  std::string stallReport();
  /// The messages of `instance` (all, when -1) that nodes hold; read after the workers stopped.
  std::string heldMessages(int64_t instance);

  // ---- the controller (AmpRuntime.cpp) ----

  EpochReport runEpoch(int64_t count, const std::function<Pumped(int64_t)>& make, bool train);
  void beginEpoch(int64_t count, const std::function<Pumped(int64_t)>& make, bool train);
  EpochReport runFollowerEpoch(int64_t count, Clock::time_point start);
  /// Pumps the epoch's instances in and collects them (with a minibatch's updates between
  /// minibatches); returns with `failure` set when the epoch cannot end.
  void controlEpoch(std::unique_lock<std::mutex>& lock, int64_t count, Activity& activity);
  void pumpInstance(int64_t index, Activity& activity);
  /// Every process's transforms update on the last `instances` instances; returns when they did.
  void updateEverywhere(std::unique_lock<std::mutex>& lock, int64_t instances);
  /// Names the first instance that cannot finish (its messages wait for partners).
  void failStuck(int64_t pumped);
  [[noreturn]] void throwFailure(std::unique_lock<std::mutex>& lock);
  /// The transform whose variable `variable` ("node/variable") is; throws naming it when none is.
  const NodeRt& transformOwning(const std::string& variable) const;
  /// Sets this process's transforms' variables to `given`, which must be exactly theirs.
  void restoreLocal(const std::vector<std::pair<std::string, Tensor>>& given);
  void checkDrained();
};

}  // namespace weft::amp
