// openmla-bench: the GPU's energy counter and SM clock, for energy per call in steady-state runs.
//
// NVML counts the energy a GPU has used since the driver loaded (millijoules). Under load a
// Hopper GPU runs at its power limit, where its clock falls until the power fits: a kernel
// that does the same work with fewer instructions or bytes then runs at a higher clock, so the
// energy of a call measures the work better than a time taken at whatever clock the GPU chose.
// libnvidia-ml comes with the driver and is loaded at run time, so nothing links against it:
// where it is missing (no driver, a container without it) no energy is reported.
#pragma once

#include <memory>

namespace openmla::bench {

class EnergyCounter {
 public:
  // The counter of CUDA device `cuda_device` (matched by PCI bus id); unavailable when NVML or
  // the counter is not there.
  explicit EnergyCounter(int cuda_device);
  ~EnergyCounter();
  EnergyCounter(const EnergyCounter&) = delete;
  EnergyCounter& operator=(const EnergyCounter&) = delete;

  bool available() const;
  // Millijoules since the driver loaded; NaN when unavailable. The counter advances in steps
  // (every ~100 ms on an H200), so read it around runs of a second or more.
  double millijoules() const;
  // The SM clock now (MHz); NaN when unavailable.
  double sm_clock_mhz() const;

 private:
  struct Library;
  std::unique_ptr<Library> library_;
};

}  // namespace openmla::bench
