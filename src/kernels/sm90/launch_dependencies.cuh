// Programmatic dependent launch (PDL, sm_90): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous kernel in the
// stream is still running; it must wait (wait_for_previous_grid) before it reads anything that
// kernel writes. Without the attribute both calls are no-ops, so kernels call them always.
#pragma once

namespace openmla::kernels::sm90 {

// Blocks until the previous grid in the stream has completed and its writes are visible.
__device__ __forceinline__ void wait_for_previous_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Lets the next grid in the stream (if launched with PDL) start its launch and prologue now.
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace openmla::kernels::sm90
