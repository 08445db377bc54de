#!/usr/bin/env bash
# The data-parallel table on one GPU machine, in stages that each fit one call (results to $OUT):
#   bash benchmarks/data_parallel_gpu.sh r50exact pack                    # one call, about 9 minutes
#   bash benchmarks/data_parallel_gpu.sh r50fd pack                       # one call, about 4 minutes
#   bash benchmarks/data_parallel_gpu.sh site check dalitests loader dali pack  # one call, 9 minutes
#   bash benchmarks/data_parallel_gpu.sh tests anchor pack                # one call, about 8 minutes
#   bash benchmarks/data_parallel_gpu.sh vitexact pack                    # one call, 9 minutes or more
# (4 × H200, runs 7 and 8 of benchmarks/RESULTS.md; GPUS=2 times the GAM stages and the anchor on 1
# and 2 GPUs, PERTS=global or local GAM in that mode alone.) On a machine of 2 GPUs (runs 9 and
# 10) the check shares the last GPU with the stage after it: give it a GAM stage, whose warm-up
# (compiling, little GPU work) outlasts the check, and leave it out of the anchor and the DALI call:
#   GPUS=2 PERTS=local CHECK_LIMIT=300 bash benchmarks/data_parallel_gpu.sh check vitexact pack
#   GPUS=2 bash benchmarks/data_parallel_gpu.sh anchor pack   # 8 minutes for 3 rows with a cold cache
#   bash benchmarks/data_parallel_gpu.sh site dalitests loader dali pack
# ANCHOR_RUNS=vit:sgd:graph runs the anchor's rows named (a row cut by the call's limit: 2 minutes).
# site:     DALI and what it needs, carried in parts as .whl/*/site.part.* (benchmarks/README.md),
#           unpacked into /tmp/site
# check:    the GPU check (benchmarks/gpu_check.py; no case starts after CHECK_LIMIT s, default
#           420) in the background on the last GPU and the last
#           3/8 of the cores; the stages after it run on the other cores, and on more than 2 GPUs
#           on the other GPUs
# tests:    the GPU tests of the CUDA graphs
# dalitests: the GPU tests of the DALI loader, in the background on the GPU before the check's
# dali:     a synthetic JPEG folder, then train.py --cuda_graph on 2 GPUs in memory and through
#           --loader=dali (its defaults, or DALI_SETTINGS: --loader settings, comma-separated), 5
#           steps of each run profiled: SGD for 60 steps, then fd GAM for 200, across two epoch
#           starts of the 20,000 images
# loader:   --loader=dali's pipeline alone at 128 images a batch, all of each batch on the hardware
#           JPEG decoder, half of it, or none (nvJPEG's CUDA decoder, whose kernels may run beside a
#           step's), each crop's window decoded alone (roi_decode) or the whole image, and the
#           seconds the first epoch's start and a later one's take; then each feeding a 25 ms
#           stand-in step, 5 fed steps profiled, on a stream of its own and (roi_decode) on CUDA's
#           legacy default stream
# anchor:   bus bandwidth, DDP and the graphed SGD/AdamW steps (ResNet-50, ViT-S/32) on every GPU
#           (or GPUS)
# r50exact: ResNet-50 exact GAM, graphed, on every GPU, global and local (PERTS=global for one): its
#           passes compile in about 4 minutes on 4 GPUs at once, and each process traces them anew
# r50fd:    ResNet-50 fd GAM, graphed, global and local, on every GPU
# vitexact: ViT-S/32 exact GAM, graphed, global and local (or PERTS), on every GPU; a warm-up
#           still in its first step after 120 s prints its main thread's stack, and ends at 200 s
#           (the GAM stages time 3 windows of 65 steps after 5: 200 steps on 1 GPU and on N)
# leftover: packs the logs of a stage cut short from outside
#           (timeout 480 bash … vitexact; bash … leftover)
# pack:     waits for the check and the DALI tests to end, their logs into logs_pack.tgz
# After each stage its runs' logs, profiles and timelines go into $OUT/logs_<stage>.tgz (few files
# come back).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-dp}  # shared by the stages
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}; D=${DATA:-/tmp/imagenet-synth}; N=$(nvidia-smi -L | wc -l); G=${GPUS:-$N}
PIN=""; DP="python3 benchmarks/data_parallel.py"; GAM="--steps 65 --no-busbw"
dali_path() { [ -d /tmp/site/nvidia/dali ] && export PYTHONPATH=$PYTHONPATH:/tmp/site; }
folder() { [ -d "$D/val" ] || python3 benchmarks/jpeg_folder.py --out "$D" --train 20000 --val 2000; }
pack_logs() {  # the logs and profiles that stage $1 left in $OUT, in one file
  local found; found=$(cd "$OUT" && ls -d ./*_logs ./*_profile_*.txt ./*_trace_*.json.gz 2>/dev/null)
  [ -z "$found" ] || { tar czf "$OUT/logs_$1.tgz" -C "$OUT" $found && (cd "$OUT" && rm -rf $found); }
}
SETTINGS=${DALI_SETTINGS:-dali}  # run 7 compared dali+dali_hw_load=0.65, dali+dali_roi=false, ...
for what in "$@"; do
  echo "== $what ($(date +%T))"
  case $what in
    site)
      nvidia-smi -L; python3 -c "import torch; print(torch.__version__)"
      mkdir -p /tmp/site && cat .whl/*/site.part.* | xz -d | tar x -C /tmp/site || exit 1
      dali_path && python3 -c "import nvidia.dali as d, torch; print('DALI', d.__version__)" ;;
    check)
      C=$(nproc); LO=$((C * 5 / 8))
      (export CUDA_VISIBLE_DEVICES=$((N - 1)); taskset -c "$LO-$((C - 1))" python3 \
        benchmarks/gpu_check.py --time_limit "${CHECK_LIMIT:-420}" --out "$OUT/gpu_check.json" \
        >"$OUT/gpu_check.log" 2>&1) &
      PIN="taskset -c 0-$((LO - 1))"; DP="$PIN $DP"
      [ "$N" -gt 2 ] && { N=$((N - 1)); G=$((G < N ? G : N)); } ;;
    tests)
      $PIN python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_graphs.py 2>&1 | tail -5 ;;
    dalitests)
      C=$(nproc)
      (dali_path; export CUDA_VISIBLE_DEVICES=$((N - 1)); taskset -c "$((C / 2))-$((C * 5 / 8 - 1))" \
        python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_dali_data.py \
        >"$OUT/dali_tests.log" 2>&1) & ;;
    dali)
      folder
      (dali_path; $DP --gpus 2 --runs r50:train_sgd:graph --data "$D" --loader "$SETTINGS" \
        --no-train_one --no-busbw --run_timeout 150 --train_profile 5 --out "$OUT/dp_dali_sgd.json"
      $DP --gpus 2 --runs r50:train_gam_fd:graph --data "$D" --loader "$SETTINGS" \
        --train_steps 200 --train_profile 5 --no-train_one --no-busbw --run_timeout 200 \
        --out "$OUT/dp_dali_gam_fd.json") ;;
    loader)
      folder
      (dali_path; L="python3 benchmarks/loader_throughput.py --data $D --batch 128 --threads 8"
      $PIN $L --pipelines dali_roi:1.0 dali_roi:0.5 dali_roi:0.0 dali:1.0 --batches 60 --load_ms 25 \
        --trace "$OUT/loader_logs" --out "$OUT/loader_dali_128.json"
      $PIN $L --pipelines dali_roi:1.0 --batches 60 --load_ms 25 --default_stream \
        --trace "$OUT/loader_default_logs" --out "$OUT/loader_dali_128_default_stream.json") ;;
    anchor)
      $DP --gpus "$G" --runs "${ANCHOR_RUNS:-r50:ddp,r50:sgd:graph,vit:ddp,vit:sgd:graph}" \
        --warm_at_once 4 --time_limit 420 --run_timeout 150 --out "$OUT/dp_anchor.json" ;;
    r50exact)
      # both modes compile at once where a GPU holds two of its 37 GiB warm-ups (H200), else in turn
      W=$([ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] \
        && echo 2 || echo 1)
      $DP --gpus "$G" --runs r50:gam:graph $GAM --run_timeout 300 --warm_at_once "$W" \
        --perturbations "${PERTS:-global,local}" --out "$OUT/dp_r50exact.json" ;;
    r50fd)
      $DP --gpus "$G" --runs r50:gam_fd:graph $GAM --run_timeout 150 --out "$OUT/dp_r50fd.json" ;;
    vitexact)
      # the two modes compiled in turn: at once on 4 GPUs, global mode's first step passed 278 s
      $DP --gpus "$G" --runs vit:gam:graph $GAM --run_timeout 200 --warm_at_once 1 \
        --warm_timeout 200 --stacks_after 120 --perturbations "${PERTS:-global,local}" \
        --out "$OUT/dp_vitexact.json" ;;
    pack)
      wait; mkdir -p "$OUT/pack_logs"
      for f in gpu_check.log dali_tests.log; do
        [ -f "$OUT/$f" ] && { echo "-- $f"; tail -4 "$OUT/$f"; mv "$OUT/$f" "$OUT/pack_logs/"; }
      done; ls "$OUT" ;;
    leftover) ;;  # only the logs that a stage cut short (by `timeout`) left in $OUT
    *) echo "unknown stage $what"; exit 2 ;;
  esac
  pack_logs "$what"
done
