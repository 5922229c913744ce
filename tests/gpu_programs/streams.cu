// A CUDA C program for `callpath run -e gpu=nvidia -t`: two kernels launched from two call
// sites on two streams, host-to-device and device-to-host copies, a memset and
// synchronizations. Each kernel has one call site, so the database must show `scale` only
// under launch_scale() and `axpy` only under launch_axpy().
#include <cstdio>
#include <cuda_runtime.h>

__global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) for (int k = 0; k < 64; k++) x[i] = x[i] * a + 1.0f;
}

__global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) for (int k = 0; k < 64; k++) y[i] = a * x[i] + y[i];
}

__attribute__((noinline)) void launch_scale(float *x, int n, cudaStream_t s) {
    scale<<<(n + 255) / 256, 256, 0, s>>>(x, 1.0001f, n);
}

__attribute__((noinline)) void launch_axpy(float *y, const float *x, int n, cudaStream_t s) {
    axpy<<<(n + 127) / 128, 128, 0, s>>>(y, x, 0.5f, n);
}

int main() {
    const int n = 1 << 22;
    float *h = nullptr, *dx = nullptr, *dy = nullptr;
    cudaMallocHost(&h, n * sizeof(float));
    for (int i = 0; i < n; i++) h[i] = (float)i / n;
    cudaMalloc(&dx, n * sizeof(float));
    cudaMalloc(&dy, n * sizeof(float));
    cudaStream_t s1, s2;
    cudaStreamCreate(&s1);
    cudaStreamCreate(&s2);
    for (int it = 0; it < 20; it++) {
        cudaMemcpyAsync(dx, h, n * sizeof(float), cudaMemcpyHostToDevice, s1);
        cudaMemsetAsync(dy, 0, n * sizeof(float), s2);
        cudaStreamSynchronize(s1);
        launch_scale(dx, n, s1);
        launch_axpy(dy, dx, n, s2);
        cudaDeviceSynchronize();
        cudaMemcpyAsync(h, dy, n * sizeof(float), cudaMemcpyDeviceToHost, s2);
        cudaStreamSynchronize(s2);
    }
    printf("y[1] = %f\n", h[1]);
    cudaFreeHost(h);
    cudaFree(dx);
    cudaFree(dy);
    return 0;
}
