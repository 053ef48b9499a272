// CPU emulation of the FP8 wgmma backward (fp8_wgmma_backward_kernel.cuh, fp8_wgmma_backward_maps.h):
// runs the kernel's own source on host threads, one std::thread per CUDA thread, inside the whole
// FP8 backward as fp8_attention_host.cpp runs it (the mma.sync FP8 forward and pre-passes, also their
// own source, from the mma.sync emulation's rewritten headers; dq = scale dq_accum afterwards, or the
// deterministic dq kernel), and checks out, lse, dq, dk, dv against the recipe emulated in fp32 and
// the fp32 reference (tests/cpp/attention_fp8_recipe.h) by the GPU tests' rules (relative RMS bars,
// the 2x rule).
//
// Emulated (in ../emulation_common/, with the thread model, the mma.sync PTX, the maps, mbarriers
// and TMA that the mma.sync harness fp8_emulation/ and the FP8 wgmma forward's
// fp8_wgmma_emulation/ use too): wgmma e4m3 (both operands K-major through descriptors,
// Hopper's reduced-precision accumulation modelled; exact with FP8_EMULATION_EXACT_ACCUMULATOR=1),
// 16-bit wgmma with A from registers (the m16n8k16 A layout per warp) or from an MN-major descriptor
// and B MN-major (8-row k groups SBO apart, 64-element panels of the MN dim LBO apart: the bf16
// wgmma kernels' convention, which the H200 runs), named barriers, bulk reduce-adds (at issue).
// wgmma runs at issue, so a missing wait, races and speed are not checked; an mbarrier that gets
// more arrivals than its count, or a wait that does not finish in 20 s, is reported. This file
// holds the backward's main pass (maps and launch) and the cases. Build and run with run.sh.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention/emulation_common/thread_model.h"
#include "cuda/attention/emulation_common/mma_sync_ptx.h"
#include "cuda/attention/emulation_common/scalar_ptx.h"
#include "cuda/attention/emulation_common/sm90_shared_memory.h"

// The wgmma kernel's dynamic shared memory (its namespace's smem_raw), beside the mma.sync
// kernels' (smem_raw, mma_sync_ptx.h).
namespace flashgrad::cuda_attn_emulated::fp8wb {
alignas(1024) unsigned char smem_raw[kSm90SmemBytes];
}
unsigned char* const sm90_smem = flashgrad::cuda_attn_emulated::fp8wb::smem_raw;

// Shared-window addresses (__cvta_generic_to_shared): offsets into whichever of the two arrays
// holds p.
inline uint64_t emu_shared_offset(const void* p) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c >= sm90_smem && c < sm90_smem + kSm90SmemBytes) return static_cast<uint64_t>(c - sm90_smem);
  return static_cast<uint64_t>(c - smem_raw);
}

#include "cuda/attention/emulation_common/mbarriers.h"
#include "cuda/attention/emulation_common/tma.h"
#include "cuda/attention/emulation_common/wgmma.h"

void emu_prepare_block() {
  std::memset(smem_raw, 0xff, sizeof(smem_raw));
  std::memset(sm90_smem, 0xff, kSm90SmemBytes);
  reset_barriers();
}

#include "fp8_backward_kernel.cuh"
#include "fp8_wgmma_backward_kernel.cuh"
#include "fp8_wgmma_backward_maps.h"
#include "fp8_dq_kernel.cuh"
#include "fp8_forward_kernel.cuh"
#include "fp8_prepass_kernels.cuh"

#include "cuda/attention/emulation_common/fp8_cases.h"
#include "cuda/attention/emulation_common/fp8_mma_sync_pipeline.h"
#include "cuda/attention/emulation_common/fp8_output_checks.h"

namespace {

using namespace flashgrad;
using namespace flashgrad::fp8_emulation;
namespace fp8wb = flashgrad::cuda_attn_emulated::fp8wb;

// The whole FP8 attention as fp8_attention_host.cpp runs it with the wgmma backward kernel
// (kLag: the lagged-dQ schedule) as the backward's main pass.
template <int D, bool kLag>
Fp8Outputs run_emulated(Fp8Case& c) {
  return run_fp8_attention<D>(c, [&](Fp8KernelParams& f, bool bf16) {
    const Fp8Config& cfg = c.cfg;
    // The main pass: the wgmma kernel with the maps its launcher builds (fp8_wgmma_backward.cu).
    using WCfg = fp8wb::Fp8WgmmaBackwardConfig<D, kLag>;
    const int nblocks = (c.max_k + WCfg::kBlockN - 1) / WCfg::kBlockN;
    fp8wb::Fp8WgmmaBackwardMaps maps;
    fp8wb::Fp8WgmmaBackwardAxes axes;
    const fp8wb::MapSet set{&maps.q8, &maps.k8, &maps.v8, &maps.do8, &maps.q16, &maps.do16, &maps.k16,
                            &axes.q8, &axes.k8, &axes.v8, &axes.do8, &axes.q16, &axes.do16, &axes.k16,
                            &maps.dq};
    const int64_t batches = c.varlen ? 1 : c.n;
    const int64_t rows_q = c.varlen ? c.tq : c.max_q, rows_k = c.varlen ? c.tk : c.max_k;
    if (!fp8wb::make_backward_maps(emu_encode, f, rows_q, rows_k, batches, D, WCfg::kBlockM, WCfg::kBlockN, set)) {
      std::printf("    the map code refused a view (%d refusals)\n", g_maps_refused);
      std::exit(2);
    }
    if (bf16)
      launch(c.n * nblocks, cfg.hk, WCfg::kThreads,
             [&] { fp8wb::fp8_attention_backward_wgmma_kernel<__nv_bfloat16, D, kLag>(maps, f, axes, nblocks); });
    else
      launch(c.n * nblocks, cfg.hk, WCfg::kThreads,
             [&] { fp8wb::fp8_attention_backward_wgmma_kernel<__half, D, kLag>(maps, f, axes, nblocks); });
  });
}

// A case named "... (lagged dQ)" runs the lagged-dQ schedule (hd 128).
void check_case(const Fp8Config& cfg, std::mt19937& rng) {
  const bool lag = cfg.name.find("(lagged dQ)") != std::string::npos;
  check_forward_backward_case(cfg, rng, [&](Fp8Case& c) {
    return cfg.d == 256 ? run_emulated<256, false>(c)
           : cfg.d == 64 ? run_emulated<64, false>(c)
           : lag        ? run_emulated<128, true>(c)
                        : run_emulated<128, false>(c);
  });
}

}  // namespace

