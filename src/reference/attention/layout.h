// How the CPU reference finds a row of a token-major attention tensor.
//
// Padded tensors are [B, S, H, X] and packed ones [T, H, X]; in both, the row of sequence n,
// position i, head h holds X contiguous elements (validation guarantees stride 1 in the last dim).
// Writing `token` for the position inside the token dimension (padded: i; packed: the sequence's
// first token cu_seqlens[n] + i), the row starts at element
//     n * batch_stride + token * token_stride + h * head_stride
// with batch_stride = 0 for packed tensors. lse ([B, H, S] / [H, T]) uses the same three strides,
// only stored in another order, so one struct serves both. All offsets are int64: B*S*H*X passes
// 2^31 in ordinary training shapes.
#pragma once

#include <cstdint>

#include "core/host_dtype.h"
#include "core/problems.h"

namespace flashgrad::reference::attn {

struct Rows {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t batch_stride = 0, token_stride = 0, head_stride = 0;

  int64_t offset(int64_t n, int64_t token, int64_t h) const {
    return n * batch_stride + token * token_stride + h * head_stride;
  }
  template <typename T>
  T load(int64_t offset_elems) const { return host::load<T>(data, dtype, offset_elems); }
  template <typename T>
  void store(int64_t offset_elems, T value) const { host::store<T>(data, dtype, offset_elems, value); }
};

// Copies the X elements of the row starting at `offset` into dst, times `mul` (an fp8 descale,
// else 1), in the compute type T.
template <typename T>
inline void load_row(const Rows& r, int64_t offset, int64_t x, T mul, T* dst) {
  host::load_n<T>(r.data, r.dtype, offset, x, dst);
  if (mul != T(1))
    for (int64_t e = 0; e < x; ++e) dst[e] *= mul;
}

// Rounds the X values of src once into the row starting at `offset`, times `mul`.
template <typename T>
inline void store_row(const Rows& r, int64_t offset, int64_t x, T mul, const T* src) {
  for (int64_t e = 0; e < x; ++e) r.store<T>(offset + e, src[e] * mul);
}

// q, k, v, out, dout, dq, dk, dv: [B, S, H, X] or [T, H, X].
inline Rows token_rows(const TensorView& t) {
  Rows r{t.data, t.dtype};
  if (t.rank == 4) {
    r.batch_stride = t.stride[0];
    r.token_stride = t.stride[1];
    r.head_stride = t.stride[2];
  } else {
    r.token_stride = t.stride[0];
    r.head_stride = t.stride[1];
  }
  return r;
}

// lse, dlse: [B, H, S] or [H, T]. Absent views give data == nullptr.
inline Rows lse_rows(const TensorView& t) {
  Rows r{t.present() ? t.data : nullptr, t.dtype};
  if (!t.present()) return r;
  if (t.rank == 3) {
    r.batch_stride = t.stride[0];
    r.head_stride = t.stride[1];
    r.token_stride = t.stride[2];
  } else {
    r.head_stride = t.stride[0];
    r.token_stride = t.stride[1];
  }
  return r;
}

// fp8 descales: float32 [N, Hk]; absent (1.0) for other dtypes.
struct Descale {
  const TensorView* t = nullptr;
  template <typename T>
  T at(int64_t n, int64_t kv_head) const {
    if (t == nullptr || !t->present()) return T(1);
    return static_cast<T>(t->ptr<const float>()[n * t->stride[0] + kv_head * t->stride[1]]);
  }
};

}  // namespace flashgrad::reference::attn
