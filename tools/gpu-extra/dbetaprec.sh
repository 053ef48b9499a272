#!/usr/bin/env bash
# dbetaprec (issue 6, session 19): tools/gpu-extra/dbetaprec.py after tools/gpu-check's package
# install (dbeta of the chunked GDN backward in bf16 with a strong decay, 16-bit against fp32
# intermediates, against the CPU reference). Output: $OUT/extra/dbetaprec.log; the SUMMARY lines last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
timeout -k 3 "$(cap 120)" python3 tools/gpu-extra/dbetaprec.py --seeds "${DBETAPREC_SEEDS:-6}" > "$OUT/extra/dbetaprec.log" 2>&1
echo "dbetaprec rc=$?"
tail -n 20 "$OUT/extra/dbetaprec.log"
