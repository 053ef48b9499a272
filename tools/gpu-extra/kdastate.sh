#!/usr/bin/env bash
# kdastate (issue 6: chunked KDA stage 2, docs/perf/delta_rule.md "KDA stage 2 (session 8)").
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu and the package
# install (cap 150 s, aims at <= 140 s; $OUT/extra/ collects the logs):
#   1. the DeltaRuleChunkedKda* GPU tests, DeltaRuleGpu.ChunkedAlgorithmMatches (its KDA cases) and
#      DeltaRuleGpu.Kda* with FLASHGRAD_CHUNKED_KDA_STATE=transposed (the session-8 kernel, single-
#      fragment products; opt-in: the default is still session 6's kda_state_kernel); the
#      DeltaRuleChunkedKda* ones again with =split (the session-8 kernel with hi + lo operands);
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16 through flashgrad.chunk_kda, in one process: the old
#      stage 2 (the default, "old"), =split, then =transposed ("new"): forward and backward wall,
#      every kda_* kernel's CUDA time per call (torch.profiler), and the output / final state /
#      gradients of split and new against the old ones (rel RMS);
#   3. if >= 30 s are left: ncu of one launch of the new stage 2.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdastate 1/3: KDA GPU tests with FLASHGRAD_CHUNKED_KDA_STATE=transposed (and =split)"
job_tests kdastate_tests 45 'DeltaRuleChunkedKda*:DeltaRuleGpu.ChunkedAlgorithmMatches:DeltaRuleGpu.Kda*' \
  FLASHGRAD_CHUNKED_KDA_STATE=transposed
job_tests kdastate_tests_split 25 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_STATE=split

echo "== kdastate 2/3: chunk KDA B4 T4096 H16 K=V=128 bf16, old vs split vs new stage 2 (one process)"
job_compare kdastate_compare 55 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_STATE \
  --variants old=-,split=split,new=transposed --focus 'kda_state(_transposed)?_kernel' --note "fla fwd 0.95 / bwd 4.17" --reps 5,3,2

echo "== kdastate 3/3: ncu of one launch of the new stage 2, if time is left"
if [ "$(left)" -gt 30 ]; then
  job_ncu kdastate_ncu_new $(( $(left) - 4 )) kda_state_transposed_kernel 0 FLASHGRAD_CHUNKED_KDA_STATE=transposed \
    -- --kind kda --B 4 --T 4096 --H 16 --K 128
else
  summary+=("ncu: skipped (< 30 s left)")
fi
job_summary kdastate
