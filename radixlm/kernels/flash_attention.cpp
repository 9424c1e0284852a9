// Flash attention for CPU prefill: each sequence's queries over its KV pool slots, causal or
// not, bf16 products accumulated in float32 with AVX-512 BF16's dot-product instruction.
//
// Per sequence and KV head, the keys are packed once (read through the slots: no gathered
// copy) into 16-key blocks of dimension pairs (a query pair broadcast against a block gives 16
// scores per instruction) and the values into key pairs (a probability pair broadcast against
// a row of value pairs adds to 16 outputs). A work item is one sequence, KV head and run of
// its tokens (their G query heads are its rows); it walks the visible keys 64 at a time:
// scores, the rows' running max and sum (online softmax, float32), the probabilities rounded
// to bf16 (as torch's flash kernel does), and the outputs updated in a float32 buffer. Items
// are taken from a shared counter, costliest first, by torch's intra-op threads. Without
// AVX-512 BF16, or for other head sizes, a plain loop.
#include "flash_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "avx512_math.h"

namespace radixlm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One sequence: its queries from token q0, its keys from slots[k0]; `packed`: where its keys
// start in the packed arrays (64-key blocks)
struct Seq {
  int64_t q0, M, k0, L, packed;
  // Keys visible to the sequence's query i: all, or up to its causal position
  int64_t visible(bool causal, int64_t i) const {
    return causal ? std::max<int64_t>(0, std::min(L, L - M + i + 1)) : L;
  }
  // The first of them: 0, or the start of query i's sliding window
  int64_t first_visible(bool causal, int64_t window, int64_t i) const {
    return window > 0 ? std::max<int64_t>(0, visible(causal, i) - window) : 0;
  }
};

template <typename T>
Seq seq_of(const FlashArgs<T>& a, int64_t b, int64_t packed = 0) {
  return {a.q_starts[b], a.q_starts[b + 1] - a.q_starts[b], a.kv_starts[b], a.kv_starts[b + 1] - a.kv_starts[b],
          packed};
}

template <typename T>
void flash_scalar(const FlashArgs<T>& a) {
  const int64_t G = a.H / a.Hkv, D = a.D, T_ = a.q_starts[a.B];
  at::parallel_for(0, T_ * a.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s, acc(D);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / a.H, kv = row % a.H / G;
      const int64_t b = std::upper_bound(a.q_starts, a.q_starts + a.B + 1, t) - a.q_starts - 1;
      const Seq seq = seq_of(a, b);
      const int64_t n = seq.visible(a.causal, t - seq.q0), lo = seq.first_visible(a.causal, a.window, t - seq.q0);
      s.resize(std::max<int64_t>(n, 1));
      const T* q = a.q + row * D;
      float top = -kInf;
      for (int64_t l = lo; l < n; ++l) {
        const T* key = a.k + (a.slots[seq.k0 + l] * a.Hkv + kv) * D;
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<float>(q[d]) * static_cast<float>(key[d]);
        s[l] = dot * a.scale;
        top = std::max(top, s[l]);
      }
      float total = 0.f;
      for (int64_t l = lo; l < n; ++l) total += (s[l] = std::exp(s[l] - top));
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t l = lo; l < n; ++l) {
        const T* value = a.v + (a.slots[seq.k0 + l] * a.Hkv + kv) * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += s[l] * static_cast<float>(value[d]);
      }
      for (int64_t d = 0; d < D; ++d) a.out[row * D + d] = n > 0 ? acc[d] / total : 0.f;
      a.lse[row] = n > 0 ? top + std::log(total) : -kInf;
    }
  });
}

#if defined(__AVX512BF16__)
using bf16 = c10::BFloat16;
using u32 = uint32_t;

constexpr int64_t KB = 64;        // keys per block: 4 groups of 16
constexpr int64_t ITEM_ROWS = 64;  // query rows (token x head) per work item, about

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh&>(x); }

// One KV head's keys of a sequence, 64-key block by block: [block][group of 16][D/2][16], the
// pair of dimensions (2p, 2p+1) of key j at [p][j]; its values by key pairs: [L/2][D], the pair
// of keys (2kp, 2kp+1) of dimension d at [kp][d]. Keys past the sequence's end are zeros.
void pack_block(const FlashArgs<bf16>& a, const Seq& seq, int64_t h, int64_t block, u32* keys, u32* values) {
  const int64_t P = a.D / 2, first = block * KB;
  auto row = [&](const bf16* base, int64_t key) {
    const int64_t slot = key < seq.L ? a.slots[seq.k0 + key] : -1;
    return slot >= 0 ? reinterpret_cast<const uint16_t*>(base + (slot * a.Hkv + h) * a.D) : nullptr;
  };
  u32* kb = keys + first * P;
  for (int64_t j = 0; j < KB; ++j) {
    const u32* src = reinterpret_cast<const u32*>(row(a.k, first + j));
    u32* dst = kb + (j / 16) * P * 16 + j % 16;
    for (int64_t p = 0; p < P; ++p) dst[p * 16] = src ? src[p] : 0u;
  }
  u32* vb = values + first / 2 * a.D;
  for (int64_t kp = 0; kp < KB / 2; ++kp) {
    const uint16_t* lo = row(a.v, first + 2 * kp);
    const uint16_t* hi = row(a.v, first + 2 * kp + 1);
    for (int64_t d = 0; d < a.D; ++d)
      vb[kp * a.D + d] = (lo ? lo[d] : 0u) | (hi ? static_cast<u32>(hi[d]) << 16 : 0u);
  }
}

