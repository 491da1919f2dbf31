// Causal grouped-query attention in float32, forward and backward, as two XLA FFI handlers for the CPU backend.
//
// One (row, head) pair of the batch is a work item: its queries are taken a block of rows at a time, each block's
// scores stop at the block's last key (the blocks above the diagonal are never computed), and a block's scores,
// softmax weights and their gradient stay in one small buffer, in cache, between the block's GEMMs. The items are
// spread over OpenMP threads; each makes MKL's calls single-threaded (`MKL_Set_Num_Threads_Local`), so the cores
// work on different items instead of splitting each small GEMM. The GEMMs are MKL's ILP64 `sgemm`, reached through
// function pointers `models/mkl_matmul.py` sets from the MKL build torch ships; the softmax passes are loops here,
// compiled for the host's vector instructions (`-march=native`, cached per CPU).
// docs/decisions/031-mkl-matmul-on-intel-cpus.md says why.
//
// Layouts (row-major): queries and output [B, T, H, D], keys and values [B, S, KV, D] with S = prefix + T, key mask
// [B, S], log-sum-exp [B, H, T]. Query t reads key s iff s <= prefix + t and the key is a real token; query head h
// reads key/value head h / (H / KV). A query that may read no key (a left-padding row) gets a zero output, a
// log-sum-exp of +inf and no gradient. The keys before a row's first real one (its left padding) are left out of
// every product.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using Sgemm = void (*)(const char* transa, const char* transb, const int64_t* m, const int64_t* n, const int64_t* k,
                       const float* alpha, const float* a, const int64_t* lda, const float* b, const int64_t* ldb,
                       const float* beta, float* c, const int64_t* ldc);
using SetLocalThreads = int (*)(int threads);

using Tensor4 = ffi::Buffer<ffi::F32, 4>;
using Tensor3 = ffi::Buffer<ffi::F32, 3>;
using KeyMask = ffi::Buffer<ffi::PRED, 2>;
using Result4 = ffi::ResultBuffer<ffi::F32, 4>;
using Result3 = ffi::ResultBuffer<ffi::F32, 3>;

Sgemm sgemm = nullptr;
SetLocalThreads set_local_threads = nullptr;

// Query rows per block: a block's [rows, S] scores of a 256-token row fit in L1 and L2 beside its operands.
constexpr int64_t kQueryBlock = 64;
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
constexpr float kInfinity = std::numeric_limits<float>::infinity();

// Row-major C[m, n] = alpha op(A) op(B) + beta C, with the leading dimension of each buffer given. A row-major
// buffer is the column-major transpose, so this is the column-major C^T = op(B)^T op(A)^T.
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char trans_a = transpose_a ? 'T' : 'N';
  const char trans_b = transpose_b ? 'T' : 'N';
  sgemm(&trans_b, &trans_a, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// exp(x) for x <= 0 (a softmax's shifted scores), clamped to [-87, 0] where 2^n stays a normal float: x = n ln2 + r
// with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative error about 1e-7), 2^n written into the
// exponent bits. Plain arithmetic, so the loops below vectorise it.
inline float Exp(float x) {
  x = std::min(0.0f, std::max(-87.0f, x));
  const float n = std::floor(x * 1.44269504f + 0.5f);
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float power;
  std::memcpy(&power, &bits, sizeof(power));
  return p * power;
}

// The largest score of a real key, -inf if none.
float RowMax(const float* row, const float* real, int64_t n) {
  float maximum = kNegativeInfinity;
#pragma omp simd reduction(max : maximum)
  for (int64_t s = 0; s < n; ++s) maximum = std::max(maximum, real[s] > 0.0f ? row[s] : kNegativeInfinity);
  return maximum;
}

// row = exp(row - shift) at real keys, 0 at padding; returns the row's sum.
float ExpRow(float* row, const float* real, int64_t n, float shift) {
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t s = 0; s < n; ++s) {
    row[s] = real[s] * Exp(row[s] - shift);
    total += row[s];
  }
  return total;
}

float Sum(const float* row, int64_t n) {
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t s = 0; s < n; ++s) total += row[s];
  return total;
}

void ScaleRow(float* row, int64_t n, float factor) {
#pragma omp simd
  for (int64_t s = 0; s < n; ++s) row[s] *= factor;
}

