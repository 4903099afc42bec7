#!/bin/bash
# One device call of the paper-scale reproduction, resumable across calls (docs/REPRODUCTION.md).
#
#     bash <carry>/clean/tools/paper_scale.sh <carry>
#
# <carry> (git-ignored, carried to the GPU machine) holds `clean/` (a `git archive` of the commit
# to run), `shared/traces`, and what earlier calls brought back: `repro/` and `repeat/`. Figures 2
# and 13 run at OPT-13B with the paper's 15,728 slots, one `kvbench reproduce` invocation per seed
# into <carry>/repro/seed-<s>/ (finished runs are reused, so a call cut short by LIMIT seconds
# loses only the run in progress). Beside it, unless REPEATS=0, the timing-sensitive tests repeat
# on cores 0-11 (tools/repeat_tests.py: 2 idle + 4 loaded lanes) while the reproduction keeps
# cores 12-15. $OUT/state.tgz brings repro/ and repeat/ back; unpack it into <carry> to resume.
set -u
carry=$(cd "${1:?usage: paper_scale.sh <carry folder>}" && pwd)
cd "$carry/clean"
export PYTHONPATH=.
LIMIT=${LIMIT:-550}
end=$((SECONDS + LIMIT))
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt"
if [ "${REPEATS:-1}" = 1 ]; then
  minutes=$(python -c "print(($LIMIT - 20) / 60)")
  python tools/repeat_tests.py --out "$carry/repeat" --lanes 2 --loaded-lanes 4 --minutes "$minutes" \
    > "$OUT/repeat.log" 2>&1 &
fi
for s in ${SEEDS:-0 1 2}; do
  left=$((end - SECONDS)); [ $left -gt 60 ] || break
  echo "== seed $s ($left s left) $(date -u +%T)" >> "$OUT/repro.log"
  timeout $left taskset -c 12-15 python -m kvbench reproduce ${FIGS:-fig2 fig13} --mode real \
    --model opt-13b --num-requests "${NREQ:-200}" --seed "$s" --out "$carry/repro/seed-$s" \
    >> "$OUT/repro.log" 2>&1
  echo "== seed $s rc $? $(date -u +%T)" >> "$OUT/repro.log"
done
wait
tar -C "$carry" -czf "$OUT/state.tgz" repro repeat 2>/dev/null
ls -la "$OUT"
