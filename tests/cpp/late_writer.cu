// A test kernel that writes another op's inputs late, while that op (launched after it with
// programmatic dependent launch) has already started: what an op's prologue may read before its
// griddepcontrol.wait is then stale (dense_decode_gpu_test.cpp, DenseDecodeGpuPdl).
#include "test_support.h"

namespace openmla::testing {
namespace {

struct LateCopies {
  const uint8_t* source[2];
  uint8_t* destination[2];
  size_t bytes[2];
};

__global__ void late_copy_kernel(LateCopies copies, unsigned long long delay_ns) {
  // The next grid may launch now (PDL); it must wait for this one before reading what it copies.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
  } while (now - start < delay_ns);
  for (int copy = 0; copy < 2; ++copy) {
    for (size_t i = threadIdx.x; i < copies.bytes[copy]; i += blockDim.x) {
      copies.destination[copy][i] = copies.source[copy][i];
    }
  }
}

}  // namespace

void launch_late_copies(const DeviceTensor& source_a, const DeviceTensor& destination_a, const DeviceTensor& source_b,
                        const DeviceTensor& destination_b, int delay_us, cudaStream_t stream) {
  ASSERT_EQ(source_a.byte_count, destination_a.byte_count);
  ASSERT_EQ(source_b.byte_count, destination_b.byte_count);
  const LateCopies copies{{static_cast<const uint8_t*>(source_a.pointer), static_cast<const uint8_t*>(source_b.pointer)},
                          {static_cast<uint8_t*>(destination_a.pointer), static_cast<uint8_t*>(destination_b.pointer)},
                          {source_a.byte_count, source_b.byte_count}};
  late_copy_kernel<<<1, 256, 0, stream>>>(copies, 1000ull * unsigned(delay_us));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace openmla::testing
