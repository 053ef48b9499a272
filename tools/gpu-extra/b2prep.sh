#!/usr/bin/env bash
# b2prep (issue 6, session 21): after run 21.1 / 21.2 (b2rows.sh, retired since: commit 2468461 has it; bwdncu.sh; docs/perf/delta_rule.md
# "Session 21"): GDN stage 1 (chunk_prepare_compact_kernel) scans g in registers at the item's top
# (three barriers and a shared round trip fewer per item) and converts the next item's g / beta bits
# where used, not next to their loads; B2b flushes its row sums twice only at K = 128 (run 21.3:
# stage 1 0.276 -> 0.259 ms). Run 21.4: stage 1 stores A 16 bytes at a time and carries its items'
# (chunk, head) by the grid's stride instead of dividing (0.259 -> 0.244 ms). Next (commit 5e58cb8,
# untimed when committed): k and v rows by stepped_rows_async (predicted 0.244 -> 0.225 - 0.235 ms).
# After tools/gpu-check's build into build-gpu:
#   1. the chunked delta-rule GPU tests (defaults), the past-2^31 test, and the KDA chunked tests
#      (its stage 1's raw-load helpers moved to recurrent_common.cuh; its SASS byte-identical);
#   2. every chunk_* kernel's time per call at B8 T4096, B1 T32768, B8 K=V=64 (one process each),
#      beside run 21.1's (the same shapes);
#   3. ncu of stage 1's backward launch with source counters (as bwdncu.sh 2/4 in run 21.2).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT
P=(--kind gdn --B 8 --T 4096 --H 16 --K 128)

echo "== b2prep 1/4: chunked delta-rule GPU tests (defaults)"
job_tests b2prep_chunked 110 "DeltaRuleGpu.Chunked*:DeltaRuleChunked*:DeltaRuleGpu.PastTwoToThe31Elements:DeltaRuleGpu.Kda*"

echo "== b2prep 2/4: per-call kernel times: B8 T4096, B1 T32768, B8 K=V=64 (one process each)"
job_compare b2prep_b8 30 --kind gdn --shape 8,4096,16,128 --env $V --variants default=- \
  --focus 'chunk_prepare|chunk_grads_local' --note "(run 21.1: stage 1 0.277, B2b 0.828; 21.3: 0.259, 0.825; 21.4: 0.244, 0.830)"
job_compare b2prep_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V --variants default=- \
  --focus 'chunk_prepare|chunk_grads_local' --note "(run 21.1: stage 1 0.276, B2b 0.827; 21.3: 0.259, 0.822; 21.4: 0.244, 0.831)"
job_compare b2prep_k64 25 --kind gdn --shape 8,4096,16,64 --env $V --variants default=- \
  --focus 'chunk_prepare|chunk_grads_local' --note "(run 21.1: stage 1 0.208, B2b 0.545; run 20.4: B2b 0.526; 21.3: 0.197, 0.524; 21.4: 0.180, 0.524)"

echo "== b2prep 3/4: ncu of stage 1, the forward's launch then the backward's (chunk_prepare_compact_kernel)"
JOB_NCU_SKIP=0 job_ncu b2prep_prep_fwd 45 'chunk_prepare_compact_kernel' 1 - -- "${P[@]}"
JOB_NCU_SKIP=1 job_ncu b2prep_prep 45 'chunk_prepare_compact_kernel' 1 - -- "${P[@]}"

echo "== b2prep 4/4: the delta-rule pytest GPU tests"
timeout -k 3 "$(cap 60)" python3 -m pytest -q -x tests/python -k "(delta or gdn or kda) and (gpu or cuda)" > "$OUT/extra/b2prep_pytest.log" 2>&1
rc=$?; tail -3 "$OUT/extra/b2prep_pytest.log"; summary+=("pytest delta-rule GPU rc=$rc: $(tail -1 "$OUT/extra/b2prep_pytest.log")")

job_summary b2prep
