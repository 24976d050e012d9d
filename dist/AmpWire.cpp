#include "dist/AmpWire.h"

#include "core/Error.h"
#include "dist/Wire.h"

#include <bit>
#include <cstring>

namespace weft::amp {
namespace {

constexpr uint8_t kLastDType = static_cast<uint8_t>(DType::F16);

void putState(dist::WireWriter& w, const State& s) {
  w.putI64(s.instance);
  for (int32_t field : {s.step, s.iteration, s.item, s.slot}) w.putU32(static_cast<uint32_t>(field));
}

State getState(dist::WireReader& r) {
  State s;
  s.instance = r.getI64("instance");
  s.step = static_cast<int32_t>(r.getU32("step"));
  s.iteration = static_cast<int32_t>(r.getU32("iteration"));
  s.item = static_cast<int32_t>(r.getU32("item"));
  s.slot = static_cast<int32_t>(r.getU32("slot"));
  return s;
}

void putDouble(dist::WireWriter& w, double v) { w.putU64(std::bit_cast<uint64_t>(v)); }
double getDouble(dist::WireReader& r, const char* field) { return std::bit_cast<double>(r.getU64(field)); }

void putTensorType(dist::WireWriter& w, const Tensor& t) {
  w.putU8(static_cast<uint8_t>(t.dtype()));
  w.putShape(t.shape());
}

/// A tensor of the type read from `r` over `bytes`, which must be exactly its size.
Tensor getTensor(dist::WireReader& r, std::span<const uint8_t> bytes, const char* what) {
  uint8_t code = r.getU8("dtype");
  WEFT_CHECK(code <= kLastDType, "amp message: {} has dtype code {}, which is no dtype", what, code);
  Shape shape = r.getShape("shape");
  WEFT_CHECK(shape.isFullyDefined(), "amp message: {} has the shape {}, with an unknown dimension", what, shape.str());
  const auto dtype = static_cast<DType>(code);
  WEFT_CHECK(shape.bytes(dtypeSize(dtype)) == bytes.size(), "amp message: {} is {}{} but carries {} bytes", what,
             dtypeName(dtype), shape.str(), bytes.size());
  Tensor t(dtype, shape);
  if (!bytes.empty()) std::memcpy(t.raw(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

std::pair<std::vector<uint8_t>, std::vector<uint8_t>> encode(const WireMessage& m) {
  dist::WireWriter w;
  w.putU8(static_cast<uint8_t>(m.kind));
  std::vector<uint8_t> payload;
  switch (m.kind) {
    case WireKind::Forward:
    case WireKind::Backward:
      w.putU32(static_cast<uint32_t>(m.node));
      w.putU32(static_cast<uint32_t>(m.port));
      putState(w, m.state);
      w.putU64(m.credit);
      w.putU8(m.tensor.defined() ? 1 : 0);
      if (m.tensor.defined()) {
        putTensorType(w, m.tensor);
        const auto* bytes = static_cast<const uint8_t*>(m.tensor.raw());
        payload.assign(bytes, bytes + m.tensor.bytes());
      }
      break;
    case WireKind::Credit:
      w.putI64(m.state.instance);
      w.putU64(m.credit);
      putDouble(w, m.loss);
      putDouble(w, m.hits);
      putDouble(w, m.count);
      break;
    case WireKind::Update: w.putI64(m.instances); break;
    case WireKind::EpochEnd:
      putDouble(w, m.loss);
      putDouble(w, m.hits);
      putDouble(w, m.count);
      break;
    case WireKind::Updated: break;
    case WireKind::Report: payload = m.report; break;
    case WireKind::Failed: w.putString(m.reason); break;
  }
  return {w.take(), std::move(payload)};
}

WireMessage decode(const std::vector<uint8_t>& header, const std::vector<uint8_t>& payload) {
  dist::WireReader r(header, "AMP");
  WireMessage m;
  uint8_t kind = r.getU8("kind");
  WEFT_CHECK(kind >= 1 && kind <= static_cast<uint8_t>(WireKind::Failed), "amp message: kind {} is unknown", kind);
  m.kind = static_cast<WireKind>(kind);
  switch (m.kind) {
    case WireKind::Forward:
    case WireKind::Backward:
      m.node = static_cast<int32_t>(r.getU32("node"));
      m.port = static_cast<int32_t>(r.getU32("port"));
      m.state = getState(r);
      m.credit = r.getU64("credit");
      if (r.getU8("has_tensor") != 0) m.tensor = getTensor(r, payload, "the payload");
      else WEFT_CHECK(payload.empty(), "amp message: {} bytes of payload without a tensor", payload.size());
      break;
    case WireKind::Credit:
      m.state.instance = r.getI64("instance");
      m.credit = r.getU64("credit");
      m.loss = getDouble(r, "loss");
      m.hits = getDouble(r, "hits");
      m.count = getDouble(r, "count");
      break;
    case WireKind::Update: m.instances = r.getI64("instances"); break;
    case WireKind::EpochEnd:
      m.loss = getDouble(r, "loss");
      m.hits = getDouble(r, "hits");
      m.count = getDouble(r, "count");
      break;
    case WireKind::Updated: break;
    case WireKind::Report: m.report = payload; break;
    case WireKind::Failed: m.reason = r.getString("reason"); break;
  }
  WEFT_CHECK(m.kind == WireKind::Report || m.kind == WireKind::Forward || m.kind == WireKind::Backward || payload.empty(),
             "amp message: kind {} carries {} bytes of payload", kind, payload.size());
  r.finish();
  return m;
}

std::vector<uint8_t> encodeReport(const ProcessReport& report) {
  dist::WireWriter w;
  w.putU32(static_cast<uint32_t>(report.nodes.size()));
  for (const auto& n : report.nodes) {
    w.putU32(static_cast<uint32_t>(n.node));
    for (int64_t v : {n.forwards, n.backwards, n.updates, n.gradients, n.stalenessSum, n.stalenessMax, n.stalenessCount})
      w.putI64(v);
    putDouble(w, n.busy);
    w.putU32(static_cast<uint32_t>(n.sent.size()));
    for (size_t o = 0; o < n.sent.size(); ++o) w.putI64(n.sent[o]), w.putI64(n.answered[o]);
  }
  w.putU32(static_cast<uint32_t>(report.workerBusy.size()));
  for (double b : report.workerBusy) putDouble(w, b);
  w.putU32(static_cast<uint32_t>(report.variables.size()));
  for (const auto& [name, t] : report.variables) {
    w.putString(name);
    putTensorType(w, t);
    w.putBytes({static_cast<const uint8_t*>(t.raw()), t.bytes()});
  }
  return w.take();
}

ProcessReport decodeReport(const std::vector<uint8_t>& payload) {
  dist::WireReader r(payload, "AMP report");
  ProcessReport report;
  for (uint32_t i = r.getCount("nodes", 64); i > 0; --i) {
    ProcessReport::NodeCounts n;
    n.node = static_cast<int32_t>(r.getU32("node"));
    for (int64_t* v : {&n.forwards, &n.backwards, &n.updates, &n.gradients, &n.stalenessSum, &n.stalenessMax, &n.stalenessCount})
      *v = r.getI64("count");
    n.busy = getDouble(r, "busy");
    for (uint32_t o = r.getCount("outputs", 16); o > 0; --o) n.sent.push_back(r.getI64("sent")), n.answered.push_back(r.getI64("answered"));
    report.nodes.push_back(std::move(n));
  }
  for (uint32_t i = r.getCount("workers", 8); i > 0; --i) report.workerBusy.push_back(getDouble(r, "busy"));
  for (uint32_t i = r.getCount("variables", 13); i > 0; --i) {
    std::string name = r.getString("name");
    dist::WireWriter typeOnly;  // the type precedes the bytes; read both, then build
    uint8_t code = r.getU8("dtype");
    Shape shape = r.getShape("shape");
    std::vector<uint8_t> bytes = r.getBytes("bytes");
    typeOnly.putU8(code);
    typeOnly.putShape(shape);
    dist::WireReader typeReader(typeOnly.bytes(), "AMP report");
    report.variables.push_back({name, getTensor(typeReader, bytes, name.c_str())});
  }
  r.finish();
  return report;
}

}  // namespace weft::amp
