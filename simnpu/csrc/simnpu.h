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
