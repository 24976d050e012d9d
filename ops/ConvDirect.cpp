#include "ops/ConvDirect.h"

#include "ops/Simd.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace weft::detail {
namespace {

constexpr int64_t kTaps = 9;

using simd::kLanes;
using simd::load;
using simd::store;
using simd::Vec;

int64_t roundUp(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

/// Copies a short row inline, a vector at a time: rows are a few dozen values, and a library call
/// per row costs as much as the copy.
template <class T>
void copyRow(const T* src, int64_t n, T* dst) {
  int64_t x = 0;
  for (; x + kLanes<T> <= n; x += kLanes<T>) store(dst + x, load(src + x));
  for (; x < n; ++x) dst[x] = src[x];
}

/// Splits a row of n values whose first sits at column `first` of a padded row: the values at even
/// columns go to even[column / 2], those at odd columns to odd[column / 2]. Two strided runs, with
/// no division per value.
template <class T>
void deinterleave(const T* row, int64_t n, int64_t first, T* even, T* odd) {
  const int64_t x0 = first % 2;  // the first x whose column is even
  for (int64_t x = x0, to = (x0 + first) / 2; x < n; x += 2, ++to) even[to] = row[x];
  for (int64_t x = 1 - x0, to = (1 - x0 + first) / 2; x < n; x += 2, ++to) odd[to] = row[x];
}

/// The inverse: row[x] for n values from column `first` on, read from the even and odd columns.
template <class T>
void interleave(const T* even, const T* odd, int64_t n, int64_t first, T* row) {
  const int64_t x0 = first % 2;
  for (int64_t x = x0, from = (x0 + first) / 2; x < n; x += 2, ++from) row[x] = even[from];
  for (int64_t x = 1 - x0, from = (1 - x0 + first) / 2; x < n; x += 2, ++from) row[x] = odd[from];
}

/// What a forward tile needs of a flat layout: each tap's offset from its output position within
/// one input channel, the values per input channel, and the flat output positions computed.
struct Taps {
  int64_t count;
  int64_t offsets[kTaps];
  int64_t channelStride, outLen;
};

/// The flat padded layout of one 3x3 sweep over an (h, w) plane, at stride 1 or 2.
///
/// Stride 1: the padded image is stored row after row, `width` values each; output position
/// (oy, ox) is flat index q = oy * width + ox, and tap (i, j) of it reads the padded image at
/// q + i * width + j. A row stores its left padding only: a tap past the right edge reads the
/// next row's left padding, which is zero too. The last width - outW columns of every flat
/// output row are not outputs: computing them anyway keeps the loops free of edge cases, and
/// they are dropped when results leave the flat layout.
///
/// Stride 2: the padded image is split into its four phases, the values at (even, even), (even,
/// odd), (odd, even) and (odd, odd) (row, column), each stored like a stride-1 image of half the
/// size; tap (i, j) of output q reads phase (i % 2, j % 2) at q + (i / 2) * width + j / 2. So a
/// strided sweep is the same loop over fixed offsets as an unstrided one. As Taps: all 9 taps,
/// outLen a multiple of the tile width, channelStride enough for every tap of every position.
struct FlatPlane : Taps {
  int64_t h, w, ph, pw, stride;  // the unpadded input, its padding and the stride
  int64_t outH, outW, width;     // width: values per stored row (of a phase, at stride 2)
  int64_t phaseStride;           // values per stored phase (the whole channel at stride 1)

  FlatPlane(int64_t h_, int64_t w_, int64_t ph_, int64_t pw_, int64_t stride_, int64_t tile)
      : Taps{kTaps, {}, 0, 0}, h(h_), w(w_), ph(ph_), pw(pw_), stride(stride_) {
    const int64_t paddedH = h + 2 * ph, paddedW = w + 2 * pw;
    outH = (paddedH - 3) / stride + 1;
    outW = (paddedW - 3) / stride + 1;
    width = stride == 1 ? w + pw : (paddedW + 1) / 2;
    outLen = roundUp(outH * width, tile);
    const int64_t reach = (2 / stride) * width + 2 / stride;  // the farthest tap from its output
    const int64_t rows = (paddedH + stride - 1) / stride;
    phaseStride = roundUp(std::max(rows * width, outLen + reach + 1), tile);
    channelStride = phaseStride * stride * stride;
    for (int64_t t = 0; t < kTaps; ++t) {
      const int64_t i = t / 3, j = t % 3;
      offsets[t] = ((i % stride) * stride + j % stride) * phaseStride + (i / stride) * width + j / stride;
    }
  }

  /// Writes `channels` planes of `src` into the interior of their flat padded copy `dst`. Only
  /// the interior is written: `dst` is zeroed once when allocated, and its padding stays zero.
  template <class T>
  void pad(const T* src, int64_t channels, T* dst) const {
    for (int64_t ch = 0; ch < channels; ++ch) {
      for (int64_t y = 0; y < h; ++y) {
        const T* row = src + (ch * h + y) * w;
        T* channel = dst + ch * channelStride;
        if (stride == 1) {
          copyRow(row, w, channel + (y + ph) * width + pw);
          continue;
        }
        // The padded row py goes to the phases (py % 2, 0) and (py % 2, 1): its even and its odd
        // padded columns px = x + pw, each phase's run contiguous.
        const int64_t py = y + ph;
        T* even = channel + (py % 2) * 2 * phaseStride + (py / 2) * width;
        deinterleave(row, w, pw, even, even + phaseStride);
      }
    }
  }
  /// Copies the outputs of `channels` flat planes (outLen apart) to dense (outH, outW) planes.
  template <class T>
  void unpad(const T* flat, int64_t channels, T* dst) const {
    for (int64_t ch = 0; ch < channels; ++ch) {
      for (int64_t y = 0; y < outH; ++y) copyRow(flat + ch * outLen + y * width, outW, dst + (ch * outH + y) * outW);
    }
  }
};

/// Pulls the next image's input towards the core while the current image is computed, a few
/// cache lines per tile: the tiles are compute-bound once an image is cached, and without this
/// every image would start with a stall on memory.
class Prefetcher {
 public:
  /// Spreads the `bytes` from `start` (none when null) over `steps` calls of step().
  Prefetcher(const void* start, int64_t bytes, int64_t steps)
      : next_(static_cast<const char*>(start)), end_(start ? next_ + bytes : next_),
        perStep_((bytes / kLine + steps) / std::max<int64_t>(steps, 1)) {}

  void step() {
    for (int64_t k = 0; k < perStep_ && next_ < end_; ++k, next_ += kLine) __builtin_prefetch(next_, 0, 2);
  }

 private:
  static constexpr int64_t kLine = 64;
  const char* next_;
  const char* end_;
  int64_t perStep_;
};

// ---- forward sweep (also the input gradient) -------------------------------------------------

/// The most output channels a forward tile computes at once: one accumulator vector each, plus
/// the loaded input and the splat weight, within the register file (16 with AVX-512's 32
/// registers, 8 with AVX2's 16).
constexpr int kMaxChannelBlock = simd::kVectorRegisters >= 32 ? 16 : 8;

/// Output channels are computed in blocks of kMaxChannelBlock, then halves of it down to 1 for the
/// remainder: each block's filter values are packed as [input channel][tap][block member] so one
/// tile reads them in order.
template <class F>
void forEachChannelBlock(int64_t channels, F f) {
  int64_t first = 0;
  for (int64_t size = kMaxChannelBlock; size >= 1; size /= 2) {
    for (; first + size <= channels; first += size) f(first, size);
  }
}

/// packed[block][inCh][tap][member] = weight(block first + member, inCh, tap), for `taps` taps.
template <class T, class W>
std::vector<T> packFilter(int64_t outChannels, int64_t inChannels, int64_t taps, W weight) {
  std::vector<T> packed(static_cast<size_t>(outChannels * inChannels * taps));
  forEachChannelBlock(outChannels, [&](int64_t first, int64_t size) {
    T* block = packed.data() + first * inChannels * taps;
    for (int64_t in = 0; in < inChannels; ++in) {
      for (int64_t t = 0; t < taps; ++t) {
        for (int64_t m = 0; m < size; ++m) block[(in * taps + t) * size + m] = weight(first + m, in, t);
      }
    }
  });
  return packed;
}

// One vector of flat positions per tile: small planes (8x8 has 80 flat positions) waste little
// on rounding, and a block of channels x 1 vector is enough independent accumulators to keep the
// multiply-add units busy.
constexpr int64_t kTileVectors = 1;

/// out[m][q .. q + tile) for the OB output channels of one block: the sum over input channels and
/// taps of the packed filter value times the shifted input. The OB accumulators stay in registers.
template <class T, int OB>
void forwardTile(const Taps& p, int64_t inChannels, const T* padded, const T* block, int64_t q, T* out) {
  constexpr int64_t L = kLanes<T>;
  const int64_t* offsets = p.offsets;
  Vec<T> acc[OB][kTileVectors] = {};
  for (int64_t in = 0; in < inChannels; ++in) {
    const T* src = padded + in * p.channelStride + q;
    const T* weights = block + in * p.count * OB;
    for (int64_t t = 0; t < p.count; ++t) {
      const T* tap = src + offsets[t];
      Vec<T> v[kTileVectors];
#pragma GCC unroll 4
      for (int64_t k = 0; k < kTileVectors; ++k) v[k] = load(tap + k * L);
#pragma GCC unroll 16
      for (int m = 0; m < OB; ++m) {
        const T w = weights[t * OB + m];  // a scalar operand is splat across the vector
#pragma GCC unroll 4
        for (int64_t k = 0; k < kTileVectors; ++k) acc[m][k] += v[k] * w;
      }
    }
  }
  for (int m = 0; m < OB; ++m) {
    for (int64_t k = 0; k < kTileVectors; ++k) store(out + m * p.outLen + q + k * L, acc[m][k]);
  }
}

/// The tiles of one block of `size` output channels (a power of two up to OB).
template <class T, int OB = kMaxChannelBlock>
void forwardBlock(const Taps& p, int64_t inChannels, const T* padded, const T* block, int64_t size, T* out,
                  Prefetcher& prefetch) {
  if constexpr (OB > 1) {
    if (size < OB) return forwardBlock<T, OB / 2>(p, inChannels, padded, block, size, out, prefetch);
  }
  for (int64_t q = 0; q < p.outLen; q += kTileVectors * kLanes<T>) {
    prefetch.step();
    forwardTile<T, OB>(p, inChannels, padded, block, q, out);
  }
}

/// flat (outChannels, taps.outLen) = padded (inChannels, taps.channelStride) swept by the packed
/// filter.
template <class T>
void sweepImage(const Taps& taps, int64_t inChannels, int64_t outChannels, const T* padded, const T* packed, T* flat,
                Prefetcher& prefetch) {
  forEachChannelBlock(outChannels, [&](int64_t first, int64_t size) {
    forwardBlock(taps, inChannels, padded, packed + first * inChannels * taps.count, size, flat + first * taps.outLen,
                 prefetch);
  });
}

/// The tiles one sweepImage call runs.
int64_t tilesPerSweep(const Taps& taps, int64_t outChannels, int64_t tile) {
  int64_t blocks = 0;
  forEachChannelBlock(outChannels, [&](int64_t, int64_t) { ++blocks; });
  return blocks * (taps.outLen / tile);
}

/// out (n, outChannels, outH, outW) = in (n, inChannels, h, w) swept by the packed 3x3 filter.
template <class T>
void sweep(const KernelContext& ctx, int64_t n, int64_t inChannels, int64_t outChannels, const FlatPlane& p,
           const T* in, const std::vector<T>& packed, T* out) {
  const int64_t inSize = inChannels * p.h * p.w, outSize = outChannels * p.outH * p.outW;
  ctx.parallelFor(n, outChannels * inChannels * kTaps * p.outLen, [&](int64_t lo, int64_t hi) {
    std::vector<T> padded(static_cast<size_t>(inChannels * p.channelStride));
    std::vector<T> flat(static_cast<size_t>(outChannels * p.outLen));
    const int64_t tiles = tilesPerSweep(p, outChannels, kTileVectors * kLanes<T>);
    for (int64_t img = lo; img < hi; ++img) {
      p.pad(in + img * inSize, inChannels, padded.data());
      Prefetcher prefetch(img + 1 < hi ? in + (img + 1) * inSize : nullptr, inSize * int64_t(sizeof(T)), tiles);
      sweepImage(p, inChannels, outChannels, padded.data(), packed.data(), flat.data(), prefetch);
      p.unpad(flat.data(), outChannels, out + img * outSize);
    }
  });
}

/// The input gradient at stride 2. Position (Y, X) of the padded input gets, from tap (i, j),
/// dy at ((Y - i) / 2, (X - j) / 2) where both divide evenly: the four phases (Y % 2, X % 2) of
/// dx are each an unstrided sweep of dy with the taps of matching parity (2x2, 2x1, 1x2 and 1x1
/// of the flipped filter), and dx interleaves them.
template <class T>
void stridedInputGradient(const KernelContext& ctx, const DirectConv& s, const T* dy, const T* filter, T* dx) {
  const int64_t tile = kTileVectors * kLanes<T>;
  const int64_t rows = (s.h + 2 * s.ph + 1) / 2, cols = (s.w + 2 * s.pw + 1) / 2;  // of the largest phase
  // dy is stored with one zero row above and one zero column to its left, so a phase position
  // (y', x') reads dy at (y' - k, x' - l), k and l in {0, 1}, at a fixed offset.
  const int64_t width = cols + 1, outLen = roundUp(rows * width, tile);
  const int64_t channelStride = roundUp(std::max((rows + 1) * width, outLen + width + 2), tile);
  Taps phases[4];
  std::vector<T> packed[4];
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 2; ++b) {
      Taps& taps = phases[a * 2 + b];
      taps = {0, {}, channelStride, outLen};
      int64_t filterTaps[kTaps];
      for (int64_t i = a; i < 3; i += 2) {
        for (int64_t j = b; j < 3; j += 2) {
          filterTaps[taps.count] = i * 3 + j;
          taps.offsets[taps.count++] = (1 - (i - a) / 2) * width + (1 - (j - b) / 2);
        }
      }
      packed[a * 2 + b] = packFilter<T>(s.c, s.o, taps.count, [&](int64_t c, int64_t o, int64_t t) {
        return filter[(o * s.c + c) * kTaps + filterTaps[t]];
      });
    }
  }
  const int64_t dySize = s.o * s.outH() * s.outW(), dxSize = s.c * s.h * s.w;
  ctx.parallelFor(s.n, s.o * s.c * kTaps * outLen, [&](int64_t lo, int64_t hi) {
    std::vector<T> padded(static_cast<size_t>(s.o * channelStride));  // zero outside dy, never written
    std::vector<T> flat(static_cast<size_t>(4 * s.c * outLen));
    const int64_t tiles = 4 * tilesPerSweep(phases[0], s.c, tile);
    for (int64_t img = lo; img < hi; ++img) {
      Prefetcher prefetch(img + 1 < hi ? dy + (img + 1) * dySize : nullptr, dySize * int64_t(sizeof(T)), tiles);
      for (int64_t o = 0; o < s.o; ++o) {
        for (int64_t y = 0; y < s.outH(); ++y) {
          copyRow(dy + img * dySize + (o * s.outH() + y) * s.outW(), s.outW(),
                  padded.data() + o * channelStride + (y + 1) * width + 1);
        }
      }
      for (int64_t phase = 0; phase < 4; ++phase) {
        sweepImage(phases[phase], s.o, s.c, padded.data(), packed[phase].data(), flat.data() + phase * s.c * outLen,
                   prefetch);
      }
      // Row y of dx interleaves the phases (py % 2, 0) and (py % 2, 1) of padded row py.
      T* out = dx + img * dxSize;
      for (int64_t c = 0; c < s.c; ++c) {
        for (int64_t y = 0; y < s.h; ++y) {
          const int64_t py = y + s.ph;
          const T* even = flat.data() + (py % 2 * 2 * s.c + c) * outLen + (py / 2) * width;
          interleave(even, even + s.c * outLen, s.w, s.pw, out + (c * s.h + y) * s.w);
        }
      }
    }
  });
}