float Dot(const float* a, const float* b, int64_t n) {
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t d = 0; d < n; ++d) total += a[d] * b[d];
  return total;
}

// dS = scale P (dP - dO . O), in place of dP: the gradient of the scaled scores through the softmax, the scale
// folded in for dQ and dK.
void ScoreGradRow(float* weight_grad, const float* weight, int64_t n, float row_dot, float scale) {
#pragma omp simd
  for (int64_t s = 0; s < n; ++s) weight_grad[s] = scale * weight[s] * (weight_grad[s] - row_dot);
}

struct Shape {
  int64_t batch, length, heads, head_dim, keys, kv_heads;
  int64_t prefix() const { return keys - length; }
  int64_t group() const { return heads / kv_heads; }
  int64_t query_stride() const { return heads * head_dim; }
  int64_t key_stride() const { return kv_heads * head_dim; }
};

// One batch row's keys: 1 for a real token, 0 for padding, and the first real one (`keys` if none).
struct RealKeys {
  std::vector<float> real;
  int64_t first;
  RealKeys(const bool* key_mask, int64_t keys) : real(keys), first(keys) {
    for (int64_t s = keys - 1; s >= 0; --s) {
      real[s] = key_mask[s] ? 1.0f : 0.0f;
      if (key_mask[s]) first = s;
    }
  }
};

// The softmax weights, unnormalised, of the queries [first, first + rows) of one head against the keys
// [keys.first, keys.first + columns): exp(scale q.k - shift[i]) where query i may read the key, else 0, in
// `weights` [rows, columns]. The forward pass shifts by each row's maximum (`shift` null: written to
// `row_maxima`), the backward pass by the saved log-sum-exp. `queries` and `keys_data` point at the head's first
// row.
void BlockWeights(const Shape& shape, const float* queries, const float* keys_data, const RealKeys& keys, float scale,
                  int64_t first, int64_t rows, int64_t columns, const float* shift, float* row_maxima,
                  float* weights) {
  Gemm(false, true, rows, columns, shape.head_dim, scale, queries + first * shape.query_stride(),
       shape.query_stride(), keys_data + keys.first * shape.key_stride(), shape.key_stride(), 0.0f, weights, columns);
  const float* real = keys.real.data() + keys.first;
  for (int64_t i = 0; i < rows; ++i) {
    float* row = weights + i * columns;
    const int64_t readable = std::max<int64_t>(0, shape.prefix() + first + i + 1 - keys.first);
    const float row_shift = shift != nullptr ? shift[i] : RowMax(row, real, readable);
    if (row_maxima != nullptr) row_maxima[i] = row_shift;
    if (row_shift == kNegativeInfinity || row_shift == kInfinity) {
      std::fill(row, row + columns, 0.0f);  // a query that reads no key
      continue;
    }
    ExpRow(row, real, readable, row_shift);
    std::fill(row + readable, row + columns, 0.0f);
  }
}

// Runs `work(item)` for item in [0, items) on the OpenMP threads, each making single-threaded MKL calls.
template <typename Work>
void ForEachItem(int64_t items, Work work) {
#pragma omp parallel
  {
    const int previous = set_local_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) work(item);
    set_local_threads(previous);
  }
}

bool KernelsSet() { return sgemm != nullptr && set_local_threads != nullptr; }

Shape ShapeOf(Tensor4& queries, Tensor4& keys) {
  const auto q = queries.dimensions();
  const auto k = keys.dimensions();
  return Shape{q[0], q[1], q[2], q[3], k[1], k[2]};
}

ffi::Error CheckShapes(const Shape& shape, Tensor4& keys, Tensor4& values, KeyMask& key_mask) {
  const auto key_dims = keys.dimensions();
  const auto value_dims = values.dimensions();
  const auto mask_dims = key_mask.dimensions();
  for (int axis = 0; axis < 4; ++axis) {
    if (key_dims[axis] != value_dims[axis]) {
      return ffi::Error::InvalidArgument("mkl_attention: keys and values differ in shape");
    }
  }
  if (key_dims[0] != shape.batch || key_dims[3] != shape.head_dim || shape.kv_heads == 0 ||
      shape.heads % shape.kv_heads != 0 || shape.keys < shape.length || mask_dims[0] != shape.batch ||
      mask_dims[1] != shape.keys) {
    return ffi::Error::InvalidArgument("mkl_attention: query, key and mask shapes do not agree");
  }
  return ffi::Error::Success();
}

