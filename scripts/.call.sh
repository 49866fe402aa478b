#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=$OUT/o
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -x build-gpu/tandem ]; then export NO_BUILD_NINJA=1; fi
PARTS="big" BUILD_TARGETS="tandem" TEST_DIRS="optim engine gpu" \
  OFFLOAD_BIG=13B BIG_BATCH=8 BIG_PARTS="exact specnoclip spec" BIG_STEPS=10 \
  BIG_SET="optim.state_dtype=bf16 offload.host_memory_fraction=0.85" scripts/gpu-check.sh 2>&1 | tail -40
