// Simulated Ascend NPU runtime for torch's PrivateUse1 backend (renamed "npu" on the Python side).
//
// One rule decides how many simulated cards a process sees (simnpu_visible below); the C++
// device guard, the PrivateUse1 hooks and torch.npu.device_count() all ask it, so they can
// never disagree. Tensors themselves live in host memory (see _simnpu/_tensor.py); this file
// only provides what torch needs in C++ for a device type: a DeviceGuardImplInterface (current
// device, device count, no-op streams and events) and a PrivateUse1HooksInterface.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr int kMaxCards = 64;

struct Visible {
  int status = 0;              // 0 ok, 207004 id out of range, 1 not ascending, 2 malformed
  std::vector<int> physical;   // physical card id of each visible device
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n >= 0 && n <= kMaxCards) ? static_cast<int>(n) : fallback;
}

Visible compute_visible() {
  Visible out;
  const int cards = env_int("SIMNPU_CARDS", 2);
  const char* env = std::getenv("ASCEND_RT_VISIBLE_DEVICES");
  if (env == nullptr) {
    for (int i = 0; i < cards; ++i) out.physical.push_back(i);
  } else {
    std::string s(env);
    size_t pos = 0;
    int prev = -1;
    while (pos <= s.size() && !s.empty()) {
      size_t comma = s.find(',', pos);
      std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      // trim blanks
      size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
      item = (a == std::string::npos) ? "" : item.substr(a, b - a + 1);
      char* end = nullptr;
      long id = item.empty() ? -1 : std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || id < 0) { out.status = 2; break; }
      if (id >= cards) {  // like the real runtime: the ids before the first one the host lacks count
        if (out.physical.empty()) out.status = 207004;
        break;
      }
      if (id <= prev) { out.status = 1; break; }
      prev = static_cast<int>(id);
      out.physical.push_back(static_cast<int>(id));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    if (out.status != 0) out.physical.clear();
  }
  const char* fault = std::getenv("SIMNPU_FAULT");
  if (fault && std::strcmp(fault, "one_device") == 0 && out.physical.size() > 1) out.physical.resize(1);
  return out;
}

// Re-read until the runtime is initialised (the first device use), then fixed, like the real runtime:
// a process may still change ASCEND_RT_VISIBLE_DEVICES after `import torch`.
std::mutex visible_mutex;
bool frozen = false;
Visible fixed_visible;

Visible visible() {
  std::lock_guard<std::mutex> lock(visible_mutex);
  return frozen ? fixed_visible : compute_visible();
}

thread_local c10::DeviceIndex current_index = 0;

c10::DeviceIndex count() { return static_cast<c10::DeviceIndex>(visible().physical.size()); }

void check_index(c10::DeviceIndex i) {
  TORCH_CHECK(i >= 0 && i < count(), "Invalid device argument: npu:", static_cast<int>(i),
              " (simulated NPU, device_count=", static_cast<int>(count()), ")");
}

struct SimNpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, current_index); }
  void setDevice(c10::Device d) const override {
    if (d.index() < 0) return;
    check_index(d.index());
    current_index = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) current_index = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return count(); }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimNpuGuard);

struct SimNpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { check_index(d); current_index = d; }
  c10::DeviceIndex getCurrentDevice() const override { return current_index; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_index;
    if (d >= 0) { check_index(d); current_index = d; }
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  // Device memory is host memory here, so "pinned" host memory is plain host memory.
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();  // kernels run on the host generator
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_index);
  }
  void resizePrivateUse1Bytes(const c10::Storage&, size_t) const override {
    TORCH_CHECK(false, "simulated NPU: storages live on the host; resizing a device storage is not simulated");
  }
};

struct Register {
  Register() { at::RegisterPrivateUse1HooksInterface(new SimNpuHooks()); }
} register_hooks;

}  // namespace

// C entry points for the Python side (ctypes).
extern "C" {
int simnpu_status() { return visible().status; }
void simnpu_freeze() {  // the runtime's initialisation: the visible cards are fixed from now on
  std::lock_guard<std::mutex> lock(visible_mutex);
  if (!frozen) fixed_visible = compute_visible();
  frozen = true;
}
int simnpu_device_count() { return static_cast<int>(visible().physical.size()); }
int simnpu_physical_id(int i) {
  const auto p = visible().physical;
  return (i >= 0 && i < static_cast<int>(p.size())) ? p[i] : -1;
}
int simnpu_current_device() { return current_index; }
int simnpu_set_device(int i) {
  if (i < 0 || i >= simnpu_device_count()) return -1;
  current_index = static_cast<c10::DeviceIndex>(i);
  return 0;
}
}