int main(int argc, char** argv) {
  configure_e4m3_accumulator("FP8_EMULATION_EXACT_ACCUMULATOR", "mma");
  std::mt19937 rng = seeded_generator();
  // "quick": one full-tile and one masked varlen GQA case.
  const CasePicker picker{argc > 1 ? argv[1] : "",
                          {"none d128 Sq=70 Sk=130", "varlen causal d128 gqa 4/2 with empty sequences",
                           "none d256 B2 gqa 4/2 Sq=150 Sk=140", "causal d128 B2 mqa 3/1 Sq=Sk=200 (lagged dQ)",
                           "causal d64 B2 gqa 4/2 Sq=150 Sk=200"}};
  std::vector<Fp8Config> cases;
  auto add = [&](std::string name, Fp8Config c) {
    c.name = std::move(name);
    if (picker.picks(c.name)) cases.push_back(c);
  };
  // Two batches, Sq = Sk = 200: none with GQA 4/2, then causal with MQA 3/1 (suffix: the schedule).
  auto add_b2_200 = [&](const std::string& suffix) {
    Fp8Config c;
    c.d = 128;
    c.batch = 2;
    c.hq = 4;
    c.hk = 2;
    c.sq = c.sk = 200;
    c.mask = MaskKind::none;
    add("none d128 B2 gqa 4/2 Sq=Sk=200" + suffix, c);
    c.mask = MaskKind::causal;
    c.hq = 3;
    c.hk = 1;
    add("causal d128 B2 mqa 3/1 Sq=Sk=200" + suffix, c);
  };
  // Two batches of GQA 4/2, Sq = 150 and the given Sk, unmasked then causal.
  auto add_b2_gqa = [&](int d, int sk) {
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      Fp8Config c;
      c.d = d;
      c.mask = m;
      c.batch = 2;
      c.hq = 4;
      c.hk = 2;
      c.sq = 150;
      c.sk = sk;
      add(std::string(mask_name(m)) + " d" + std::to_string(d) + " B2 gqa 4/2 Sq=150 Sk=" + std::to_string(sk), c);
    }
  };
  // Varlen GQA with empty sequences, softcap, dlse and z-loss: fp16 out, then deterministic dq
  // with bf16 out (suffix: the schedule).
  auto add_varlen_softcap_dlse = [&](int d, const std::string& suffix) {
    Fp8Config c = varlen_gqa_with_empty_sequences(d);
    c.softcap = 5.f;
    c.with_dlse = true;
    c.z_loss = 0.5f;
    c.out_dtype = DType::f16;
    add("varlen causal d" + std::to_string(d) + " gqa 4/2 softcap dlse z-loss fp16 out" + suffix, c);
    c.deterministic = true;
    c.out_dtype = DType::bf16;
    add("deterministic varlen causal d" + std::to_string(d) + " softcap" + suffix, c);
  };
  for (MaskKind m : {MaskKind::none, MaskKind::causal})
    add(std::string(mask_name(m)) + " d128 Sq=70 Sk=130", one_sequence(128, m, 70, 130));
  // Eight tiles per key block: the two-slot ring wraps several times (phases), GQA heads summed.
  add_b2_200("");
  {
    Fp8Config c = varlen_gqa_with_empty_sequences(128);
    add("varlen causal d128 gqa 4/2 with empty sequences", c);
    c.deterministic = true;
    c.softcap = 5.f;
    add("deterministic varlen causal d128 softcap", c);
  }
  add("varlen window 20,3 d128", varlen_window_20_3(128));
  {
    Fp8Config c = causal_softcap_dlse_zloss_fp16();
    add("causal Sq>Sk softcap tanh dlse z-loss fp16 out d128", c);
    c.method = SoftcapMethod::soft_sign;
    c.out_dtype = DType::bf16;
    add("causal Sq>Sk softcap soft_sign dlse z-loss d128", c);
  }
  add("prefix_lm d128", prefix_lm_three_sequences(128, 100));
  add("candidate_isolation d128", candidate_isolation_three_sequences(128, 100));
  add("none d128 H1 Sq=40 Sk=1000", long_rows(128, 1000));
  // D = 64 (FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD64=1): 64-byte e4m3 rows with SWIZZLE_64B.
  add_b2_gqa(64, 200);
  add_varlen_softcap_dlse(64, "");
  // The lagged-dQ schedule (FLASHGRAD_ATTN_FP8_WGMMA_BWD_LAG=1).
  add_b2_200(" (lagged dQ)");
  add_varlen_softcap_dlse(128, " (lagged dQ)");
  // D = 256: 64-key CTAs, the head dim split between the warpgroups, one 16-bit slot, dQ by atomics.
  add_b2_gqa(256, 140);
  add_varlen_softcap_dlse(256, "");
  for (auto& c : cases) check_case(c, rng);
  return finish();
}
