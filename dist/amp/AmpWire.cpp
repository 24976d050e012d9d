#include "dist/amp/AmpWire.h"

#include "core/Error.h"
#include "dist/transport/Wire.h"

#include <algorithm>
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

constexpr uint32_t kMaxCreditWords = 4096;

size_t bitLength(const std::vector<uint64_t>& w) {
  return w.empty() ? 0 : 64 * (w.size() - 1) + (64 - static_cast<size_t>(std::countl_zero(w.back())));
}

std::vector<uint64_t> shiftedLeft(const std::vector<uint64_t>& w, size_t bits) {
  std::vector<uint64_t> out(bits / 64, 0);
  const unsigned r = static_cast<unsigned>(bits % 64);
  uint64_t carry = 0;
  for (uint64_t word : w) {
    out.push_back((word << r) | carry);
    carry = r == 0 ? 0 : word >> (64 - r);
  }
  if (carry != 0) out.push_back(carry);
  return out;
}

void addInto(std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  if (a.size() < b.size()) a.resize(b.size(), 0);
  unsigned __int128 carry = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    carry += static_cast<unsigned __int128>(a[i]) + (i < b.size() ? b[i] : 0);
    a[i] = static_cast<uint64_t>(carry);
    carry >>= 64;
  }
  if (carry != 0) a.push_back(static_cast<uint64_t>(carry));
}

void putCredit(dist::WireWriter& w, const Credit& c) {
  w.putU32(c.exponent());
  w.putU32(static_cast<uint32_t>(c.words().size()));
  for (uint64_t word : c.words()) w.putU64(word);
}

Credit getCredit(dist::WireReader& r) {
  const uint32_t exponent = r.getU32("credit_exponent");
  const uint32_t count = r.getCount("credit_words", 8);
  WEFT_CHECK(count <= kMaxCreditWords, "amp message: a credit of {} words", count);
  std::vector<uint64_t> words;
  for (uint32_t i = 0; i < count; ++i) words.push_back(r.getU64("credit_word"));
  return Credit::fromParts(exponent, std::move(words));
}

}  // namespace

Credit Credit::whole() {
  Credit c;
  c.words_ = {1};
  return c;
}

Credit Credit::fromParts(uint32_t exponent, std::vector<uint64_t> words) {
  Credit c;
  c.exponent_ = exponent;
  c.words_ = std::move(words);
  const bool reduced = (c.words_.empty() && exponent == 0) ||
                       (!c.words_.empty() && c.words_.back() != 0 && (exponent == 0 || (c.words_[0] & 1) != 0));
  WEFT_CHECK(reduced, "amp message: credit {} words over 2^{} is not reduced", c.words_.size(), exponent);
  return c;
}

void Credit::reduce() {
  while (!words_.empty() && words_.back() == 0) words_.pop_back();
  if (words_.empty()) {
    exponent_ = 0;
    return;
  }
  size_t zeros = 0;
  while (words_[zeros / 64] == 0) zeros += 64;
  zeros += static_cast<size_t>(std::countr_zero(words_[zeros / 64]));
  const size_t drop = std::min<size_t>(zeros, exponent_);
  if (drop == 0) return;
  std::vector<uint64_t> out;
  const size_t skip = drop / 64;
  const unsigned r = static_cast<unsigned>(drop % 64);
  for (size_t i = skip; i < words_.size(); ++i) {
    uint64_t word = r == 0 ? words_[i] : (words_[i] >> r) | (i + 1 < words_.size() ? words_[i + 1] << (64 - r) : 0);
    out.push_back(word);
  }
  while (!out.empty() && out.back() == 0) out.pop_back();
  words_ = std::move(out);
  exponent_ -= static_cast<uint32_t>(drop);
}

bool Credit::exceedsWhole() const {
  const size_t bits = bitLength(words_);
  if (bits != exponent_ + size_t{1}) return bits > exponent_ + size_t{1};
  // The top bit is 2^exponent: more than 1 exactly when any lower bit is set.
  for (size_t i = 0; i + 1 < words_.size(); ++i)
    if (words_[i] != 0) return true;
  return (words_.back() & ~(uint64_t{1} << ((bits - 1) % 64))) != 0;
}

void Credit::add(const Credit& other) {
  if (other.empty()) return;
  if (empty()) {
    *this = other;
    return;
  }
  const uint32_t e = std::max(exponent_, other.exponent_);
  std::vector<uint64_t> a = shiftedLeft(words_, e - exponent_);
  addInto(a, shiftedLeft(other.words_, e - other.exponent_));
  words_ = std::move(a);
  exponent_ = e;
  reduce();
}

