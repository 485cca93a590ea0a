// openmla-bench: EnergyCounter (energy.h), NVML loaded with dlopen.
#include "energy.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>

namespace openmla::bench {

// The few NVML entry points used, with their C signatures (nvml.h; the library's ABI is stable
// and its header is not installed with the CUDA toolkit here). 0 is NVML_SUCCESS.
struct EnergyCounter::Library {
  using Init = int (*)();
  using Shutdown = int (*)();
  using HandleByPciBusId = int (*)(const char* pci_bus_id, void** device);
  using TotalEnergy = int (*)(void* device, unsigned long long* millijoules);
  using ClockInfo = int (*)(void* device, int clock_type, unsigned* mhz);  // type 1: NVML_CLOCK_SM

  void* handle = nullptr;
  Shutdown shutdown = nullptr;
  TotalEnergy total_energy = nullptr;
  ClockInfo clock_info = nullptr;  // may be missing
  void* device = nullptr;
};

EnergyCounter::EnergyCounter(int cuda_device) {
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, cuda_device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return;
  auto init = reinterpret_cast<Library::Init>(dlsym(handle, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<Library::Shutdown>(dlsym(handle, "nvmlShutdown"));
  auto by_bus_id = reinterpret_cast<Library::HandleByPciBusId>(dlsym(handle, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto total_energy = reinterpret_cast<Library::TotalEnergy>(dlsym(handle, "nvmlDeviceGetTotalEnergyConsumption"));
  if (init == nullptr || shutdown == nullptr || by_bus_id == nullptr || total_energy == nullptr || init() != 0) {
    dlclose(handle);
    return;
  }
  void* device = nullptr;
  unsigned long long probe = 0;
  if (by_bus_id(bus_id, &device) != 0 || total_energy(device, &probe) != 0) {  // e.g. not supported
    shutdown();
    dlclose(handle);
    return;
  }
  library_ = std::make_unique<Library>();
  library_->handle = handle;
  library_->shutdown = shutdown;
  library_->total_energy = total_energy;
  library_->clock_info = reinterpret_cast<Library::ClockInfo>(dlsym(handle, "nvmlDeviceGetClockInfo"));
  library_->device = device;
}

EnergyCounter::~EnergyCounter() {
  if (library_) {
    library_->shutdown();
    dlclose(library_->handle);
  }
}

bool EnergyCounter::available() const { return library_ != nullptr; }

double EnergyCounter::millijoules() const {
  unsigned long long value = 0;
  if (!library_ || library_->total_energy(library_->device, &value) != 0) return NAN;
  return double(value);
}

double EnergyCounter::sm_clock_mhz() const {
  constexpr int kSmClock = 1;  // NVML_CLOCK_SM
  unsigned mhz = 0;
  if (!library_ || library_->clock_info == nullptr || library_->clock_info(library_->device, kSmClock, &mhz) != 0) {
    return NAN;
  }
  return double(mhz);
}

}  // namespace openmla::bench