// ---- filter gradient -------------------------------------------------------------------------

/// acc[c][tap][o .. o + lanes) += sum over q of dyT[q][o ..] * padded[c][q + tap] for CB input
/// channels: the vectors run along output channels, so no horizontal sums are needed. CB x 9
/// accumulators stay in registers: 27 of AVX-512's 32, 9 of AVX2's 16 (kFilterChannels).
template <class T, int CB>
void filterTile(const FlatPlane& p, int64_t positions, const T* dyT, int64_t outStride, const T* padded, T* acc) {
  Vec<T> sum[CB][kTaps];
  for (int c = 0; c < CB; ++c) {
    for (int64_t t = 0; t < kTaps; ++t) sum[c][t] = load(acc + (c * kTaps + t) * outStride);
  }
  const int64_t* offsets = p.offsets;
  for (int64_t q = 0; q < positions; ++q) {
    const Vec<T> d = load(dyT + q * outStride);
#pragma GCC unroll 4
    for (int c = 0; c < CB; ++c) {
      const T* src = padded + c * p.channelStride + q;
#pragma GCC unroll 9
      for (int64_t t = 0; t < kTaps; ++t) sum[c][t] += d * src[offsets[t]];
    }
  }
  for (int c = 0; c < CB; ++c) {
    for (int64_t t = 0; t < kTaps; ++t) store(acc + (c * kTaps + t) * outStride, sum[c][t]);
  }
}

