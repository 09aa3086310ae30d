// Simulated Ascend NPU runtime for torch's PrivateUse1 backend (renamed "npu" on the Python side).
//
// One rule decides how many simulated cards a process sees (simnpu_visible below); the C++
// device guard, the PrivateUse1 hooks and torch.npu.device_count() all ask it, so they can
// never disagree. Tensors themselves live in host memory (see _simnpu/_tensor.py); this file
// only provides what torch needs in C++ for a device type: a DeviceGuardImplInterface (current
// device, device count, no-op streams and events) and a PrivateUse1HooksInterface.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/Generator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "simnpu.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr int kMaxCards = simnpu::kMaxCards;

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

// ---- initialisation, the fork rule, and the registry npu-smi reads ----------------------------------
std::mutex init_mutex;
bool initialized = false;
std::atomic<bool> bad_fork{false};
std::atomic<bool> held[simnpu::kMaxCards];

void after_fork_in_child() {
  if (initialized) bad_fork = true;
  for (auto& h : held) h = false;
}

struct AtFork {
  AtFork() { pthread_atfork(nullptr, nullptr, after_fork_in_child); }
} at_fork;

std::string state_dir() {
  const char* d = std::getenv("SIMNPU_STATE_DIR");
  if (d && *d) return d;
  return "/tmp/simnpu-" + std::to_string(getuid());
}

void register_card(int physical) {  // a convenience for npu-smi: never fails a run
  const std::string folder = state_dir() + "/procs";
  mkdir(state_dir().c_str(), 0777);
  mkdir(folder.c_str(), 0777);
  std::string name = "python";
  if (FILE* f = std::fopen("/proc/self/comm", "r")) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof buf, f)) {
      name = buf;
      while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    }
    std::fclose(f);
  }
  const std::string path = folder + "/" + std::to_string(getpid()) + "-" + std::to_string(physical);
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "%d\n%s\n%d\n", static_cast<int>(getpid()), name.c_str(), physical);
    std::fclose(f);
  }
}

std::string init_error() {  // "" once the runtime is up
  if (bad_fork) {
    return "Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, you must use the "
           "'spawn' start method";
  }
  std::lock_guard<std::mutex> lock(init_mutex);
  if (initialized) return "";
  const Visible v = visible();
  const char* vis = std::getenv("ASCEND_RT_VISIBLE_DEVICES");
  const char* cards = std::getenv("SIMNPU_CARDS");
  if (v.status == 207004) {
    return std::string("npuSynchronizeDevice:torch_npu/csrc/core/npu/NPUStream.cpp NPU function error: "
                       "aclrtSetDevice, error code is 207004\n[ERROR] (simulated) ASCEND_RT_VISIBLE_DEVICES=") +
           (vis ? vis : "") + " names a card the host does not have (SIMNPU_CARDS=" + (cards ? cards : "2") +
           "). EE1001: The argument is invalid.";
  }
  if (v.status != 0) {
    return std::string("NPU device is unavailable: ASCEND_RT_VISIBLE_DEVICES=") + (vis ? vis : "") +
           " is not an ascending list of card ids (simulated runtime rejects it)";
  }
  if (v.physical.empty()) return "No NPU device is visible (simulated runtime: device_count() == 0)";
  {
    std::lock_guard<std::mutex> vlock(visible_mutex);
    fixed_visible = v;  // ASCEND_RT_VISIBLE_DEVICES was re-read until now; from here the cards are fixed
    frozen = true;
  }
  initialized = true;
  return "";
}

}  // namespace

namespace simnpu {

c10::DeviceIndex count() { return static_cast<c10::DeviceIndex>(visible().physical.size()); }
c10::DeviceIndex current() { return current_index; }
bool in_bad_fork() { return bad_fork; }

void check_index(c10::DeviceIndex i) {
  TORCH_CHECK(i >= 0 && i < count(), "Invalid device argument: npu:", static_cast<int>(i),
              " (device_count=", static_cast<int>(count()), "). The device index is out of range.");
}

void set_current(c10::DeviceIndex i) {
  touch(i);
  current_index = i;
}

void set_current_unchecked(c10::DeviceIndex i) { current_index = i; }

std::string touch_error(c10::DeviceIndex i) {
  if (i >= 0 && i < kMaxCards && held[i] && !bad_fork) return "";  // the fast path of every allocation
  std::string err = init_error();
  if (!err.empty()) return err;
  if (i < 0) return "";  // initialise only
  if (i >= count()) {
    return "Invalid device argument: npu:" + std::to_string(i) + " (device_count=" + std::to_string(count()) +
           "). The device index is out of range.";
  }
  if (!held[i].exchange(true)) register_card(visible().physical[i]);
  return "";
}

void touch(c10::DeviceIndex i) {
  const std::string err = touch_error(i);
  TORCH_CHECK(err.empty(), err);
}

Soc& soc() {
  static Soc s;
  return s;
}

}  // namespace simnpu

