// Library-wide queries and the device scope used by dispatch.
#include "dispatch.h"

#if OPENMLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace openmla {

const char* version() { return OPENMLA_VERSION; }

bool cuda_available() {
#if OPENMLA_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

DeviceScope::DeviceScope(Device device) {
#if OPENMLA_WITH_CUDA
  if (device.type != DeviceType::kCUDA) return;
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess && current != device.index) {
    previous_ = current;
    cudaSetDevice(device.index);
  }
#else
  (void)device;
#endif
}

DeviceScope::~DeviceScope() {
#if OPENMLA_WITH_CUDA
  if (previous_ >= 0) cudaSetDevice(previous_);
#endif
}

}  // namespace openmla
