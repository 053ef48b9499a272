#!/usr/bin/env bash
# b2pieces (issue 6, lead, session 16): the split B2 (B2a chunk_grads_state_coalesced_kernel, B2b
# chunk_grads_local_kernel) in pieces of n chunks on two streams, B2b's piece p beside B2a's piece p + 1,
# so that B2b re-reads B2a's inputs and outputs from L2 (chunked_b2_pieces.h; opt-in,
# FLASHGRAD_CHUNKED_B2_PIECES=n). ChunkedB2InPieces runs in gpu-check's suite.
#   1. per-kernel times and gradients (against the whole kernels: must be bitwise equal, rel RMS 0),
#      whole / 4 / 8 / 16 / 32 chunks per piece, B8 T4096 and B1 T32768;
#   2. b2pieces.py: whole vs pieces in deltabench's configuration, one process;
#   3. compute-sanitizer racecheck / memcheck of ChunkedB2InPieces.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
P=FLASHGRAD_CHUNKED_B2_PIECES
job_compare b2pieces_b8 45 --kind gdn --shape 8,4096,16,128 --env $P --variants whole=-,p4=4,p8=8,p16=16,p32=32 \
  --focus 'chunk_grads' --reps 5,5,1 --note "(run 15.2: B2a 0.63 + B2b 0.88 ms per call)"
job_compare b2pieces_t32k 45 --kind gdn --shape 1,32768,16,128 --env $P --variants whole=-,p8=8,p16=16,p32=32 \
  --focus 'chunk_grads' --reps 5,5,1 --note "(B2 ~1.50 ms per call)"
timeout -k 3 "$(cap 70)" python3 tools/gpu-extra/b2pieces.py > "$OUT/extra/b2pieces_ab.log" 2>&1
grep "^ROW" "$OUT/extra/b2pieces_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/b2pieces_ab.log")
job_sanitize b2pieces 40 'DeltaRuleGpu.ChunkedB2InPieces' 'DeltaRuleGpu.ChunkedB2InPieces'
job_summary b2pieces