// scores[r][0..64) = q_r . key for R query rows (pairs of bf16) and one packed 64-key block
template <int D, int R>
inline void block_scores(const u32* const* q, const u32* keys, float* scores) {
  constexpr int P = D / 2;
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int p = 0; p < P; ++p) {
    __m512bh k[4];
    for (int c = 0; c < 4; ++c) k[c] = as_bh(_mm512_loadu_si512(keys + (c * P + p) * 16));
    for (int r = 0; r < R; ++r) {
      const __m512bh qp = as_bh(_mm512_set1_epi32(static_cast<int>(q[r][p])));
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qp, k[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(scores + r * KB + c * 16, acc[r][c]);
}

// out[r] += probs[r] . values over `pairs` key pairs, for R rows (outputs float32 [D])
template <int D, int R>
inline void block_values(const bf16* probs, const u32* values, int64_t pairs, float* out) {
  constexpr int DC = D / 16;
  __m512 acc[R][DC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < DC; ++c) acc[r][c] = _mm512_loadu_ps(out + r * D + c * 16);
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m512bh v[DC];
    for (int c = 0; c < DC; ++c) v[c] = as_bh(_mm512_loadu_si512(values + kp * D + c * 16));
    for (int r = 0; r < R; ++r) {
      const u32 pair = reinterpret_cast<const u32*>(probs + r * KB)[kp];
      const __m512bh pp = as_bh(_mm512_set1_epi32(static_cast<int>(pair)));
      for (int c = 0; c < DC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pp, v[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < DC; ++c) _mm512_storeu_ps(out + r * D + c * 16, acc[r][c]);
}

// Rows in runs of R (the register budget), the last run shorter
template <int R, typename Fn>
inline void in_runs(int64_t rows, Fn&& fn) {
  int64_t r = 0;
  for (; r + R <= rows; r += R) fn(r, std::integral_constant<int, R>{});
  switch (rows - r) {
    case 3: if constexpr (R > 3) fn(r, std::integral_constant<int, 3>{}); break;
    case 2: if constexpr (R > 2) fn(r, std::integral_constant<int, 2>{}); break;
    case 1: if constexpr (R > 1) fn(r, std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

struct Scratch {
  std::vector<const u32*> q;
  std::vector<float> scores, out, top, total;
  std::vector<bf16> probs;
  explicit Scratch(int64_t rows, int64_t D)
      : q(rows), scores(rows * KB), out(rows * D), top(rows), total(rows), probs(rows * KB) {}
};

// Softmax update of one row over its scores [begin, valid) of the block: running max and sum,
// the output rescaled, the probabilities stored as bf16 (zeros outside)
inline void online_softmax(float* s, int64_t begin, int64_t valid, float scale, float& top, float& total,
                           float* out, int64_t D, bf16* probs) {
  if (valid <= begin) {
    std::memset(probs, 0, KB * sizeof(bf16));
    return;
  }
  __m512 x[4];
  __mmask16 m[4];
  __m512 block_top = _mm512_set1_ps(-kInf);
  for (int c = 0; c < 4; ++c) {
    m[c] = valid > c * 16 ? tail_mask(valid - c * 16) : 0;
    if (begin > c * 16) m[c] &= static_cast<__mmask16>(~tail_mask(begin - c * 16));
    x[c] = _mm512_mul_ps(_mm512_loadu_ps(s + c * 16), _mm512_set1_ps(scale));
    block_top = _mm512_mask_max_ps(block_top, m[c], block_top, x[c]);
  }
  const float new_top = std::max(top, _mm512_reduce_max_ps(block_top));
  const float keep = top == -kInf ? 0.f : std::exp(top - new_top);
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    __m512 p = _mm512_maskz_mov_ps(m[c], exp16(_mm512_sub_ps(x[c], _mm512_set1_ps(new_top))));
    sum = _mm512_add_ps(sum, p);
    __m256bh packed = _mm512_cvtneps_pbh(p);
    std::memcpy(probs + c * 16, &packed, sizeof(packed));
  }
  total = total * keep + _mm512_reduce_add_ps(sum);
  top = new_top;
  if (keep != 1.f)
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(out + d), _mm512_set1_ps(keep)));
}

template <int D>
void flash_item(const FlashArgs<bf16>& a, const Seq& seq, const u32* keys, const u32* values, int64_t h, int64_t t0,
                int64_t t1, Scratch& w) {
  constexpr int QR = 4, VR = D >= 128 ? 2 : 4;
  const int64_t G = a.H / a.Hkv, rows = (t1 - t0) * G;
  auto row_of = [&](int64_t r) { return (seq.q0 + t0 + r / G) * a.H + h * G + r % G; };
  for (int64_t r = 0; r < rows; ++r) w.q[r] = reinterpret_cast<const u32*>(a.q + row_of(r) * D);
  std::fill_n(w.out.begin(), rows * D, 0.f);
  std::fill_n(w.top.begin(), rows, -kInf);
  std::fill_n(w.total.begin(), rows, 0.f);
  const int64_t end = seq.visible(a.causal, t1 - 1);
  const int64_t start = seq.first_visible(a.causal, a.window, t0) / KB * KB;
  for (int64_t first = start; first < end; first += KB) {
    const u32* kb = keys + first * (D / 2);
    in_runs<QR>(rows, [&](int64_t r, auto n) {
      block_scores<D, decltype(n)::value>(w.q.data() + r, kb, w.scores.data() + r * KB);
    });
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t valid = std::min(KB, seq.visible(a.causal, t0 + r / G) - first);
      const int64_t begin = std::max<int64_t>(0, seq.first_visible(a.causal, a.window, t0 + r / G) - first);
      online_softmax(w.scores.data() + r * KB, begin, valid, a.scale, w.top[r], w.total[r], w.out.data() + r * D, D,
                     w.probs.data() + r * KB);
    }
    const int64_t pairs = (std::min(KB, end - first) + 1) / 2;
    const u32* vb = values + first / 2 * D;
    in_runs<VR>(rows, [&](int64_t r, auto n) {
      block_values<D, decltype(n)::value>(w.probs.data() + r * KB, vb, pairs, w.out.data() + r * D);
    });
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = row_of(r);
    const float total = w.total[r], inv = total > 0.f ? 1.f / total : 0.f;
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(a.out + row * D + d, _mm512_mul_ps(_mm512_loadu_ps(w.out.data() + r * D + d), _mm512_set1_ps(inv)));
    a.lse[row] = total > 0.f ? w.top[r] + std::log(total) : -kInf;
  }
}

template <int D>
void flash_vector(const FlashArgs<bf16>& a) {
  const int64_t G = a.H / a.Hkv, tokens = std::max<int64_t>(1, ITEM_ROWS / G);
  std::vector<Seq> seqs;
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (sequence, block) to pack
  struct Work { int64_t seq, t0, t1, h, cost; };
  std::vector<Work> work;
  int64_t packed = 0;
  for (int64_t b = 0; b < a.B; ++b) {
    const Seq seq = seq_of(a, b, packed);
    const int64_t n = (seq.L + KB - 1) / KB;
    for (int64_t i = 0; i < n; ++i) blocks.emplace_back(b, i);
    for (int64_t t0 = 0; t0 < seq.M; t0 += tokens) {
      const int64_t t1 = std::min(seq.M, t0 + tokens), cost = (t1 - t0) * (seq.visible(a.causal, t1 - 1) - seq.first_visible(a.causal, a.window, t0));
      for (int64_t h = 0; h < a.Hkv; ++h) work.push_back({b, t0, t1, h, cost});
    }
    seqs.push_back(seq);
    packed += n * KB;
  }
  const int64_t per_head = packed * D / 2;
  std::vector<u32> keys(a.Hkv * per_head), values(a.Hkv * per_head);
  const int64_t num_blocks = static_cast<int64_t>(blocks.size());
  at::parallel_for(0, a.Hkv * num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / num_blocks;
      const auto [b, block] = blocks[i % num_blocks];
      const int64_t at = h * per_head + seqs[b].packed * D / 2;
      pack_block(a, seqs[b], h, block, keys.data() + at, values.data() + at);
    }
  });
  // NOTE: the costliest items first (under a causal mask the latest tokens see the most keys),
  // taken from a counter: even work per thread whatever the mask and the sequences' lengths
  std::stable_sort(work.begin(), work.end(), [](const Work& x, const Work& y) { return x.cost > y.cost; });
  const int64_t items = static_cast<int64_t>(work.size());
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(items, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    Scratch w(tokens * G, D);
    for (int64_t i = next++; i < items; i = next++) {
      const Work& it = work[i];
      const Seq& seq = seqs[it.seq];
      const int64_t at = it.h * per_head + seq.packed * D / 2;
      flash_item<D>(a, seq, keys.data() + at, values.data() + at, it.h, it.t0, it.t1, w);
    }
  });
}
#endif

}  // namespace

bool flash_vectorized(int64_t D) {
#if defined(__AVX512BF16__)
  return D == 32 || D == 64 || D == 128;
#else
  (void)D;
  return false;
#endif
}

void flash_attention(const FlashArgs<c10::BFloat16>& a) {
#if defined(__AVX512BF16__)
  switch (a.D) {
    case 32: return flash_vector<32>(a);
    case 64: return flash_vector<64>(a);
    case 128: return flash_vector<128>(a);
    default: break;
  }
#endif
  flash_scalar(a);
}

void flash_attention(const FlashArgs<float>& a) { flash_scalar(a); }

}  // namespace radixlm
