#!/bin/bash
# One time-limited call on a GPU machine that runs kvbench's committed GPU measurements by name,
# each resumable: a call cut short loses only the run in progress, and the next call (with the
# folder carried back) goes on from there. Run from the repository root of the copied tree:
#
#     LIMIT=280 bash tools/device_call.sh JOB [JOB...]
#
# Jobs (the folder each writes is what README.md of that folder describes):
#   fig12-seed-<s>   Figure 12 at OPT-13B, seeds s to s + 2 (`--seed s --repeats 3`: finished runs are
#                    resumed, so fig12-seed-0 goes on with the first seed not done; fig12-seed-2 would
#                    run seeds 3 and 4 after 2) (results/reproduce/opt-13b-h200)
#   fig2-13          Figures 2 and 13 at OPT-13B, seeds 0-2 (`--repeats 3`: finished runs are resumed, so it
#                    goes on with the first seed not done; one seed is about 10.5 GPU-minutes)
#                    (results/reproduce/opt-13b-h200)
#   fig2-13-x6       Figures 2 and 13 at OPT-13B at the paper's rates x 6 (`--rate-scale 6`; x 3, the
#                    setting's own, leaves paged arrival-limited), seeds 0-2, resumed as fig2-13 is
#                    (results/reproduce/opt-13b-<card>-x6, h100 or h200 by the card that came: a folder
#                    of its own, the x 3 figures stay; keep it, made empty, before the first call)
#   fig13-alpaca-x6  Figure 13's Alpaca runs at x 6 (180 req/s) with 1,000 requests, the five engines at
#                    the paper's 15,728 slots, seeds $SEEDS (default 0,1,2): 200 requests arrive in 1.1 s
#                    and never queue for paged; simulated (results/reference/fig2-13-x6-sim), 1,000 fill
#                    paged's batch to 162 (paper 132) and take 280 s of runs a seed, static's 153 of them
#                    (results/reference/fig13-alpaca-x6-real)
#   fig19            Figure 19 at OPT-13B (recompute vs swap at the paper's block sizes 1, 2, 4, ... 256), 3
#                    seeds of 100 requests a run: the calibrated simulator gives each run 73-122
#                    preemptions and 44-54 s (`reproduce fig19 --mode simulate --cost-model
#                    results/reproduce/opt-13b-h200/calibration/cost.json --num-requests 100`); on the
#                    H200 a recompute cell takes 49-68 s and a swap cell 49-63 s (seed 0 at 40dc8fc), about
#                    17 GPU-minutes a seed, with a cell's start-up (results/reproduce/opt-13b-h200/fig19)
#   swap-copies      what the real runner's swap copies cost against one pinned copy of the same bytes,
#                    OPT-13B's geometry, Figure 19's block sizes, host blocks consecutive and random
#                    (benchmarks/swap_copies.py; under a minute) (results/reference/swap-copies)
#   preemption-costs what one preemption costs each way at OPT-13B's geometry, measured: a request of
#                    64, 256 and 1,024 tokens swapped out and in through the runner's copies, and
#                    recomputed by one prefill forward through its block table, at Figure 19's nine
#                    block sizes (benchmarks/preemption_costs.py; a few minutes)
#                    (results/reference/preemption-costs)
#   vmm-real         vmm sync and ahead beside orca-oracle and paged (results/reference/vmm-real)
#   hybrid-arxiv     Gemma 3 12B on arxiv-sum, four allocators, 3 seeds (results/reference/hybrid-real/arxiv-sum)
#   mla-dense        DeepSeek-V2-Lite beside Llama-3.1-8B at one KV budget (results/reference/mla-vs-dense)
#   mla-experts      the same, DeepSeek-V2-Lite's decode step timed with its experts run densely and
#                    grouped (results/reference/mla-vs-dense/expert_dispatch.json)
#   vmm-occupancy    OPT-13B at the paper's 15,728 slots, ShareGPT at 9 and Alpaca at 110 req/s (above
#                    every engine's sustained rate, so every engine queues), 30 s of arrivals, seeds
#                    $SEEDS (default 0,1,2; SEEDS=0 runs one seed of every setting first; a resume may
#                    add seeds, not drop them: after 0,1,2, SEEDS=1 is refused): paged,
#                    orca-oracle and vmm per-layer, then vmm per-request, then vmm per-request
#                    mapping ahead (`--vmm-map ahead`, folders *-ahead-held: the pages reserved by the
#                    allocator) (results/reference/vmm-occupancy-real)
#   vmm-ahead        only the last two: vmm per-request mapping ahead, Alpaca then ShareGPT (results/reference/vmm-occupancy-real)
#   mooncake-window  the first 30 s of Mooncake's conversation trace, replayed at its own timestamps, on
#                    Llama-3.1-8B with what an H200 leaves it: paged, orca-oracle, vmm
#                    (results/reference/mooncake-window-real)
#   hybrid-long      Gemma 3 12B with what an H200 leaves it on the first 30 s of Mooncake's conversation
#                    trace, unfiltered: paged, hybrid, jenga, orca-oracle (results/reference/hybrid-long-real)
#   hybrid-long-chunked  the same under --chunked-prefill (a 2,048-token step budget): hybrid, paged, jenga
#                    (results/reference/hybrid-long-chunked-real; simulated: results/reference/hybrid-long-chunked-sim)
#   hybrid-long-chunked-split  the same, run again since a mixed step's decodes attend through the
#                    split decode kernel (results/reference/hybrid-long-chunked-split-real)
#   hybrid-long-chunked-warm  the same again, in the same order, since the model runner's warm-up
#                    compiles every decode launch a mixed step can pick before the first timed step
#                    (results/reference/hybrid-long-chunked-warm-real)
#   hybrid-long-chunked-windows  the chunked setting on two more 30 s windows of the trace (starting at
#                    350 and 700 s), the engines in another order in each: jenga, hybrid, paged, then
#                    hybrid, jenga, paged (results/reference/hybrid-long-chunked-windows-real/w<start>;
#                    predicted before they ran, and read by check.py there:
#                    results/reference/hybrid-long-chunked-windows-sim)
#   mixed-profile    where a chunked step's time goes on Gemma 3 12B, paged and hybrid: the first 4 s of
#                    Mooncake's conversations, chunked, its mixed steps 21-30 under torch.profiler
#                    (benchmarks/step_profile.py --profile-mixed-steps 10; the whole window profiled
#                    ran past 5 min: torch.profiler records every kernel)
#                    (results/reference/mixed-step-profile/<engine>.txt)
#   alpaca-prefill-profile  where a short prefill's time goes at Figure 12's Alpaca setting (OPT-13B,
#                    12 GiB: 15,728 slots), each engine on its Figure 12 cell's own workload (seed 0):
#                    paged at 53.57 req/s (3,215 requests, where it first fails the bound), then
#                    orca-oracle at 94.02 (5,642 requests, its last pass), each prefilling eagerly (as
#                    the cells did) and then with --prefill-graphs. Each prefill step's wall time split
#                    on the host (launches against the rest; CPU time, context switches, machine load:
#                    the host collector) by quarters of wall time; paged's eager prefill steps 701-720
#                    (past the point where its committed cell's prefill steps went from 12 to 22 ms)
#                    under torch.profiler (benchmarks/step_profile.py)
#                    (results/reference/alpaca-prefill-profile/<engine>-<rate>[-graphs].txt)
#   fig12-alpaca-eager  Figure 12's Alpaca panel at OPT-13B for paged and orca-oracle with every step
#                    run eagerly (`--no-cuda-graphs`, as the paper's vLLM and Orca ran), seed 0, the
#                    shared bound 4 x the lower unloaded latency, bisected to a 10 % bracket
#                    (results/reference/fig12-alpaca-eager)
#   fig12-alpaca-chunked  the same panel's paged and orca-oracle under --chunked-prefill, at rates around
#                    the calibrated simulator's brackets (results/reference/fig12-chunked-prefill-sim),
#                    seed 0, the real panel's bound 0.0327 s/token (results/reference/fig12-alpaca-chunked)
#   fig12-alpaca-prefill-graphs  the same panel's paged and orca-oracle with --prefill-graphs (short
#                    prefills replayed as CUDA graphs: their time no longer follows the host's speed),
#                    seeds $SEEDS (default 0; seeds 0, 1 and 2 are done), the real panel's bound
#                    0.0328 s/token, bisected to a 10 % bracket, with the host collector
#                    (results/reference/fig12-alpaca-prefill-graphs)
#   fig12-alpaca-prefill-graphs-baselines  the same replayed panel's other three engines, static,
#                    orca-max and orca-pow2, each at four rates around the bracket the replayed
#                    cells' fit simulates for it (results/reference/calibration-by-engine/cost.json;
#                    static [6.25, 6.875), orca-max [12.5, 13.75), orca-pow2 past 80 req/s), seeds
#                    $SEEDS (default 0; seed 0 is done: SEEDS=0,1,2 goes on), the panel's bound,
#                    bisected to a 10 % bracket, with the host collector: seed 0 took 15 cells and
#                    1,048 s of cells (17.5 GPU-minutes, a model load each); its placement/ predicts
#                    13 cells for each of seeds 1 and 2 (about 15 GPU-minutes a seed)
#                    (results/reference/fig12-alpaca-prefill-graphs-baselines/<engine>)
#   kernels-mla      decode attention of full, windowed and MLA layers at batches 1-64
#                    (results/reference/kernels-window-mla/h200-splits)
#   kernels-softcap  decode attention of Gemma 2 9B's layers (8 KV heads of 256, 2 query heads each)
#                    uncapped and with its score cap of 50, full and with its 4,096-token window, at
#                    batches 1-64 (results/reference/kernels-softcap)
#   gpu-tests        the GPU-marked tests (their report: $OUT/gpu-tests.log); GPU_TESTS_K=EXPR runs
#                    only those pytest's -k EXPR selects
# Traces are read from .carry/shared/traces (copy ../shared/traces there; carry ".carry/shared").
# The committed results are larger than a call may carry: cut the tree to the folders the jobs
# write first (tools/device_tree.sh keep FOLDER...; restore after).
# Every job's folder comes back as $OUT/<job>.tgz (paths relative to the repository root: unpack
# with `tar -xzf <job>.tgz` there), its log as $OUT/<job>.log.
#
# Every sweep and reproduction stops before a cell it expects to end past the call's limit
# (`--deadline-s`, 15 s kept for packing: kvbench.sweep.deadline), so a call loses no cell half
# run; `timeout` stays as the safety net.
#
# PIN=<commit>: the OPT-13B reproduction's jobs (fig12-seed-*, fig2-13, fig2-13-x6, fig19,
# fig12-alpaca-prefill-graphs-baselines) run kvbench as it
# was at that commit (a git worktree of it on the GPU machine; each run's env.json records it),
# writing into this tree's folders. A figure whose runs span several device sessions keeps one
# run code so, while the engines, kernels and runner go on changing (tools/cell_commits.py checks
# that the commits its runs record share their run code). The commit must know --deadline-s
# (kvbench.sweep.deadline): an older one refuses the flag with exit code 2. A commit newer than the
# machine's copy of the repository travels in .carry/pin.bundle (carry ".carry/shared" and
# ".carry/pin.bundle"): `git bundle create .carry/pin.bundle <a landed commit>..<PIN>`.
set -u
ROOT=$PWD
export PYTHONPATH=. KVBENCH_TRACE_DIR=${KVBENCH_TRACE_DIR:-$ROOT/.carry/shared/traces}
LIMIT=${LIMIT:-280}
end=$((SECONDS + LIMIT))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
# the files the tree came with: what a job adds comes back even where its file times are older
# than the call (a copy or an unpacked archive that kept its source's times)
CARRIED=$(mktemp)
find results -type f 2>/dev/null | sort > "$CARRIED"
# The reproduction's kvbench: this tree's, or with PIN the worktree's, imported from there alone
# (`-P`: not from the current directory) while the command runs here, so the paths it records
# (the placement's cost file, --out) read as from a run in this tree and a resumed placement
# finds its settings unchanged
KVBENCH=(python -m kvbench)
if [ -n "${PIN:-}" ]; then
  CODE=/tmp/kvbench-at-${PIN}
  # the machine's repository knows only the commits that had landed when its copy was made: a
  # newer PIN travels as a bundle (git bundle create .carry/pin.bundle <landed>..<PIN>)
  git cat-file -e "$PIN^{commit}" 2>/dev/null || [ ! -f .carry/pin.bundle ] \
    || git fetch -q .carry/pin.bundle "refs/heads/*:refs/remotes/pin-bundle/*" >> "$OUT/calls.log" 2>&1
  [ -d "$CODE" ] || git worktree add -q --detach "$CODE" "$PIN" >> "$OUT/calls.log" 2>&1 \
    || { echo "PIN=$PIN: no such commit here" | tee -a "$OUT/calls.log"; exit 2; }
  echo "reproduction jobs run kvbench at $(git -C "$CODE" rev-parse HEAD)" >> "$OUT/calls.log"
  KVBENCH=(env PYTHONPATH="$CODE" python -P -m kvbench)
