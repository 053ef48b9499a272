// What the FP8 emulation harnesses check and how a run is driven: each output of the emulated
// kernels against the fp32 reference, by the GPU tests' rules (within r x the recipe's error plus
// a rounding tolerance, the 2x rule, and under a relative RMS bar), with the failures counted; the
// inputs' seed; which cases a command line picks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention_fp8_recipe.h"

namespace flashgrad::fp8_emulation {

using fp8_test::Fp8Config;
using fp8_test::Fp8Outputs;

int g_failures = 0;

// One output (what: its name) of the emulated kernels (got) against the fp32 reference, beside the
// recipe emulated in fp32 (emu); rounding: the output's dtype (f32: the lse, with the score
// accumulator's tolerance for emu_score_terms terms); rms_bar <= 0: no RMS bar. subject names the
// emulated code in the printed line ("kernel" or "kernels").
inline void check_output(const char* subject, const char* what, const std::vector<float>& got,
                         const std::vector<float>& ref, const std::vector<float>& emu, DType rounding, double r,
                         double rms_bar, double emu_score_terms = 0) {
  const double err = fp8_test::max_diff(got, ref), base = fp8_test::max_diff(emu, ref);
  const double atol = rounding == DType::f32
                          ? fp8_test::lse_atol(ref) + fp8_test::score_accumulator_atol(emu_score_terms)
                          : fp8_test::rounding_atol(ref, rounding);
  const double rms = fp8_test::rel_rms(got, ref), rms_emu = fp8_test::rel_rms(emu, ref);
  const bool ok = err <= r * base + atol && !std::isnan(rms) && (rms_bar <= 0 || rms <= rms_bar);
  g_failures += !ok;
  std::printf("    %-4s rel RMS %s %.4f recipe %.4f | max|%s-ref| %.3e max|recipe-ref| %.3e atol %.1e %s\n", what,
              subject, rms, rms_emu, subject, err, base, atol, ok ? "ok" : "FAIL");
}

// out and lse (and with grads, dq, dk, dv) by their bars; the 2x rule relaxed to 3x with a softcap.
inline void check_outputs(const char* subject, const Fp8Config& cfg, const Fp8Outputs& got, const Fp8Outputs& ref,
                          const Fp8Outputs& emu, bool grads) {
  const double r = cfg.softcap > 0.f ? 3.0 : 2.0;
  check_output(subject, "out", got.out, ref.out, emu.out, cfg.out_dtype, r, 0.03);
  check_output(subject, "lse", got.lse, ref.lse, emu.lse, DType::f32, r, 0, emu.score_terms_max);
  if (grads) {
    check_output(subject, "dq", got.dq, ref.dq, emu.dq, cfg.out_dtype, r, 0.08);
    check_output(subject, "dk", got.dk, ref.dk, emu.dk, cfg.out_dtype, r, 0.08);
    check_output(subject, "dv", got.dv, ref.dv, emu.dv, cfg.out_dtype, r, 0.08);
  }
  std::fflush(stdout);
}

// A forward + backward case: inputs drawn from rng, the fp32 reference and the recipe, run(c) the
// emulated kernels' outputs; then its line and the checks of all five outputs.
template <typename Run>
void check_forward_backward_case(const Fp8Config& cfg, std::mt19937& rng, const Run& run) {
  fp8_test::Fp8Case c = fp8_test::make_case(cfg, rng);
  const Fp8Outputs ref = fp8_test::reference32(c);
  const Fp8Outputs emu = fp8_test::recipe(c);
  const Fp8Outputs got = run(c);
  std::printf("  case %s\n", cfg.name.c_str());
  check_outputs("kernels", cfg, got, ref, emu, /*grads=*/true);
}

// The inputs' generator: FLASHGRAD_EMULATION_SEED=<n> repeats a run's inputs (to compare two
// builds line by line); otherwise a fresh seed, printed so that a failure can be repeated.
inline std::mt19937 seeded_generator() {
  const char* seed_env = std::getenv("FLASHGRAD_EMULATION_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : std::random_device{}();
  std::printf("inputs: seed %u\n", seed);
  return std::mt19937(seed);
}

// Which cases the command line's argument picks: "quick" the named quick set, else every case whose
// name contains it (all when empty).
struct CasePicker {
  std::string only;
  std::vector<std::string> quick;
  bool picks(const std::string& name) const {
    return only == "quick" ? std::find(quick.begin(), quick.end(), name) != quick.end()
                           : only.empty() || name.find(only) != std::string::npos;
  }
};

// The summary line and the exit status.
inline int finish() {
  std::printf("%s: %d failed checks\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace flashgrad::fp8_emulation
