#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=$OUT/o
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
PARTS="tests big" TEST_DIRS="gpu optim" CTEST_ARGS="-R GpuOffload.AHostRing|CpuRetract" \
  OFFLOAD_BIG=13B BIG_BATCH=4 BIG_PARTS="bound exact specnoclip" BIG_STEPS=8 \
  BIG_SET="optim.state_dtype=int8" scripts/gpu-check.sh 2>&1 | grep -v "^--" | tail -30
