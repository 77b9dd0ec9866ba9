/*
 * cuda_tp.cu — the few CUDA runtime calls tensor parallelism needs outside a
 * backend (cuda_backend.h): how many GPUs there are, and binding a rank's
 * thread to its GPU. Why apart from cuda_ctx.cu: the TP runner is plain C
 * built with or without CUDA; these are its only entry points into the runtime.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"

extern "C" int dsv4_cuda_device_count(dsv4_err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it for the next caller */
        dsv4_err_set(err, DSV4_EBACKEND, "cuda: counting GPUs: %s", cudaGetErrorString(e));
        return -1;
    }
    return n;
}

extern "C" int dsv4_cuda_bind(int device, dsv4_err *err) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return dsv4_err_set(err, DSV4_EBACKEND, "cuda: GPU %d: %s", device, cudaGetErrorString(e));
    return 0;
}
