// Where an op runs follows from where its arguments live: host tensors run the CPU
// reference, CUDA tensors the GPU kernel. A build without CUDA, or an op without a GPU kernel
// yet, answers a CUDA tensor with ErrorKind::kNotImplemented, never a hidden copy to the CPU.
#pragma once

#include "validate.h"

#if OPENMLA_WITH_CUDA
#define OPENMLA_IF_CUDA(...) __VA_ARGS__
#else
#define OPENMLA_IF_CUDA(...)
#endif

namespace openmla {

// Makes `device` current for the scope (no-op for CPU or without CUDA).
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

template <typename CpuRun, typename CudaRun>
void run_where_arguments_live(const ArgumentChecker& check, Device device, CpuRun&& cpu_run,
                              CudaRun&& cuda_run) {
  if (device.type == DeviceType::kCPU) {
    cpu_run();
    return;
  }
#if OPENMLA_WITH_CUDA
  DeviceScope scope(device);
  cuda_run();
#else
  (void)cuda_run;
  check.not_implemented("this build of openmla has no CUDA support; the arguments are on " +
                        device_name(device));
#endif
}

}  // namespace openmla