/// Adds one image's filter gradient to acc (c, tap, outStride), given its padded input and its
/// output gradient transposed to (position, outStride) with zeros at the non-output positions.
template <class T>
void accumulateImage(const FlatPlane& p, int64_t inChannels, int64_t outStride, const T* padded, const T* dyT,
                     T* acc) {
  constexpr int kFilterChannels = simd::kVectorRegisters >= 32 ? 3 : 1;
  const int64_t positions = p.outH * p.width;
  for (int64_t o = 0; o < outStride; o += kLanes<T>) {
    int64_t c = 0;
    for (; c + kFilterChannels <= inChannels; c += kFilterChannels) {
      filterTile<T, kFilterChannels>(p, positions, dyT + o, outStride, padded + c * p.channelStride,
                                     acc + c * kTaps * outStride + o);
    }
    for (; c < inChannels; ++c) {
      filterTile<T, 1>(p, positions, dyT + o, outStride, padded + c * p.channelStride, acc + c * kTaps * outStride + o);
    }
  }
}

/// dyT[q][o] = dy[o][q's row][q's column] at output positions. Only those are written: dyT is
/// zeroed once when allocated, and its other positions stay zero. In float, blocks of kLanes
/// channels x kLanes positions are transposed in registers; the rest goes value by value.
template <class T>
void transposeGradient(const FlatPlane& p, int64_t outChannels, int64_t outStride, const T* dy, T* dyT) {
  const int64_t plane = p.outH * p.outW;
  const auto flatIndex = [&](int64_t at) { return at / p.outW * p.width + at % p.outW; };
  const auto copyValues = [&](int64_t o0, int64_t o1, int64_t first, int64_t last) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t at = first; at < last; ++at) dyT[flatIndex(at) * outStride + o] = dy[o * plane + at];
    }
  };
  int64_t o0 = 0;
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t L = kLanes<float>;
    for (; o0 + L <= outChannels; o0 += L) {
      int64_t at = 0;
      for (; at + L <= plane; at += L) {
        Vec<float> v[L];
        for (int r = 0; r < L; ++r) v[r] = load(dy + (o0 + r) * plane + at);
        simd::transpose(v);
        for (int l = 0; l < L; ++l) store(dyT + flatIndex(at + l) * outStride + o0, v[l]);
      }
      copyValues(o0, o0 + L, at, plane);
    }
  }
  copyValues(o0, outChannels, 0, plane);
}

}  // namespace

