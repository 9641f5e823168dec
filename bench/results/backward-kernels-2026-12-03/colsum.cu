// Column sums of [slots, hidden] fp32 partial rows into a bf16 row: the current kernel (32 columns x 8
// slices per block) against variants with more slices per block, timed with CUDA events after the partials
// were just written (as in the backward: they sit in L2). nvcc -O3 -arch=sm_90 colsum.cu -o colsum
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>

template <int COLS, int SLICES>
__global__ void __launch_bounds__(COLS * SLICES) colsum(const float* __restrict__ p, long slots, long hidden, __nv_bfloat16* out) {
  __shared__ float slices[SLICES][COLS];
  const long col = long(blockIdx.x) * COLS + threadIdx.x;
  float sum = 0.0f;
  if (col < hidden)
    for (long s = threadIdx.y; s < slots; s += SLICES) sum += p[s * hidden + col];
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    float total = slices[0][threadIdx.x];
    for (int g = 1; g < SLICES; ++g) total += slices[g][threadIdx.x];
    out[col] = __float2bfloat16(total);
  }
}

// 4 columns per thread (float4), SLICES slices
template <int SLICES>
__global__ void __launch_bounds__(32 * SLICES) colsum4(const float4* __restrict__ p, long slots, long hidden4, __nv_bfloat16* out) {
  __shared__ float4 slices[SLICES][32];
  const long col = long(blockIdx.x) * 32 + threadIdx.x;
  float4 sum = {0, 0, 0, 0};
  if (col < hidden4)
    for (long s = threadIdx.y; s < slots; s += SLICES) { float4 v = p[s * hidden4 + col]; sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w; }
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden4) {
    float4 t = slices[0][threadIdx.x];
    for (int g = 1; g < SLICES; ++g) { float4 v = slices[g][threadIdx.x]; t.x += v.x; t.y += v.y; t.z += v.z; t.w += v.w; }
    out[4 * col] = __float2bfloat16(t.x); out[4 * col + 1] = __float2bfloat16(t.y);
    out[4 * col + 2] = __float2bfloat16(t.z); out[4 * col + 3] = __float2bfloat16(t.w);
  }
}

__global__ void fill(float* p, long n) { for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) p[i] = 1.0f; }

template <typename F>
float time_us(F launch, float* p, long n) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < 30; ++r) {
    fill<<<528, 1024>>>(p, n);  // written just before, as the row kernel leaves them
    cudaEventRecord(a); launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1e3f);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main() {
  const long cases[][2] = {{528, 2048}, {528, 3072}, {264, 4096}, {128, 4096}, {64, 4096}, {1056, 128}, {264, 8192}, {256, 65536}, {264, 16384}};
  float* p; cudaMalloc(&p, 300l << 20); __nv_bfloat16* out; cudaMalloc(&out, 1 << 20);
  for (auto& c : cases) {
    long slots = c[0], hidden = c[1], n = slots * hidden;
    float empty = time_us([&] {}, p, n);
    float a = time_us([&] { colsum<32, 8><<<(hidden + 31) / 32, dim3(32, 8)>>>(p, slots, hidden, out); }, p, n);
    float b = time_us([&] { colsum<32, 32><<<(hidden + 31) / 32, dim3(32, 32)>>>(p, slots, hidden, out); }, p, n);
    float d = time_us([&] { colsum<32, 16><<<(hidden + 31) / 32, dim3(32, 16)>>>(p, slots, hidden, out); }, p, n);
    float e = time_us([&] { colsum4<8><<<(hidden / 4 + 31) / 32, dim3(32, 8)>>>((const float4*)p, slots, hidden / 4, out); }, p, n);
    float f = time_us([&] { colsum4<32><<<(hidden / 4 + 31) / 32, dim3(32, 32)>>>((const float4*)p, slots, hidden / 4, out); }, p, n);
    printf("{\"slots\": %ld, \"hidden\": %ld, \"MB\": %.1f, \"empty_us\": %.1f, \"cols32_slices8\": %.1f, \"cols32_slices32\": %.1f, \"cols32_slices16\": %.1f, \"float4_slices8\": %.1f, \"float4_slices32\": %.1f}\n",
           slots, hidden, n * 4 / 1e6, empty, a, b, d, e, f);
  }
  printf("%s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