std::vector<Credit> Credit::split(size_t k) const {
  WEFT_CHECK(k >= 1 && !empty(), "amp: splitting credit {} ways", k);
  // Scale up until the integer is at least k, so every share is nonzero.
  const size_t kBits = 64 - static_cast<size_t>(std::countl_zero(static_cast<uint64_t>(k)));
  const size_t have = bitLength(words_);
  const size_t shift = have > kBits ? 0 : kBits - have + 1;
  std::vector<uint64_t> w = shiftedLeft(words_, shift);
  // Long division by k, from the top word down.
  std::vector<uint64_t> quotient(w.size(), 0);
  unsigned __int128 rest = 0;
  for (size_t i = w.size(); i-- > 0;) {
    rest = (rest << 64) | w[i];
    quotient[i] = static_cast<uint64_t>(rest / k);
    rest %= k;
  }
  std::vector<Credit> shares(k);
  for (Credit& c : shares) {
    c.words_ = quotient;
    c.exponent_ = exponent_ + static_cast<uint32_t>(shift);
  }
  addInto(shares[0].words_, {static_cast<uint64_t>(rest)});
  for (Credit& c : shares) c.reduce();
  return shares;
}

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
      putCredit(w, m.credit);
      w.putU8(m.tensor.defined() ? 1 : 0);
      if (m.tensor.defined()) {
        putTensorType(w, m.tensor);
        const auto* bytes = static_cast<const uint8_t*>(m.tensor.raw());
        payload.assign(bytes, bytes + m.tensor.bytes());
      }
      break;
    case WireKind::Credit:
      w.putI64(m.state.instance);
      putCredit(w, m.credit);
      putDouble(w, m.loss);
      putDouble(w, m.hits);
      putDouble(w, m.count);
      break;
    case WireKind::Update:
    case WireKind::Vote:
    case WireKind::Verdict:
      w.putI64(m.instances);
      break;
    case WireKind::Resume:
      w.putI64(m.instances);
      payload = m.report;
      break;
    case WireKind::EpochEnd:
      putDouble(w, m.loss);
      putDouble(w, m.hits);
      putDouble(w, m.count);
      break;
    case WireKind::Updated:
    case WireKind::Ready: break;
    case WireKind::Report: payload = m.report; break;
    case WireKind::Failed: w.putString(m.reason); break;
  }
  return {w.take(), std::move(payload)};
}

WireMessage decode(const std::vector<uint8_t>& header, const std::vector<uint8_t>& payload) {
  dist::WireReader r(header, "AMP");
  WireMessage m;
  uint8_t kind = r.getU8("kind");
  WEFT_CHECK(kind >= 1 && kind <= static_cast<uint8_t>(WireKind::Verdict), "amp message: kind {} is unknown", kind);
  m.kind = static_cast<WireKind>(kind);
  switch (m.kind) {
    case WireKind::Forward:
    case WireKind::Backward:
      m.node = static_cast<int32_t>(r.getU32("node"));
      m.port = static_cast<int32_t>(r.getU32("port"));
      m.state = getState(r);
      m.credit = getCredit(r);
      if (r.getU8("has_tensor") != 0) m.tensor = getTensor(r, payload, "the payload");
      else WEFT_CHECK(payload.empty(), "amp message: {} bytes of payload without a tensor", payload.size());
      break;
    case WireKind::Credit:
      m.state.instance = r.getI64("instance");
      m.credit = getCredit(r);
      m.loss = getDouble(r, "loss");
      m.hits = getDouble(r, "hits");
      m.count = getDouble(r, "count");
      break;
    case WireKind::Update: m.instances = r.getI64("instances"); break;
    case WireKind::Vote:
    case WireKind::Verdict:
      m.instances = r.getI64("vote");
      WEFT_CHECK(m.instances == 0 || m.instances == 1, "amp message: vote {}, not 0 or 1", m.instances);
      break;
    case WireKind::Resume:
      m.instances = r.getI64("position");
      WEFT_CHECK(m.instances >= 0, "amp message: resume at position {}", m.instances);
      m.report = payload;
      break;
    case WireKind::EpochEnd:
      m.loss = getDouble(r, "loss");
      m.hits = getDouble(r, "hits");
      m.count = getDouble(r, "count");
      break;
    case WireKind::Updated:
    case WireKind::Ready: break;
    case WireKind::Report: m.report = payload; break;
    case WireKind::Failed: m.reason = r.getString("reason"); break;
  }
  WEFT_CHECK(m.kind == WireKind::Report || m.kind == WireKind::Resume || m.kind == WireKind::Forward ||
                 m.kind == WireKind::Backward || payload.empty(),
             "amp message: kind {} carries {} bytes of payload", kind, payload.size());
  r.finish();
  return m;
}

std::vector<uint8_t> encodeReport(const ProcessReport& report) {
  dist::WireWriter w;
  w.putU32(static_cast<uint32_t>(report.nodes.size()));
  for (const auto& n : report.nodes) {
    w.putU32(static_cast<uint32_t>(n.node));
    for (int64_t v :
         {n.forwards, n.backwards, n.updates, n.gradients, n.stalenessSum, n.stalenessMax, n.stalenessCount})
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
    for (int64_t* v :
         {&n.forwards, &n.backwards, &n.updates, &n.gradients, &n.stalenessSum, &n.stalenessMax, &n.stalenessCount})
      *v = r.getI64("count");
    n.busy = getDouble(r, "busy");
    for (uint32_t o = r.getCount("outputs", 16); o > 0; --o)
      n.sent.push_back(r.getI64("sent")), n.answered.push_back(r.getI64("answered"));
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
