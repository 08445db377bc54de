#!/usr/bin/env bash
# The data-parallel table on one GPU machine, in stages that each fit one call (results to $OUT):
#   bash benchmarks/data_parallel_gpu.sh site tests dali      # one call, about 8 minutes
#   bash benchmarks/data_parallel_gpu.sh anchor               # one call each, about 8 minutes
# site:     DALI and what it needs, carried in parts as .whl/*/site.part.* (benchmarks/README.md),
#           unpacked into /tmp/site
# tests:    the GPU tests of the CUDA graphs and of the DALI loader
# dali:     a synthetic JPEG folder, then train.py --cuda_graph on 2 GPUs in memory and through
#           --loader=dali, for SGD and fd GAM: the data path's cost
# loader:   --loader=dali's pipeline alone at 128 images a batch, with 0, 65% and all of each batch
#           on the hardware JPEG decoder, and with each crop's window decoded alone (roi_decode)
# anchor:   bus bandwidth, DDP and the graphed SGD/AdamW steps (ResNet-50, ViT-S/32) on every GPU
# r50exact: ResNet-50 exact GAM, graphed, on every GPU, global and local (PERTS=global for one): its
#           passes compile in about 4 minutes on 4 GPUs at once, and each process traces them anew
# r50fd:    ResNet-50 fd GAM, graphed, global and local, on every GPU
# vitexact: ViT-S/32 exact GAM, graphed, global and local, on every GPU
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
    loader)
      (dali_path; python3 benchmarks/loader_throughput.py --data "$D" --batch 128 \
        --pipelines dali:0 dali:0.65 dali:1.0 dali_roi:0.65 dali_roi:1.0 --threads 8 \
        --out "$OUT/loader_dali_128.json") ;;
    anchor)
      $DP --gpus "$N" --runs r50:ddp,r50:sgd:graph,vit:ddp,vit:sgd:graph \
        --warm_at_once 4 --time_limit 420 --run_timeout 150 --out "$OUT/dp_anchor.json" ;;
    r50exact)
      # both modes compile at once where a GPU holds two of its 37 GiB warm-ups (H200), else in turn
      W=$([ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] \
        && echo 2 || echo 1)
      $DP --gpus "$N" --runs r50:gam:graph --no-busbw --run_timeout 300 --warm_at_once "$W" \
        --perturbations "${PERTS:-global,local}" --out "$OUT/dp_r50exact.json" ;;
    r50fd)
      $DP --gpus "$N" --runs r50:gam_fd:graph --no-busbw --run_timeout 150 --out "$OUT/dp_r50fd.json" ;;
    vitexact)
      $DP --gpus "$N" --runs vit:gam:graph --no-busbw --run_timeout 200 --out "$OUT/dp_vitexact.json" ;;
    *) echo "unknown stage $what"; exit 2 ;;
  esac
done
