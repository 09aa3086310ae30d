// Shared declarations of the simulated NPU's C++ part (simnpu_runtime.cpp, simnpu_tensor.cpp).
#pragma once
#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <string>

namespace simnpu {

constexpr int kMaxCards = 64;

// The visible cards (the one rule: ASCEND_RT_VISIBLE_DEVICES, SIMNPU_CARDS, SIMNPU_FAULT).
c10::DeviceIndex count();
c10::DeviceIndex current();
void set_current(c10::DeviceIndex i);  // takes the card (touch)
void set_current_unchecked(c10::DeviceIndex i);
void check_index(c10::DeviceIndex i);

// The runtime's initialisation for card `i` (what a real host's first use of the card does): fixes the
// visible cards, registers the card for npu-smi, raises the runtime's errors, and refuses in a forked child.
void touch(c10::DeviceIndex i);
// The same check without throwing: "" when card `i` can be used, else the runtime's message.
std::string touch_error(c10::DeviceIndex i);
bool in_bad_fork();

// SoC facts, set from Python (SIMNPU_SOC) before any tensor is made.
struct Soc {
  std::string name = "Ascend910B4";
  int64_t hbm = int64_t(32) << 30;
  bool bf16 = true;
  bool alloc_conf_2_14 = false;  // the torch_npu presented is 2.14.0: PYTORCH_ALLOC_CONF is read too
};
Soc& soc();

// simnpu_tensor.cpp
const at::Generator& default_generator(c10::DeviceIndex i);
at::Generator new_generator(c10::DeviceIndex i);
void resize_bytes(c10::StorageImpl* storage, size_t n);

}  // namespace simnpu

// The C ABI that _simnpu/_build.py loads with ctypes: declared here once (the argtypes are read from this block;
// the definitions in the .cpp files must agree, or the build fails).
extern "C" {
int simnpu_status();
int simnpu_device_count();
int simnpu_physical_id(int i);
int simnpu_current_device();
int simnpu_initialized();
int simnpu_in_bad_fork();
int simnpu_touch(int i, char* err, int n);
int simnpu_set_device(int i, char* err, int n);
void simnpu_configure(const char* soc_name, long long hbm, int bf16, int alloc_conf_2_14);
void simnpu_memory(int dev, long long* out);
void simnpu_reset_peak(int dev);
void simnpu_reset_accumulated(int dev);
void simnpu_empty_cache(int dev);
int simnpu_segments(int dev, long long* out, int cap, int* is_expandable, int* small);
void simnpu_set_fraction(int dev, double fraction);
double simnpu_get_fraction(int dev);
void simnpu_manual_seed(int dev, unsigned long long seed);
unsigned long long simnpu_seed(int dev);
unsigned long long simnpu_initial_seed(int dev);
long long simnpu_get_rng_state(int dev, unsigned char* buf, long long cap);
int simnpu_set_rng_state(int dev, const unsigned char* buf, long long n);
}