fi
for job in "$@"; do
  left=$((end - SECONDS))
  [ $left -gt 30 ] || { echo "$job: no time left" >> "$OUT/calls.log"; continue; }
  echo "== $job ($left s left) $(date -u +%T)" >> "$OUT/calls.log"
  case $job in
    fig12-seed-*)
      folder=results/reproduce/opt-13b-h200
      timeout $left "${KVBENCH[@]}" reproduce --deadline-s $((left - 15)) fig12 --mode real --model opt-13b \
        --place-with $folder/calibration/cost.json --seed "${job#fig12-seed-}" --repeats 3 --out $folder ;;
    fig2-13)
      folder=results/reproduce/opt-13b-h200
      timeout $left "${KVBENCH[@]}" reproduce --deadline-s $((left - 15)) fig2 fig13 --mode real --model opt-13b \
        --num-requests 200 --repeats 3 --out $folder ;;
    fig2-13-x6)
      # a folder per card model: the x 6 figures are one card's, whichever came (H100 or H200)
      card=$(sed -n '1s/.*\(H[0-9]00\).*/\1/p' "$OUT/gpu.txt" | tr H h)
      folder=results/reproduce/opt-13b-${card:-gpu}-x6
      timeout $left "${KVBENCH[@]}" reproduce --deadline-s $((left - 15)) fig2 fig13 --mode real --model opt-13b \
        --rate-scale 6 --num-requests 200 --repeats 3 --out $folder ;;
    fig13-alpaca-x6)
      folder=results/reference/fig13-alpaca-x6-real
      timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real \
        --engines paged,orca-oracle,orca-pow2,orca-max,static --model opt-13b --trace alpaca-paper --rates 180 \
        --num-requests 1000 --seeds ${SEEDS:-0,1,2} --latency-threshold 1 --resume --continue-on-error \
        --collectors torch,nvml --out $folder ;;
    fig19)
      folder=results/reproduce/opt-13b-h200
      timeout $left "${KVBENCH[@]}" reproduce --deadline-s $((left - 15)) fig19 --mode real --model opt-13b \
        --num-requests 100 --repeats 3 --out $folder ;;
    vmm-real)
      folder=results/reference/vmm-real
      timeout $left python benchmarks/vmm_real.py --out $folder \
        --variants orca-oracle,paged,vmm:per-layer:sync,vmm:per-layer:ahead,vmm:per-request:sync ;;
    hybrid-arxiv)
      folder=results/reference/hybrid-real/arxiv-sum
      timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --engines paged,hybrid,jenga,orca-oracle \
        --model gemma-3-12b --trace arxiv-sum --kv-cache-gib 12 --seeds 0,1,2 --rates 12 \
        --num-requests 40 --latency-threshold 1 --resume --continue-on-error --collectors torch,nvml \
        --out $folder ;;
    mla-dense)
      folder=results/reference/mla-vs-dense
      mkdir -p $folder
      timeout $left python benchmarks/mla_vs_dense.py --out $folder/mla_vs_dense.json ;;
    mla-experts)
      folder=results/reference/mla-vs-dense
      mkdir -p $folder
      timeout $left python benchmarks/mla_vs_dense.py --expert-dispatch dense,grouped \
        --out $folder/expert_dispatch.json ;;
    vmm-occupancy|vmm-ahead)
      folder=results/reference/vmm-occupancy-real
      settings=("sharegpt-paper 9 per-layer paged,orca-oracle,vmm sync"
                "alpaca-paper 110 per-layer paged,orca-oracle,vmm sync" "sharegpt-paper 9 per-request vmm sync"
                "alpaca-paper 110 per-request vmm sync" "alpaca-paper 110 per-request vmm ahead"
                "sharegpt-paper 9 per-request vmm ahead")
      [ $job = vmm-ahead ] && settings=("${settings[@]:4}")
      for setting in "${settings[@]}"; do
        set -- $setting
        left=$((end - SECONDS)); [ $left -gt 30 ] || break
        # pages mapped ahead held by the allocator (since 18c412e); the -ahead folders ran the design before
        suffix=$([ "$5" = sync ] || echo "-$5-held")
        timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --engines $4 --vmm-layout $3 --vmm-map $5 --model opt-13b \
          --trace $1 --rates $2 --duration 30 --seeds ${SEEDS:-0,1,2} --latency-threshold 1 --resume \
          --continue-on-error --collectors torch,nvml --out $folder/$1-$3$suffix
      done ;;
    mooncake-window)
      folder=results/reference/mooncake-window-real
      timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --engines paged,orca-oracle,vmm --model llama-3.1-8b \
        --emulate-gpu h200-141gb --trace mooncake-conv --window-duration 30 --seeds 0 --resume \
        --continue-on-error --collectors torch,nvml --out $folder ;;
    hybrid-long)
      folder=results/reference/hybrid-long-real
      timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --engines paged,hybrid,jenga,orca-oracle --model gemma-3-12b \
        --emulate-gpu h200-141gb --trace mooncake-conv --window-duration 30 --max-total-len 131072 --seeds 0 \
        --resume --continue-on-error --collectors torch,nvml --out $folder ;;
    hybrid-long-chunked|hybrid-long-chunked-split|hybrid-long-chunked-warm)
      folder=results/reference/$job-real
      timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --chunked-prefill --engines hybrid,paged,jenga --model gemma-3-12b \
        --emulate-gpu h200-141gb --trace mooncake-conv --window-duration 30 --max-total-len 131072 --seeds 0 \
        --resume --continue-on-error --collectors torch,nvml --out $folder ;;
    hybrid-long-chunked-windows)
      folder=results/reference/hybrid-long-chunked-windows-real
      for setting in "350 jenga,hybrid,paged" "700 hybrid,jenga,paged"; do
        set -- $setting
        left=$((end - SECONDS)); [ $left -gt 30 ] || break
        timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --chunked-prefill --engines $2 --model gemma-3-12b \
          --emulate-gpu h200-141gb --trace mooncake-conv --window-start $1 --window-duration 30 \
          --max-total-len 131072 --seeds 0 --resume --continue-on-error --collectors torch,nvml --out $folder/w$1
      done ;;
    mixed-profile)
      folder=results/reference/mixed-step-profile
      mkdir -p $folder
      for engine in paged hybrid; do
        left=$((end - SECONDS)); [ $left -gt 30 ] || break
        # a finished profile is kept; output unbuffered, so a run cut short still shows its step table
        grep -q "^torch of the same run" $folder/$engine.txt 2>/dev/null && continue
        timeout $left python -u benchmarks/step_profile.py --model gemma-3-12b --emulate-gpu h200-141gb \
          --engine $engine --trace mooncake-conv --rate 0 --num-requests 0 --window-duration 4 \
          --max-total-len 131072 --chunked-prefill --profiler torch --top 25 --profile-mixed-steps 10 \
          --skip-mixed-steps 20 > $folder/$engine.txt
      done ;;
    alpaca-prefill-profile)
      folder=results/reference/alpaca-prefill-profile
      mkdir -p $folder
      for run in "paged 53.57 3215 torch" "paged 53.57 3215 none graphs" "orca-oracle 94.02 5642 none" \
          "orca-oracle 94.02 5642 none graphs"; do
        set -- $run
        left=$((end - SECONDS)); [ $left -gt 30 ] || break
        out=$folder/$1-$2${5:+-$5}.txt
        # a finished run is kept (the last thing it prints: the profile, else the decode calls'
        # host table); output unbuffered, so a run cut short still shows its tables
        last=$([ $4 = none ] && echo "decode calls by wall time" || echo "torch of the same run")
        grep -q "^$last" $out 2>/dev/null && continue
        timeout $left python -u benchmarks/step_profile.py --model opt-13b --emulate-gpu a100-40gb --kv-cache-gib 12 \
          --engine $1 --trace alpaca-paper --rate $2 --num-requests $3 --warm-up-requests 300 --profiler $4 --top 30 \
          --profile-kind prefill --profile-steps 20 --skip-steps 700 ${5:+--prefill-graphs} > $out
      done ;;
    fig12-alpaca-eager)
      folder=results/reference/fig12-alpaca-eager
      timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --no-cuda-graphs --engines paged,orca-oracle --model opt-13b \
        --trace alpaca-paper --rates 38,48,60,75,94 --duration 60 --seeds 0 --baseline-requests 5 \
        --threshold-multiple 4 --bisect 3 --bracket 0.1 --resume --continue-on-error --collectors torch \
        --out $folder ;;
    fig12-alpaca-prefill-graphs)
      folder=results/reference/fig12-alpaca-prefill-graphs
      timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --prefill-graphs \
        --engines paged,orca-oracle --model opt-13b --emulate-gpu a100-40gb --kv-cache-gib 12 \
        --trace alpaca-paper --rates 53.57,70,94.02,120 --duration 60 --seeds "${SEEDS:-0}" --latency-threshold 0.0328 \
        --bisect 3 --bracket 0.1 --resume --continue-on-error --collectors torch,host --out $folder ;;
    fig12-alpaca-prefill-graphs-baselines)
      folder=results/reference/fig12-alpaca-prefill-graphs-baselines
      for setting in "static 5.5,6.25,6.875,7.5" "orca-max 11,12.5,13.75,15" "orca-pow2 72,80,88,96"; do
        set -- $setting
        # a cell is 60 s of arrivals and its drain after a model load (70 s on the H200): a sweep
        # started with less than 90 s left runs none and is cut short by `timeout` while starting
        left=$((end - SECONDS)); [ $left -gt 90 ] || break
        timeout $left "${KVBENCH[@]}" sweep --deadline-s $((left - 15)) --real --prefill-graphs --engines $1 \
          --model opt-13b --emulate-gpu a100-40gb --kv-cache-gib 12 --trace alpaca-paper --rates $2 --duration 60 \
          --seeds "${SEEDS:-0}" --latency-threshold 0.0328 --bisect 3 --bracket 0.1 --resume --continue-on-error \
          --collectors torch,host --out $folder/$1
      done ;;
    fig12-alpaca-chunked)
      folder=results/reference/fig12-alpaca-chunked
      for setting in "paged 149,164,171.5,179,197" "orca-oracle 103,108,113.5,118.75,130"; do
        set -- $setting
        left=$((end - SECONDS)); [ $left -gt 30 ] || break
        timeout $left python -m kvbench sweep --deadline-s $((left - 15)) --real --chunked-prefill --engines $1 --model opt-13b \
          --trace alpaca-paper --rates $2 --duration 60 --seeds 0 --latency-threshold 0.0327 --bisect 2 \
          --bracket 0.05 --resume --continue-on-error --collectors torch --out $folder/$1
      done ;;
    swap-copies)
      folder=results/reference/swap-copies
      mkdir -p $folder
      timeout $left python benchmarks/swap_copies.py --model opt-13b --block-sizes 1,2,4,8,16,32,64,128,256 \
        --out $folder/swap.json > $folder/swap.txt ;;
    preemption-costs)
      folder=results/reference/preemption-costs
      mkdir -p $folder
      timeout $left python benchmarks/preemption_costs.py --model opt-13b --tokens 64,256,1024 \
        --out $folder/costs.json > $folder/costs.txt ;;
    kernels-mla)
      folder=results/reference/kernels-window-mla/h200-splits
      timeout $left python -m kvbench kernels --batch 1,4,8,64 --context 8192,32768 --window 0 --mla \
        --backends kvbench-paged,kvbench-contiguous --repeats 30 --out $folder ;;
    kernels-softcap)
      folder=results/reference/kernels-softcap
      timeout $left python -m kvbench kernels --batch 1,8,32,64 --context 4096,8192,16384 --kv-heads 8 --gqa 2 \
        --head-dim 256 --window 0,4096 --softcap 0,50 --backends kvbench-paged,kvbench-contiguous \
        --repeats 30 --out $folder ;;
    gpu-tests)
      folder=
      timeout $left python -m pytest -p no:xdist -q -rA -m gpu ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} tests ;;
    *)
      echo "unknown job $job" >> "$OUT/calls.log"; continue ;;
  esac > "$OUT/$job.log" 2>&1
  echo "== $job rc $? $(date -u +%T)" >> "$OUT/calls.log"
  # large step and request tables come back packed (tools/pack_results.py): the tree a call
  # carries stays within the device's size limit as runs accumulate; only the files this call
  # wrote come back (newer than gpu.txt, written after the tree was copied, or not in the tree
  # it came with), so a folder grown past the size of one returned file (16 MiB) still returns
  # what is new in it
  [ -z "$folder" ] || {
    python tools/pack_results.py "$folder" >> "$OUT/calls.log"
    { find "$folder" -type f -newer "$OUT/gpu.txt"; find "$folder" -type f | sort | comm -23 - "$CARRIED"; } |
      sort -u | tr '\n' '\0' | tar -czf "$OUT/$job.tgz" --null -T -
  }
done
cat "$OUT/calls.log"
