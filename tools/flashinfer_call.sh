#!/bin/bash
# kvbench's decode kernels beside FlashInfer's in one run, on a GPU machine: FlashInfer comes
# from the packed site folder of ../shared/vendor (copy it to .vendor/, a git-ignored folder, and
# carry ".vendor"), never as a dependency of kvbench. Run from the repository root of the copied
# tree; each shape set and seed lands in $OUT/kernels-flashinfer.tgz as
# results/reference/kernels-flashinfer/<gpu>/<set>/seed-<s>/ (paths relative to the repository
# root). A seed draws the inputs and the page order; a set and seed already in the tree is kept.
#
#     SEEDS=0,1,2 LIMIT=300 bash tools/flashinfer_call.sh
#
# Sets, seed by seed, in this order (one not started before the limit is left out); SETS picks
# them (default gqa4-bf16,opt13b-fp16):
#   gqa4-bf16   the shapes of results/reference/kernels-bench (32 query heads over 8 KV heads,
#               head dim 128, bf16, block size 16, every sequence at its full context)
#   opt13b-fp16 OPT-13B's attention (40 heads, no grouping, head dim 128, fp16, block size 16),
#               the batches and contexts of Figure 12's cells
#   vmm-opt13b  OPT-13B's attention at contexts up to 32K with kvbench's contiguous kernel over a
#               virtual arena (kvbench-virtual, docs/VMM.md) beside the paged kernels: vAttention's
#               comparison, FlashInfer's paged decode included
#   vmm-gqa8    the same on 32 query heads over 8 KV heads, bf16
set -u
LIMIT=${LIMIT:-300}
SEEDS=${SEEDS:-0,1,2}
SETS=${SETS:-gqa4-bf16,opt13b-fp16}
end=$((SECONDS + LIMIT))
fi=$(mktemp -d) && tar -xJf .vendor/flashinfer-0.7.2.post1-site.tar.xz -C "$fi" || exit 1
python3 -c "import requests" 2>/dev/null || { mkdir -p "$fi/requests" && : > "$fi/requests/__init__.py"; }
export PYTHONPATH="$fi:$PWD" FLASHINFER_WORKSPACE_BASE="$fi/ws" FLASHINFER_CUDA_ARCH_LIST=9.0 \
  CUDA_HOME=/usr/local/cuda TVM_FFI_DISABLE_TORCH_C_DLPACK=1 MAX_JOBS=16
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cs 'A-Za-z0-9' '-' | tr 'A-Z' 'a-z')
gpu=${gpu%-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
folder=results/reference/kernels-flashinfer/$gpu
mkdir -p "$folder"
backends=kvbench-paged,kvbench-contiguous,flashinfer-cuda-cores,flashinfer-tensor-cores,torch-sdpa
virtual=kvbench-paged,kvbench-contiguous,kvbench-virtual,flashinfer-cuda-cores,flashinfer-tensor-cores
for seed in ${SEEDS//,/ }; do
  for name in ${SETS//,/ }; do
    case $name in
      gqa4-bf16) set -- --cells 8x1024,8x8192,16x4096,32x2048,64x1024,64x4096,256x1024,256x2048,32x16384 \
        --gqa 4 --kv-heads 8 --dtype bfloat16 --backends $backends ;;
      opt13b-fp16) set -- --cells 8x512,32x512,64x512,128x512,32x1024,64x1024,128x1024 --gqa 1 --kv-heads 40 \
        --dtype float16 --backends $backends ;;
      vmm-opt13b) set -- --cells 8x4096,8x32768,32x16384,128x2048 --gqa 1 --kv-heads 40 --dtype float16 \
        --backends $virtual ;;
      vmm-gqa8) set -- --cells 8x32768,64x8192,256x4096 --gqa 4 --kv-heads 8 --dtype bfloat16 --backends $virtual ;;
      *) echo "unknown set $name" >> "$OUT/calls.log"; continue ;;
    esac
    [ -f "$folder/$name/seed-$seed/kernels.csv" ] && continue
    left=$((end - SECONDS)); [ $left -gt 40 ] || break 2
    timeout $left python3 -m kvbench kernels "$@" --block-size 16 --head-dim 128 \
      --seed $seed --out "$folder/$name/seed-$seed" >> "$OUT/kernels-flashinfer.log" 2>&1
    echo "== $name seed $seed rc $? $(date -u +%T)" >> "$OUT/calls.log"
  done
done
tar -czf "$OUT/kernels-flashinfer.tgz" "$folder"
