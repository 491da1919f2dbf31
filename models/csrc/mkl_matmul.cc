// A batch of float32 GEMMs, C[i] = op(A[i]) op(B[i]) on row-major [batch, rows, columns] buffers, as an XLA FFI
// handler for the CPU backend.
//
// The kernels are MKL's ILP64 Fortran `sgemm` (a batch of one) and `sgemm_batch` (MKL spreads the batch over its
// threads), reached through function pointers that `models/mkl_matmul.py` sets once from the MKL build torch ships,
// so this library links against nothing but the C++ runtime.
// docs/decisions/031-mkl-matmul-on-intel-cpus.md says why the learner calls it instead of XLA:CPU's own dot.

#include <cstdint>
#include <cstring>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Fortran calling convention: every argument by pointer, column-major matrices, 64-bit integers (ILP64).
using Sgemm = void (*)(const char* transa, const char* transb, const int64_t* m, const int64_t* n, const int64_t* k,
                       const float* alpha, const float* a, const int64_t* lda, const float* b, const int64_t* ldb,
                       const float* beta, float* c, const int64_t* ldc);

// The same with one group of `group_size` products sharing their sizes and flags (MKL's group API, one group).
using SgemmBatch = void (*)(const char* transa, const char* transb, const int64_t* m, const int64_t* n,
                            const int64_t* k, const float* alpha, const float** a, const int64_t* lda, const float** b,
                            const int64_t* ldb, const float* beta, float** c, const int64_t* ldc,
                            const int64_t* group_count, const int64_t* group_size);

Sgemm sgemm = nullptr;
SgemmBatch sgemm_batch = nullptr;

using Matrices = ffi::Buffer<ffi::F32, 3>;
using ResultMatrices = ffi::ResultBuffer<ffi::F32, 3>;

ffi::Error Matmul(Matrices a, Matrices b, ResultMatrices c, bool transpose_a, bool transpose_b) {
  if (sgemm == nullptr || sgemm_batch == nullptr) {
    return ffi::Error::Internal("mkl_matmul: no kernels were set (models.mkl_matmul sets them before any call)");
  }
  const auto a_dims = a.dimensions();
  const auto b_dims = b.dimensions();
  const auto c_dims = c->dimensions();
  const int64_t batch = a_dims[0];
  const int64_t m = transpose_a ? a_dims[2] : a_dims[1];
  const int64_t k = transpose_a ? a_dims[1] : a_dims[2];
  const int64_t b_k = transpose_b ? b_dims[2] : b_dims[1];
  const int64_t n = transpose_b ? b_dims[1] : b_dims[2];
  if (b_dims[0] != batch || k != b_k || c_dims[0] != batch || c_dims[1] != m || c_dims[2] != n) {
    return ffi::Error::InvalidArgument("mkl_matmul: operand and result shapes do not agree");
  }
  if (batch == 0 || m == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {
    std::memset(c->typed_data(), 0, sizeof(float) * batch * m * n);
    return ffi::Error::Success();
  }
  // A row-major [r, s] buffer is the column-major [s, r] matrix, its transpose. So the row-major C = op(A) op(B)
  // is the column-major C^T = op(B)^T op(A)^T: B's buffer first, each operand's transpose flag unchanged.
  const int64_t ld_a = a_dims[2];
  const int64_t ld_b = b_dims[2];
  const int64_t ld_c = n;
  const char trans_a = transpose_a ? 'T' : 'N';
  const char trans_b = transpose_b ? 'T' : 'N';
  const float one = 1.0f;
  const float zero = 0.0f;
  if (batch == 1) {
    sgemm(&trans_b, &trans_a, &n, &m, &k, &one, b.typed_data(), &ld_b, a.typed_data(), &ld_a, &zero,
          c->typed_data(), &ld_c);
    return ffi::Error::Success();
  }
  std::vector<const float*> a_items(batch), b_items(batch);
  std::vector<float*> c_items(batch);
  for (int64_t i = 0; i < batch; ++i) {
    a_items[i] = a.typed_data() + i * a_dims[1] * a_dims[2];
    b_items[i] = b.typed_data() + i * b_dims[1] * b_dims[2];
    c_items[i] = c->typed_data() + i * m * n;
  }
  const int64_t groups = 1;
  sgemm_batch(&trans_b, &trans_a, &n, &m, &k, &one, b_items.data(), &ld_b, a_items.data(), &ld_a, &zero,
              c_items.data(), &ld_c, &groups, &batch);
  return ffi::Error::Success();
}

}  // namespace

extern "C" void mkl_matmul_set_kernels(void* sgemm_address, void* sgemm_batch_address) {
  sgemm = reinterpret_cast<Sgemm>(sgemm_address);
  sgemm_batch = reinterpret_cast<SgemmBatch>(sgemm_batch_address);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(MklMatmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<Matrices>()
                                  .Arg<Matrices>()
                                  .Ret<Matrices>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
