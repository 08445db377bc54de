#!/usr/bin/env bash
# The ImageNet evidence on a GPU machine: a synthetic JPEG ImageFolder, the GPU loader's test and
# throughput, then the presets on 1 and N GPUs (benchmarks/imagenet_scaling.py). Results go to $OUT.
#   bash benchmarks/imagenet_gpu.sh data|loader|RUN... (RUN: resnet50:sgd, vit_s32:gam, ...)
#   EXTRA="--bf16_hvp=exact" adds train.py flags to every run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; D=${DATA:-/tmp/imagenet-synth}; N=$(nvidia-smi -L | wc -l)
for what in "$@"; do
  case $what in
    data)
      nvidia-smi -L; python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
      [ -d "$D/val" ] || python3 benchmarks/jpeg_folder.py --out "$D" --train 20000 --val 2000 --classes 1000 ;;
    test) python3 -m pytest -q -p no:cacheprovider tests/test_gpu_data.py tests/test_dali_data.py 2>&1 | grep -E "^E |assert|passed|failed" | head -30 ;;
    loader) python3 benchmarks/loader_throughput.py --data "$D" --out "$OUT/loader.json" ;;
    *) python3 benchmarks/imagenet_scaling.py --data "$D" --gpus "$N" --runs "$what" \
         --steps "${STEPS:-40}" --loader "${LOADER:-auto}" --extra ${EXTRA:-} --out "$OUT/scaling_${what/:/_}.json" 2>&1 | tee "$OUT/${what/:/_}.log" | tail -60 ;;
  esac
done