bool directConvApplies(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ph,
                       int64_t pw) {
  return kh == 3 && kw == 3 && sh == sw && (sh == 1 || sh == 2) && dh == 1 && dw == 1 && ph >= 0 && ph <= 2 &&
         pw >= 0 && pw <= 2;
}

template <class T>
void directConvForward(const KernelContext& ctx, const DirectConv& s, const T* x, const T* filter, T* y) {
  const FlatPlane p(s.h, s.w, s.ph, s.pw, s.stride, kTileVectors * kLanes<T>);
  const auto packed = packFilter<T>(s.o, s.c, kTaps,
                                    [&](int64_t o, int64_t c, int64_t t) { return filter[(o * s.c + c) * kTaps + t]; });
  sweep(ctx, s.n, s.c, s.o, p, x, packed, y);
}

// Stride 1: dx[c][y][x] = sum over o, (i, j) of w[o][c][i][j] dy[o][y + ph - i][x + pw - j]: a
// sweep of dy padded by (2 - ph, 2 - pw) with the filter w'[c][o][2 - i][2 - j].
template <class T>
void directConvBackpropInput(const KernelContext& ctx, const DirectConv& s, const T* dy, const T* filter, T* dx) {
  if (s.stride == 2) return stridedInputGradient(ctx, s, dy, filter, dx);
  const FlatPlane p(s.outH(), s.outW(), 2 - s.ph, 2 - s.pw, 1, kTileVectors * kLanes<T>);
  const auto packed = packFilter<T>(s.c, s.o, kTaps, [&](int64_t c, int64_t o, int64_t t) {
    return filter[(o * s.c + c) * kTaps + (kTaps - 1 - t)];
  });
  sweep(ctx, s.n, s.o, s.c, p, dy, packed, dx);
}

