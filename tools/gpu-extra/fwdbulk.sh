#!/usr/bin/env bash
# fwdbulk (issue 6, session 23; docs/perf/delta_rule.md "Session 23"): the fused forward chain's tiles by one
# bulk row copy per thread and chunk (chunk_state_kernel's kBulk, FLASHGRAD_CHUNKED_FWD_BULK=1, opt-in)
# against its 16 - 20 cp.async per thread (the default), and the backward's timeline at B8.
# Run 22.3 (before): chunk_state 0.465 ms at B8 T4096, 0.156 at K = V = 64.
# After tools/gpu-check's build into build-gpu:
#   1. the bulk-copy probe (DeltaRuleWgmmaProbe.*), the chunked GPU tests with the fused forward forced on
#      their small shapes and the bulk copies on (and the default fused forward, for the same shapes);
#   2. the forward chain's time per call, default vs bulk, at B8 T4096 and at K = V = 64 (one process each);
#   3. bench/backward_timeline.py at B8 T4096 (flashgrad and fla): every GPU activity of one backward call
#      with the idle gaps, .grad set and .grad None;
#   4. racecheck / memcheck of the bulk fused forward on small cases;
#   5. ncu of the bulk chain (instructions, issue).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
B=FLASHGRAD_CHUNKED_FWD_BULK
CH="DeltaRuleGpu.Chunked*:DeltaRuleChunked*-DeltaRuleGpu.ChunkedB1Wgmma:DeltaRuleGpu.ChunkedStateChainsOptIn"

echo "== fwdbulk 1/5: probe; chunked tests with the fused forward forced, bulk copies on / off"
job_tests fwdbulk_probe 30 "DeltaRuleWgmmaProbe.*"
job_tests fwdbulk_forced_bulk 60 "$CH" FLASHGRAD_CHUNKED_FUSED_OUTPUT=1 $B=1
job_tests fwdbulk_forced_default 60 "$CH" FLASHGRAD_CHUNKED_FUSED_OUTPUT=1

echo "== fwdbulk 2/5: forward chain per call, default vs bulk"
job_compare fwdbulk_b8 35 --kind gdn --shape 8,4096,16,128 --env $B --variants default=-,bulk=1 \
  --focus 'chunk_state_kernel' --note "(run 22.3: chunk_state 0.465)"
job_compare fwdbulk_k64 30 --kind gdn --shape 8,4096,16,64 --env $B --variants default=-,bulk=1 \
  --focus 'chunk_state_kernel' --note "(run 22.3: chunk_state 0.156)"

echo "== fwdbulk 3/5: the backward's timeline at B8 T4096 (flashgrad, fla)"
(cd bench && PYTHONPATH=".:${PYTHONPATH:-}" timeout -k 3 "$(cap 60)" python3 backward_timeline.py --fla) \
  > "$OUT/extra/fwdbulk_timeline.log" 2>&1
rc=$?; grep -E "^(TOTAL|==)" "$OUT/extra/fwdbulk_timeline.log"; [ $rc -eq 0 ] || tail -5 "$OUT/extra/fwdbulk_timeline.log"
while IFS= read -r l; do summary+=("$l"); done < <(grep "^TOTAL" "$OUT/extra/fwdbulk_timeline.log")

echo "== fwdbulk 4/5: racecheck / memcheck of the bulk fused forward, small cases"
job_sanitize fwdbulk_san 50 'DeltaRuleGpu.ChunkedKeptVNewFusedForward:DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128' \
  'DeltaRuleGpu.ChunkedKeptVNewFusedForward:DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128' \
  FLASHGRAD_CHUNKED_FUSED_OUTPUT=1 $B=1

echo "== fwdbulk 5/5: ncu of the bulk forward chain (first launch)"
JOB_NCU_SKIP=0 job_ncu fwdbulk_chain 45 'chunk_state_kernel' 0 $B=1 -- --kind gdn --B 8 --T 4096 --H 16 --K 128

job_summary fwdbulk