namespace {
using simnpu::check_index;
using simnpu::count;

constexpr int kPool = 32;  // streams per priority and card, as torch_npu's pool
thread_local c10::StreamId current_stream[kMaxCards] = {};
std::atomic<int> next_stream[kMaxCards];
int slot(c10::Device d) { return d.index() < 0 ? current_index : d.index(); }

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
  // Streams: ids from a pool per card (as the real torch_npu hands out), the current one per card and thread.
  // Kernels run synchronously on the host, so a stream orders nothing.
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, current_stream[slot(d)]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, 1 + (priority ? kPool : 0) + next_stream[slot(d)]++ % kPool);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override { return getNewStream(d, high); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const auto old = getStream(s.device());
    current_stream[slot(s.device())] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return count(); }
  // Events: the host time when recorded (kernels are done by then), so elapsed_time measures the host.
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new double(0);
    *static_cast<double*>(*event) =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    TORCH_CHECK(a != nullptr && b != nullptr, "Both events must be recorded before calculating elapsed time.");
    return *static_cast<double*>(b) - *static_cast<double*>(a);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<double*>(event); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimNpuGuard);

// "Pinned" (page-locked) host memory: plain host memory here, whose blocks are remembered, so `is_pinned()` answers as
// on a card: True for `pin_memory()` and for the host copy of a non-blocking npu->cpu transfer, False otherwise.
std::mutex pinned_mutex;
std::map<uintptr_t, size_t> pinned_blocks;  // start -> bytes

void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned_blocks.erase(reinterpret_cast<uintptr_t>(p));
  }
  c10::free_cpu(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(n ? n : 1);
    {
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_blocks[reinterpret_cast<uintptr_t>(p)] = n ? n : 1;
    }
    return {p, p, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
} pinned_allocator;

bool is_pinned_ptr(const void* data) {
  const auto p = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto it = pinned_blocks.upper_bound(p);
  if (it == pinned_blocks.begin()) return false;
  --it;
  return p < it->first + it->second;
}

struct SimNpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { simnpu::set_current(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_index; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_index;
    if (d >= 0) { check_index(d); current_index = d; }
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex i) const override {
    return simnpu::default_generator(i < 0 ? current_index : i);
  }
  at::Generator getNewGenerator(c10::DeviceIndex i) const override {
    return simnpu::new_generator(i < 0 ? current_index : i);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_index);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override {
    simnpu::resize_bytes(storage.unsafeGetStorageImpl(), n);
  }
};

struct Register {
  Register() { at::RegisterPrivateUse1HooksInterface(new SimNpuHooks()); }
} register_hooks;

}  // namespace

// C entry points for the Python side (ctypes).
extern "C" {
int simnpu_status() { return visible().status; }
int simnpu_device_count() { return static_cast<int>(visible().physical.size()); }
int simnpu_physical_id(int i) {
  const auto p = visible().physical;
  return (i >= 0 && i < static_cast<int>(p.size())) ? p[i] : -1;
}
int simnpu_current_device() { return current_index; }
int simnpu_initialized() { return initialized && !bad_fork; }
int simnpu_in_bad_fork() { return bad_fork; }
// Initialise (i < 0) or initialise and take card i; 0 on success, else the runtime's message in `err`.
int simnpu_touch(int i, char* err, int n) {
  const std::string e = simnpu::touch_error(static_cast<c10::DeviceIndex>(i));
  if (e.empty()) return 0;
  std::snprintf(err, n, "%s", e.c_str());
  return 1;
}
int simnpu_set_device(int i, char* err, int n) {
  if (simnpu_touch(i, err, n)) return 1;
  current_index = static_cast<c10::DeviceIndex>(i);
  return 0;
}
void simnpu_configure(const char* soc_name, long long hbm, int bf16, int alloc_conf_2_14) {
  auto& s = simnpu::soc();
  s.name = soc_name;
  s.hbm = hbm;
  s.bf16 = bf16 != 0;
  s.alloc_conf_2_14 = alloc_conf_2_14 != 0;
}
}
