// The fake CUDA runtime's controls with C names, for Python's ctypes in
// tests that load a module built over the fake (setup.py's
// NNCOMM_FAKE_CUDA=1).
#include "fake_cudart.hpp"

extern "C" {

void nncomm_fake_configure_c(uint64_t seed, unsigned eagerness) {
  nncomm_fake_configure(seed, eagerness);
}

size_t nncomm_fake_pending_c() { return nncomm_fake_pending(); }

} // extern "C"
