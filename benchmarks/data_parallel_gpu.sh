#!/usr/bin/env bash
# The data-parallel table on one GPU machine, in stages that each fit one call (results to $OUT):
#   bash benchmarks/data_parallel_gpu.sh site tests dali r50gam anchor
# site:   DALI and what it needs, carried in parts as .whl/*/site.part.* (benchmarks/README.md,
#         "DALI on the GPU machine"), unpacked into /tmp/site
# tests:  the GPU tests of the CUDA graphs and of the DALI loader
# dali:   a synthetic JPEG folder, then train.py --cuda_graph on 2 GPUs in memory and through
#         --loader=dali, for SGD and fd GAM: the data path's cost
# r50gam: ResNet-50 exact and fd GAM, graphed, global and local, on every GPU of the machine
# anchor: bus bandwidth, DDP and the graphed SGD/AdamW steps (ResNet-50, ViT-S/32), ViT-S/32 exact GAM
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-dp}  # shared by the stages
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}; D=${DATA:-/tmp/imagenet-synth}; N=$(nvidia-smi -L | wc -l)
DP="python3 benchmarks/data_parallel.py"
dali_path() { [ -d /tmp/site/nvidia/dali ] && export PYTHONPATH=$PYTHONPATH:/tmp/site; }
for what in "$@"; do
  echo "== $what ($(date +%T))"
  case $what in
    site)
      nvidia-smi -L; python3 -c "import torch; print(torch.__version__)"
      mkdir -p /tmp/site && cat .whl/*/site.part.* | xz -d | tar x -C /tmp/site || exit 1
      dali_path && python3 -c "import nvidia.dali as d, torch; print('DALI', d.__version__)" ;;
    tests)
      python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_graphs.py 2>&1 | tail -5
      (dali_path; python3 -m pytest -q -p no:cacheprovider tests/test_dali_data.py 2>&1 | tail -8) ;;
    dali)
      [ -d "$D/val" ] || python3 benchmarks/jpeg_folder.py --out "$D" --train 20000 --val 2000
      (dali_path; $DP --gpus 2 --runs r50:train_sgd:graph,r50:train_gam_fd:graph --data "$D" \
        --loader dali --no-train_one --no-busbw --run_timeout 200 --out "$OUT/dp_dali.json") ;;
    r50gam)
      $DP --gpus "$N" --runs r50:gam:graph,r50:gam_fd:graph --warm_at_once 2 --no-busbw \
        --time_limit 420 --run_timeout 150 --out "$OUT/dp_r50gam.json" ;;
    anchor)
      $DP --gpus "$N" --runs r50:ddp,r50:sgd:graph,vit:ddp,vit:sgd:graph,vit:gam:graph \
        --warm_at_once 5 --time_limit 420 --run_timeout 150 --out "$OUT/dp_anchor.json" ;;
    *) echo "unknown stage $what"; exit 2 ;;
  esac
done
