// Replicas of a transform average their variables in memory: every replicaSyncEvery updates
// each (exchangeWithReplicas), or at the end of an epoch (syncReplicas).
#include "dist/amp/AmpRuntime.h"

#include "core/Error.h"
#include "dist/amp/Payloads.h"
#include "dist/amp/RuntimeState.h"

#include <fmt/format.h>

#include <map>

namespace weft::amp {

Tensor Runtime::Impl::concatRows(const std::vector<Tensor>& parts) {
  std::vector<int64_t> dims = parts[0].shape().dims();
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.shape()[0];
  dims[0] = rows;
  Tensor out(parts[0].dtype(), Shape(dims));
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.bytes());
    dst += p.bytes();
  }
  return out;
}

std::vector<Tensor*> Runtime::Impl::trainedValues(NodeRt& n) {
  std::vector<Tensor*> values;
  for (Param& p : n.compiled->params) values.push_back(&n.compiled->session->variable(p.variable.node()));
  return values;
}

/// Every replicaSyncEvery updates a replica posts its variables; the last of a round to post
/// averages them, and each replica then moves to that average plus what it learned since it posted.
void Runtime::Impl::exchangeWithReplicas(NodeRt& n) {
  ReplicaGroup& g = *n.replicas;
  std::vector<Tensor*> mine = trainedValues(n);
  std::lock_guard<std::mutex> lock(g.mutex);
  if (n.postedRound >= 0 && g.averageRound >= n.postedRound) {
    for (size_t i = 0; i < mine.size(); ++i) {
      Tensor moved = g.average[i].clone();
      addInto(moved, *mine[i]);
      addInto(moved, scaled(n.postedValues[i], -1.0));
      mine[i]->copyFrom(moved);
    }
    n.postedRound = -1;
    n.postedValues.clear();
  }
  if (++n.updatesSinceSync < options.replicaSyncEvery || n.postedRound >= 0) return;
  n.updatesSinceSync = 0;
  n.postedRound = g.round;
  for (Tensor* v : mine) n.postedValues.push_back(v->clone());
  g.posted[static_cast<size_t>(n.replicaIndex)] = n.postedValues;
  if (++g.postedCount < g.members) return;
  g.average.clear();
  for (size_t i = 0; i < mine.size(); ++i) {
    Tensor sum;
    for (const auto& member : g.posted) addInto(sum, member[i]);
    g.average.push_back(scaled(sum, 1.0 / g.members));
  }
  g.averageRound = g.round++;
  ++g.rounds;
  g.postedCount = 0;
}

void Runtime::syncReplicas() {
  std::map<ReplicaGroup*, std::vector<NodeRt*>> groups;
  for (NodeRt& n : impl_->nodes)
    if (n.replicas != nullptr) groups[n.replicas].push_back(&n);
  for (auto& [group, members] : groups) {
    std::vector<std::vector<Tensor*>> values;
    for (NodeRt* m : members) values.push_back(impl_->trainedValues(*m));
    for (size_t i = 0; i < values[0].size(); ++i) {
      Tensor sum;
      for (auto& v : values) addInto(sum, *v[i]);
      Tensor mean = scaled(sum, 1.0 / static_cast<double>(members.size()));
      for (auto& v : values) v[i]->copyFrom(mean);
    }
    for (NodeRt* m : members) m->postedRound = -1, m->postedValues.clear(), m->updatesSinceSync = 0;
    group->postedCount = 0;
  }
}

}  // namespace weft::amp