// The end of the keys the queries [first, first + rows) read: the prefix and their own columns up to the block's
// last query.
int64_t BlockEnd(const Shape& shape, int64_t first, int64_t rows) { return shape.prefix() + first + rows; }

ffi::Error Forward(Tensor4 queries, Tensor4 keys, Tensor4 values, KeyMask key_mask, Result4 output,
                   Result3 log_sum_exp, float scale) {
  if (!KernelsSet()) return ffi::Error::Internal("mkl_attention: no kernels were set");
  const Shape shape = ShapeOf(queries, keys);
  if (ffi::Error error = CheckShapes(shape, keys, values, key_mask); error.failure()) return error;
  ForEachItem(shape.batch * shape.heads, [&](int64_t item) {
    const int64_t b = item / shape.heads;
    const int64_t h = item % shape.heads;
    const int64_t kv = h / shape.group();
    const int64_t query_offset = b * shape.length * shape.query_stride() + h * shape.head_dim;
    const int64_t key_offset = b * shape.keys * shape.key_stride() + kv * shape.head_dim;
    const float* q = queries.typed_data() + query_offset;
    const float* k = keys.typed_data() + key_offset;
    const float* v = values.typed_data() + key_offset;
    float* out = output->typed_data() + query_offset;
    float* lse = log_sum_exp->typed_data() + (b * shape.heads + h) * shape.length;
    const RealKeys real_keys(key_mask.typed_data() + b * shape.keys, shape.keys);
    std::vector<float> weights(std::min(kQueryBlock, shape.length) * shape.keys);
    for (int64_t first = 0; first < shape.length; first += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, shape.length - first);
      const int64_t columns = BlockEnd(shape, first, rows) - real_keys.first;
      float* block_out = out + first * shape.query_stride();
      if (columns <= 0) {  // the whole block is left padding
        for (int64_t i = 0; i < rows; ++i) {
          std::fill(block_out + i * shape.query_stride(), block_out + i * shape.query_stride() + shape.head_dim, 0.0f);
          lse[first + i] = kInfinity;
        }
        continue;
      }
      BlockWeights(shape, q, k, real_keys, scale, first, rows, columns, nullptr, lse + first, weights.data());
      Gemm(false, false, rows, shape.head_dim, columns, 1.0f, weights.data(), columns,
           v + real_keys.first * shape.key_stride(), shape.key_stride(), 0.0f, block_out, shape.query_stride());
      // Normalised after the value product: over [rows, D] rather than [rows, columns].
      for (int64_t i = 0; i < rows; ++i) {
        const float maximum = lse[first + i];
        if (maximum == kNegativeInfinity) {
          lse[first + i] = kInfinity;  // the row's output is already 0: its weights were
          continue;
        }
        const float total = Sum(weights.data() + i * columns, columns);
        ScaleRow(block_out + i * shape.query_stride(), shape.head_dim, 1.0f / total);
        lse[first + i] = maximum + std::log(total);
      }
    }
  });
  return ffi::Error::Success();
}

