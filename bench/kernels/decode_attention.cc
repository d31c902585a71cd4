// One decode step's attention over jrl's CPU cache layout, as an XLA FFI handler
// (bench/cpu_kernels.py builds and times it against jrl's XLA attention; not used by jrl).
//
// q [B, K, G, D] float32 (G query heads per kv head), keys [B, K, D, S] and values [B, K, S, D]
// float32, mask [B, S] bool -> out [B, K, G, D] float32:
//   p = softmax(scale * q.k over the visible columns), out = sum_s p_s v_s,
// where only the columns from a row's first to its last visible one are read. With
// `probs_bf16` the probabilities are rounded to bfloat16 first, as jrl's bfloat16 model does.
// Rows are shared with XLA's intra-op thread pool.
#include <algorithm>
#include <atomic>
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// e^x for x <= 0 as 2^n e^r, |r| <= ln 2 / 2, by a degree-6 polynomial; branch-free so that the
// compiler vectorizes it; 0 below -87.3.
static inline float exp_nonpositive(float x) {
  x = std::max(x, -87.3f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return x <= -87.3f ? 0.f : p * two_n;
}

static inline float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// One (row, kv head): scores [G, n] is scratch.
static void attend(const float* q, const float* k, const float* v, const bool* mask, float* out,
                   int64_t G, int64_t D, int64_t S, float scale, bool probs_bf16, float* scores) {
  int64_t hi = S;
  while (hi > 0 && !mask[hi - 1]) --hi;
  int64_t lo = 0;
  while (lo < hi && !mask[lo]) ++lo;
  const int64_t n = hi - lo;
  std::fill(scores, scores + G * n, 0.f);
  for (int64_t d = 0; d < D; ++d) {
    const float* kd = k + d * S + lo;
    for (int64_t g = 0; g < G; ++g) {
      const float qd = q[g * D + d];
      float* sc = scores + g * n;
#pragma omp simd
      for (int64_t s = 0; s < n; ++s) sc[s] += qd * kd[s];
    }
  }
  const bool* visible = mask + lo;
  for (int64_t g = 0; g < G; ++g) {
    float* sc = scores + g * n;
    float top = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      sc[s] = visible[s] ? sc[s] * scale : -1e30f;
      top = std::max(top, sc[s]);
    }
#pragma omp simd
    for (int64_t s = 0; s < n; ++s) sc[s] = exp_nonpositive(sc[s] - top);
    float total = 0.f;
    for (int64_t s = 0; s < n; ++s) total += sc[s];
    for (int64_t s = 0; s < n; ++s) sc[s] = probs_bf16 ? round_to_bf16(sc[s] / total) : sc[s] / total;
  }
  std::fill(out, out + G * D, 0.f);
  for (int64_t s = 0; s < n; ++s) {
    const float* vs = v + (lo + s) * D;
    for (int64_t g = 0; g < G; ++g) {
      const float p = scores[g * n + s];
      float* og = out + g * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) og[d] += p * vs[d];
    }
  }
}

static ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                                  ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                                  ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> out,
                                  float scale, bool probs_bf16) {
  const auto dims = q.dimensions();
  const int64_t B = dims[0], K = dims[1], G = dims[2], D = dims[3];
  const int64_t S = k.dimensions()[3];
  const int64_t items = B * K;
  // Work in chunks of rows taken from a shared counter by this thread and by helpers on XLA's
  // pool; a helper that starts after every chunk is taken returns at once, so this thread never
  // waits on a task that has not started (the pool's threads may all be busy with other calls).
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(items, 4 * pool.num_threads()));
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  auto work = [=, q = q.typed_data(), k = k.typed_data(), v = v.typed_data(),
               m = mask.typed_data(), o = out->typed_data()] {
    std::vector<float> scores(G * S);
    for (int64_t p = shared->next.fetch_add(1); p < parts; p = shared->next.fetch_add(1)) {
      for (int64_t i = items * p / parts; i < items * (p + 1) / parts; ++i) {
        attend(q + i * G * D, k + i * D * S, v + i * S * D, m + (i / K) * S, o + i * G * D, G, D,
               S, scale, probs_bf16, scores.data());
      }
      shared->done.fetch_add(1);
    }
  };
  for (int64_t t = 1; t < pool.num_threads(); ++t) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  while (shared->done.load() < parts) std::this_thread::yield();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JrlBenchDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<bool>("probs_bf16"));
