// CPU emulation of the FP8 attention kernels: runs their own source (fp8_prepass_kernels.cuh,
// fp8_forward_kernel.cuh, fp8_backward_kernel.cuh and the 16-bit headers they reuse) on host
// threads, one std::thread per CUDA thread, with the inline PTX replaced by host emulations
// (rewrite_asm.py does the replacement in a copy of the headers), and checks forward and backward
// against the recipe emulated in fp32 and the fp32 reference (tests/cpp/attention_fp8_recipe.h) by
// the GPU test's rules: relative RMS bars and the 2x rule. The thread model, the PTX emulations
// and the checks live in ../emulation_common/ (shared with the FP8 wgmma harnesses); this file
// holds what is particular to these kernels: the backward's main pass and the cases.
//
// What it checks: index math, fragment layouts (ldmatrix, mma.m16n8k32 e4m3, mma.m16n8k16), the
// key permutation between P and the transposed V copy, swizzles, barriers (shared memory is
// poisoned with NaN bytes before each block), masks, varlen bookkeeping, descales and the
// pre-passes. What it cannot check: the hardware (the emulated PTX follows the ISA's definitions,
// as does fp8_fragments.cuh; ex2.approx is emulated by exp2f), races, speed, register spills.
// The copied headers live in namespace flashgrad::cuda_attn_emulated (rewrite_asm.py renames it),
// so nothing here collides with the CUDA library's kernels when linked against a CUDA build.
// Build and run with run.sh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention/emulation_common/thread_model.h"
#include "cuda/attention/emulation_common/mma_sync_ptx.h"
#include "cuda/attention/emulation_common/scalar_ptx.h"

// Shared-window addresses (__cvta_generic_to_shared): offsets into the kernels' shared memory.
inline uint64_t emu_shared_offset(const void* p) {
  return static_cast<uint64_t>(static_cast<const unsigned char*>(p) - smem_raw);
}
void emu_prepare_block() { std::memset(smem_raw, 0xff, sizeof(smem_raw)); }

#include "fp8_backward_kernel.cuh"
#include "fp8_dq_kernel.cuh"
#include "fp8_forward_kernel.cuh"
#include "fp8_prepass_kernels.cuh"

#include "cuda/attention/emulation_common/fp8_cases.h"
#include "cuda/attention/emulation_common/fp8_mma_sync_pipeline.h"
#include "cuda/attention/emulation_common/fp8_output_checks.h"

namespace {

using namespace flashgrad;
using namespace flashgrad::fp8_emulation;
namespace fp8 = flashgrad::cuda_attn_emulated::fp8;

// The whole FP8 attention with the mma.sync backward kernel as the backward's main pass.
template <int D>
Fp8Outputs run_emulated(Fp8Case& c) {
  return run_fp8_attention<D>(c, [&](Fp8KernelParams& f, bool bf16) {
    using BCfg = fp8::Fp8BackwardConfig<D>;
    const int nblocks = (c.max_k + BCfg::kBlockN - 1) / BCfg::kBlockN;
    if (bf16)
      launch(c.n * nblocks, c.cfg.hk, BCfg::kThreads,
             [&] { fp8::fp8_attention_backward_kernel<__nv_bfloat16, D>(f, nblocks); });
    else
      launch(c.n * nblocks, c.cfg.hk, BCfg::kThreads, [&] { fp8::fp8_attention_backward_kernel<__half, D>(f, nblocks); });
  });
}

void check_case(const Fp8Config& cfg, std::mt19937& rng) {
  check_forward_backward_case(cfg, rng, [&](Fp8Case& c) {
    return cfg.d == 64 ? run_emulated<64>(c) : cfg.d == 128 ? run_emulated<128>(c) : run_emulated<256>(c);
  });
}

}  // namespace

int main(int argc, char** argv) {
  configure_e4m3_accumulator("FP8_EMULATION_EXACT_ACCUMULATOR", "mma");
  std::mt19937 rng = seeded_generator();
  // "quick" (for CTest): one case per kernel path at hd 64, about a minute on 2 cores.
  const CasePicker picker{argc > 1 ? argv[1] : "",
                          {"causal d64 Sq=70 Sk=130", "varlen causal d64 gqa 4/2 with empty sequences",
                           "candidate_isolation d64", "deterministic varlen causal d64"}};
  std::vector<Fp8Config> cases;
  auto add = [&](std::string name, Fp8Config c) {
    c.name = std::move(name);
    if (picker.picks(c.name)) cases.push_back(c);
  };
  for (int d : {64, 128, 256})
    for (MaskKind m : {MaskKind::none, MaskKind::causal})
      add(std::string(mask_name(m)) + " d" + std::to_string(d) + " Sq=70 Sk=130", one_sequence(d, m, 70, 130));
  {
    Fp8Config c = varlen_gqa_with_empty_sequences(64);
    add("varlen causal d64 gqa 4/2 with empty sequences", c);
    c.d = 128;
    c.mask = MaskKind::sliding_window;
    c.wl = 20;
    c.wr = 3;
    add("varlen window 20,3 d128", c);
  }
  add("causal Sq>Sk softcap tanh dlse z-loss fp16 out d128", causal_softcap_dlse_zloss_fp16());
  add("prefix_lm d128", prefix_lm_three_sequences(128, 100));
  add("candidate_isolation d64", candidate_isolation_three_sequences(64, 100));
  for (int d : {64, 256}) {
    Fp8Config c = varlen_gqa_with_empty_sequences(d);
    c.deterministic = true;
    c.softcap = d == 256 ? 5.f : 0.f;
    add("deterministic varlen causal d" + std::to_string(d) + (d == 256 ? " softcap" : ""), c);
  }
  add("none d64 Sq=40 Sk=3000 (long rows: accumulator drift)", long_rows(64, 3000));
  for (auto& c : cases) check_case(c, rng);
  return finish();
}