// The gradient of one (row, key/value head) item: its query heads in turn, each adding to the shared key and value
// gradients, which is why the item is not one query head as in the forward pass.
ffi::Error Backward(Tensor4 queries, Tensor4 keys, Tensor4 values, KeyMask key_mask, Tensor4 output,
                    Tensor3 log_sum_exp, Tensor4 output_grad, Result4 query_grad, Result4 key_grad,
                    Result4 value_grad, float scale) {
  if (!KernelsSet()) return ffi::Error::Internal("mkl_attention: no kernels were set");
  const Shape shape = ShapeOf(queries, keys);
  if (ffi::Error error = CheckShapes(shape, keys, values, key_mask); error.failure()) return error;
  const int64_t query_stride = shape.query_stride();
  const int64_t key_stride = shape.key_stride();
  ForEachItem(shape.batch * shape.kv_heads, [&](int64_t item) {
    const int64_t b = item / shape.kv_heads;
    const int64_t kv = item % shape.kv_heads;
    const int64_t key_offset = b * shape.keys * key_stride + kv * shape.head_dim;
    const float* k = keys.typed_data() + key_offset;
    const float* v = values.typed_data() + key_offset;
    float* dk = key_grad->typed_data() + key_offset;
    float* dv = value_grad->typed_data() + key_offset;
    for (int64_t s = 0; s < shape.keys; ++s) {
      std::fill(dk + s * key_stride, dk + s * key_stride + shape.head_dim, 0.0f);
      std::fill(dv + s * key_stride, dv + s * key_stride + shape.head_dim, 0.0f);
    }
    const RealKeys real_keys(key_mask.typed_data() + b * shape.keys, shape.keys);
    const int64_t block = std::min(kQueryBlock, shape.length);
    std::vector<float> weights(block * shape.keys), weight_grads(block * shape.keys), row_dots(shape.length);
    for (int64_t h = kv * shape.group(); h < (kv + 1) * shape.group(); ++h) {
      const int64_t query_offset = b * shape.length * query_stride + h * shape.head_dim;
      const float* q = queries.typed_data() + query_offset;
      const float* out = output.typed_data() + query_offset;
      const float* d_out = output_grad.typed_data() + query_offset;
      float* dq = query_grad->typed_data() + query_offset;
      const float* lse = log_sum_exp.typed_data() + (b * shape.heads + h) * shape.length;
      // dO . O per query: the softmax's Jacobian subtracts it from every weight's gradient.
      for (int64_t t = 0; t < shape.length; ++t) {
        row_dots[t] = Dot(d_out + t * query_stride, out + t * query_stride, shape.head_dim);
      }
      for (int64_t first = 0; first < shape.length; first += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, shape.length - first);
        const int64_t columns = BlockEnd(shape, first, rows) - real_keys.first;
        float* block_dq = dq + first * query_stride;
        if (columns <= 0) {  // the whole block is left padding: no gradient
          for (int64_t i = 0; i < rows; ++i) {
            std::fill(block_dq + i * query_stride, block_dq + i * query_stride + shape.head_dim, 0.0f);
          }
          continue;
        }
        float* p = weights.data();
        float* dp = weight_grads.data();
        BlockWeights(shape, q, k, real_keys, scale, first, rows, columns, lse + first, nullptr, p);
        const float* block_d_out = d_out + first * query_stride;
        const int64_t key_start = real_keys.first * key_stride;
        // dV += P^T dO and dP = dO V^T.
        Gemm(true, false, columns, shape.head_dim, rows, 1.0f, p, columns, block_d_out, query_stride, 1.0f,
             dv + key_start, key_stride);
        Gemm(false, true, rows, columns, shape.head_dim, 1.0f, block_d_out, query_stride, v + key_start, key_stride,
             0.0f, dp, columns);
        for (int64_t i = 0; i < rows; ++i) {
          ScoreGradRow(dp + i * columns, p + i * columns, columns, row_dots[first + i], scale);
        }
        // dQ = dS K and dK += dS^T Q.
        Gemm(false, false, rows, shape.head_dim, columns, 1.0f, dp, columns, k + key_start, key_stride, 0.0f,
             block_dq, query_stride);
        Gemm(true, false, columns, shape.head_dim, rows, 1.0f, dp, columns, q + first * query_stride, query_stride,
             1.0f, dk + key_start, key_stride);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

extern "C" void mkl_attention_set_kernels(void* sgemm_address, void* set_local_threads_address) {
  sgemm = reinterpret_cast<Sgemm>(sgemm_address);
  set_local_threads = reinterpret_cast<SetLocalThreads>(set_local_threads_address);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(MklAttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<Tensor4>()
                                  .Arg<Tensor4>()
                                  .Arg<Tensor4>()
                                  .Arg<KeyMask>()
                                  .Ret<Tensor4>()
                                  .Ret<Tensor3>()
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MklAttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<Tensor4>()
                                  .Arg<Tensor4>()
                                  .Arg<Tensor4>()
                                  .Arg<KeyMask>()
                                  .Arg<Tensor4>()
                                  .Arg<Tensor3>()
                                  .Arg<Tensor4>()
                                  .Ret<Tensor4>()
                                  .Ret<Tensor4>()
                                  .Ret<Tensor4>()
                                  .Attr<float>("scale"));
