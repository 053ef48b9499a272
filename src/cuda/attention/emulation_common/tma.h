// Hopper's bulk-async copies on the host, with the names and signatures of fp8_wgmma_primitives.cuh
// / wgmma_primitives.cuh: TMA tile loads (the box of an emulated map, tensor_maps.h, into the
// Hopper kernel's shared memory, each byte at its swizzled address, zeros outside the tensor, then
// the bytes completed on the mbarrier), TMA reduce-adds of fp32 boxes (element-wise atomic adds,
// done at issue), and the shared stores and waits around them.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "cuda/attention/emulation_common/mbarriers.h"
#include "cuda/attention/emulation_common/sm90_shared_memory.h"
#include "cuda/attention/emulation_common/tensor_maps.h"
#include "cuda/attention/emulation_common/thread_model.h"

namespace flashgrad::cuda_attn_emulated::sm90 {

// A TMA tile load of a rank-`rank` one-byte map: the box at coordinates c (element l of the box,
// innermost coordinate first, to the swizzled address of dst + l).
inline void emu_tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, const int* c, int rank) {
  EmuMap m;
  std::memcpy(&m, map, sizeof(m));
  if (m.rank != rank || m.elem != 1) emu_fail("TMA load with a map of another rank or element size");
  int64_t volume = 1;
  for (int i = 0; i < rank; ++i) volume *= m.box[i];
  if ((dst % 1024) != 0 && m.swizzle == 128) emu_fail("TMA SWIZZLE_128B destination not 1024-byte aligned");
  for (int64_t l = 0; l < volume; ++l) {
    int64_t rem = l, off = 0;
    bool inside = true;
    for (int i = 0; i < rank; ++i) {
      const int64_t idx = c[i] + rem % m.box[i];
      rem /= m.box[i];
      inside = inside && idx >= 0 && idx < m.dims[i];
      off += idx * m.strides[i];
    }
    const uint32_t a = swizzle_address(dst + static_cast<uint32_t>(l), m.swizzle);
    if (a >= static_cast<uint32_t>(kSm90SmemBytes)) emu_fail("TMA destination outside shared memory");
    sm90_smem[a] = inside ? m.base[off] : 0;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  b.tx -= volume;
  mbar_complete_if_done(b);
}
inline void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  const int c[4] = {c0, c1, c2, c3};
  emu_tma_load(dst, map, bar, c, 4);
}
inline void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
  const int c[3] = {c0, c1, c2};
  emu_tma_load(dst, map, bar, c, 3);
}
inline void tma_prefetch_map(const CUtensorMap*) {}
inline void fence_proxy_async_shared() {}

// global box at (c0, c1, c2) of a 3-D fp32 map += the box in shared memory at src (element l of the
// box, in box order, at the swizzled address of src + 4 l), element-wise atomically (done at
// issue); elements outside the map's extent are skipped, as TMA does.
inline void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  const int c[3] = {c0, c1, c2};
  EmuMap m;
  std::memcpy(&m, map, sizeof(m));
  if (m.rank != 3 || m.elem != 4) emu_fail("TMA reduce-add with a map that is not 3-D fp32");
  if ((src % 1024) != 0 && m.swizzle == 128) emu_fail("TMA SWIZZLE_128B source not 1024-byte aligned");
  const int64_t volume = int64_t{m.box[0]} * m.box[1] * m.box[2];
  for (int64_t l = 0; l < volume; ++l) {
    int64_t rem = l, off = 0;
    bool inside = true;
    for (int i = 0; i < 3; ++i) {
      const int64_t idx = c[i] + rem % m.box[i];
      rem /= m.box[i];
      inside = inside && idx >= 0 && idx < m.dims[i];
      off += idx * m.strides[i];
    }
    const uint32_t a = swizzle_address(src + static_cast<uint32_t>(4 * l), m.swizzle);
    if (a + 4 > static_cast<uint32_t>(kSm90SmemBytes)) emu_fail("TMA reduce source outside shared memory");
    if (!inside) continue;
    float x;
    std::memcpy(&x, sm90_smem + a, 4);
    std::atomic_ref<float>(*reinterpret_cast<float*>(const_cast<uint8_t*>(m.base) + off)).fetch_add(x);
  }
}
inline void st_shared_v2_f32(uint32_t addr, float x, float y) {
  if (addr % 8 != 0 || addr + 8 > static_cast<uint32_t>(kSm90SmemBytes)) emu_fail("st.shared.v2.f32 misaligned or outside");
  std::memcpy(sm90_smem + addr, &x, 4);
  std::memcpy(sm90_smem + addr + 4, &y, 4);
}
inline void bulk_commit() {}
inline void bulk_wait_read_all() {}
inline void bulk_wait_all() {}

}  // namespace flashgrad::cuda_attn_emulated::sm90
