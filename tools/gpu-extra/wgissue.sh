#!/usr/bin/env bash
# wgissue (issue 6, session 23; docs/perf/delta_rule.md "Session 23"): how the wgmma chains (the forward's
# stage 2 and B1 at few long sequences) issue their products: kIssue 0 (session 18: every operand's
# descriptor built from its address, ~14 instructions per wgmma between issues; one accumulator per
# product tile), 1 (descriptors formed once and stepped by one add), 2 (1 + consecutive wgmmas into
# different accumulators; the default). Run 22.x at B1 T32768 H16: chunk_state_wgmma 0.582 ms,
# chunk_state_backward_wgmma 0.729. (Run 23.4 also timed a kIssue 3, four chains per product: no faster,
# removed; the job's steps for it went with it.)
# After tools/gpu-check's build into build-gpu:
#   1. the chunked delta-rule GPU tests (defaults: kIssue 2 in every wgmma chain they run) and the KDA and
#      past-2^31 ones; the chunked tests again with kIssue 0 and 1 (K = 128, 16 columns);
#   2. per-call times at B1 T32768 H16, kIssue 0 / 1 / 2 in one process, then default / 0 in another;
#   3. racecheck / memcheck of the default chains on a small case.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
E=FLASHGRAD_CHUNKED_WGMMA_ISSUE

# WGISSUE_QUICK=1 (run 23.4, the session's last device minutes): the wgmma chains' own tests with the
# default only, one timing process, no sanitizer.
W="DeltaRuleGpu.ChunkedStateWgmma:DeltaRuleGpu.ChunkedB1Wgmma:DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128"
echo "== wgissue 1/3: chunked GPU tests (defaults), then with kIssue 0 and 1"
if [ "${WGISSUE_QUICK:-0}" = 1 ]; then
  job_tests wgissue_default 40 "$W"
else
  job_tests wgissue_default 120 "DeltaRuleGpu.Chunked*:DeltaRuleChunked*:DeltaRuleGpu.PastTwoToThe31Elements:DeltaRuleGpu.Kda*"
  job_tests wgissue_issue0 50 "$W" $E=0
  job_tests wgissue_issue1 50 "$W" $E=1
fi

echo "== wgissue 2/3: per-call times, kIssue 0 / 1 / 2"
job_compare wgissue_t32k 45 --kind gdn --shape 1,32768,16,128 --env $E --variants s18=0,desc=1,default=- \
  --focus 'chunk_state_wgmma|chunk_state_backward_wgmma' --note "(run 22.x: chunk_state_wgmma 0.582, B1 wgmma 0.729)"
# (again, the default first: the order's effect on the times)
[ "${WGISSUE_QUICK:-0}" = 1 ] || job_compare wgissue_t32k_b 40 --kind gdn --shape 1,32768,16,128 --env $E \
  --variants default=-,s18=0 \
  --focus 'chunk_state_wgmma|chunk_state_backward_wgmma'

echo "== wgissue 3/3: racecheck / memcheck of the default chains, small case"
[ "${WGISSUE_QUICK:-0}" = 1 ] || job_sanitize wgissue_san 50 'DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128' 'DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128'

job_summary wgissue