template <class T>
void directConvBackpropFilter(const KernelContext& ctx, const DirectConv& s, const T* x, const T* dy, T* dfilter) {
  const FlatPlane p(s.h, s.w, s.ph, s.pw, s.stride, 1);
  const int64_t outStride = roundUp(s.o, kLanes<T>), accSize = s.c * kTaps * outStride;
  const int64_t inSize = s.c * s.h * s.w, dySize = s.o * s.outH() * s.outW();
  const ImageBlocks blocks(s.n);
  std::vector<T> partials(static_cast<size_t>(blocks.count * accSize), T(0));
  ctx.parallelFor(blocks.count, blocks.perBlock * accSize * p.outLen, [&](int64_t lo, int64_t hi) {
    std::vector<T> padded(static_cast<size_t>(s.c * p.channelStride));
    std::vector<T> dyT(static_cast<size_t>(p.outLen * outStride));
    for (int64_t blk = lo; blk < hi; ++blk) {
      for (int64_t img = blocks.begin(blk); img < blocks.end(blk); ++img) {
        p.pad(x + img * inSize, s.c, padded.data());
        transposeGradient(p, s.o, outStride, dy + img * dySize, dyT.data());
        accumulateImage(p, s.c, outStride, padded.data(), dyT.data(), partials.data() + blk * accSize);
      }
    }
  });
  // dfilter[o][c][t] = sum over blocks, in block order, of partial[c][t][o].
  for (int64_t o = 0; o < s.o; ++o) {
    for (int64_t ct = 0; ct < s.c * kTaps; ++ct) {
      T total = partials[static_cast<size_t>(ct * outStride + o)];
      for (int64_t blk = 1; blk < blocks.count; ++blk) {
        total += partials[static_cast<size_t>(blk * accSize + ct * outStride + o)];
      }
      dfilter[o * s.c * kTaps + ct] = total;
    }
  }
}

#define WEFT_DIRECT_CONV(T)                                                                               \
  template void directConvForward<T>(const KernelContext&, const DirectConv&, const T*, const T*, T*);       \
  template void directConvBackpropInput<T>(const KernelContext&, const DirectConv&, const T*, const T*, T*); \
  template void directConvBackpropFilter<T>(const KernelContext&, const DirectConv&, const T*, const T*, T*);
WEFT_DIRECT_CONV(float)
WEFT_DIRECT_CONV(double)
#undef WEFT_DIRECT_CONV

}  // namespace weft::detail
