#!/usr/bin/env bash
# fwdstore (issue 6, session 22; docs/perf/delta_rule.md "Session 22"): the serial chains' stores and P.
# The fused forward chain (chunk_state_kernel with the output) writes o through a warp-private shared
# tile, 16 bytes per lane and quarter (it was ~20 instructions of 64-bit index arithmetic per element,
# ~650 of its ~2770 per warp and chunk); the 8-warp B1 (chunk_state_backward_transposed_kernel) writes
# dh and dv_new the same way; both deal P's 20 tiles 5 per SM scheduler (p_tile_deal; was 2 4 6 8).
# Run 22.1 (before): chunk_state 0.625 ms, B1 0.533 at B8 T4096; K = V = 64: 0.154, 0.350. Run 22.2 (after):
# 0.505, 0.466. Run 22.3 (P's store with ex2 and float2 factors, commit 0160fb7): 0.465, 0.439; K = V = 64's
# 4-warp B1 0.270. The notes in step 2 carry these for the next run of this job.
# After tools/gpu-check's build into build-gpu:
#   1. the chunked delta-rule GPU tests (defaults), the past-2^31 test and the KDA chunked tests, then the
#      chunked tests again with the fused forward and the 8-warp B1 forced on their small shapes;
#   2. every kernel's time per call at B8 T4096 (all kernels, the glue included), B1 T32768,
#      B8 K = V = 64 and KDA B4 T4096 (one process each; stage 3 and KDA's output kernel store o by
#      column pairs from row pointers formed once);
#   3. ncu of the forward chain and of B1 (instructions, issue);
#   4. racecheck / memcheck of the fused forward and the 8-warp B1 (forced) on small cases;
#   5. the delta-rule pytest GPU tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT
P=(--kind gdn --B 8 --T 4096 --H 16 --K 128)

# Knobs (environment): FWDSTORE_TESTS=all runs the whole C++ GPU suite in step 1 (a session's last
# call); FWDSTORE_SHAPES picks step 2's shapes (default "b8 t32k k64 kda"); FWDSTORE_NCU_SOURCE=1 adds
# step 3's stall samples by SASS line and segment (kdaprep_ncu_source.py).
shapes=" ${FWDSTORE_SHAPES:-b8 t32k k64 kda} "
want() { [[ "$shapes" == *" $1 "* ]]; }

if [ "${FWDSTORE_TESTS:-}" = all ]; then
  echo "== fwdstore 1/5: the whole C++ GPU suite (defaults)"
  job_tests fwdstore_all 160 "*"
else
  echo "== fwdstore 1/5: chunked delta-rule GPU tests (defaults)"
  job_tests fwdstore_chunked 110 "DeltaRuleGpu.Chunked*:DeltaRuleChunked*:DeltaRuleGpu.PastTwoToThe31Elements:DeltaRuleGpu.Kda*"
fi
# The tests' shapes are small (few chains): force the two changed kernels on them. ChunkedB1Wgmma and
# ChunkedStateChainsOptIn assert that the launcher takes their own B1 (which the forced 8-warp B1
# overrides; run 22.2), so they are left out here.
job_tests fwdstore_forced 60 "DeltaRuleGpu.Chunked*:DeltaRuleChunked*-DeltaRuleGpu.ChunkedB1Wgmma:DeltaRuleGpu.ChunkedStateChainsOptIn" \
  FLASHGRAD_CHUNKED_FUSED_OUTPUT=1 FLASHGRAD_CHUNKED_B1_WARPS=8

echo "== fwdstore 2/5: per-call kernel times:${shapes}(one process each)"
want b8 && job_compare fwdstore_b8 30 --kind gdn --shape 8,4096,16,128 --env $V --variants default=- --kernels '^(.{0,60})' \
  --focus 'chunk_state_kernel|chunk_state_backward_transposed' --note "(run 22.1: chunk_state 0.625, B1 0.533; 22.2: 0.505, 0.466; 22.3: 0.465, 0.439)"
want t32k && job_compare fwdstore_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V --variants default=- \
  --focus 'chunk_output' --note "(run 22.1: chunk_output 0.320; 22.2: 0.320)"
want k64 && job_compare fwdstore_k64 25 --kind gdn --shape 8,4096,16,64 --env $V --variants default=- \
  --focus 'chunk_output|chunk_state_kernel|chunk_state_backward_transposed' --note "(run 22.1: chunk_output 0.142, chunk_state 0.154, B1 0.350; 22.2: 0.141, 0.157, 0.347; 22.3: 0.141, 0.156, 0.270)"
want kda && job_compare fwdstore_kda 30 --kind kda --shape 4,4096,16,128 --env $V --variants default=- \
  --focus 'kda_output' --note "(run 11.3: kda_output 0.318; 22.2: 0.283)"

echo "== fwdstore 3/5: ncu of the forward chain (first launch) and of B1"
JOB_NCU_SKIP=0 job_ncu fwdstore_chain 45 'chunk_state_kernel' "${FWDSTORE_NCU_SOURCE:-0}" - -- "${P[@]}"
JOB_NCU_SKIP=0 job_ncu fwdstore_b1 45 'chunk_state_backward_transposed_kernel' "${FWDSTORE_NCU_SOURCE:-0}" - -- "${P[@]}"

echo "== fwdstore 4/5: racecheck / memcheck, small cases"
job_sanitize fwdstore_san 60 'DeltaRuleGpu.ChunkedKeptVNewFusedForward:DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128' \
  'DeltaRuleGpu.ChunkedKeptVNewFusedForward:DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128' \
  FLASHGRAD_CHUNKED_FUSED_OUTPUT=1 FLASHGRAD_CHUNKED_B1_WARPS=8

echo "== fwdstore 5/5: the delta-rule pytest GPU tests"
timeout -k 3 "$(cap 60)" python3 -m pytest -q -x tests/python -k "(delta or gdn or kda) and (gpu or cuda)" > "$OUT/extra/fwdstore_pytest.log" 2>&1
rc=$?; tail -3 "$OUT/extra/fwdstore_pytest.log"; summary+=("pytest delta-rule GPU rc=$rc: $(tail -1 "$OUT/extra/fwdstore_pytest.log")")

job_summary fwdstore
