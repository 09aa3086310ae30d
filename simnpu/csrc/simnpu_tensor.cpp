// NPU tensors of the simulated backend: plain PrivateUse1 tensors (a TensorImpl with the dispatch key
// PrivateUse1, as the real torch_npu's are) whose storage is host memory. So an npu parameter is an
// nn.Parameter, `p.data = ...`, `.to("meta")`, `module.cpu()` and serialization take torch's own paths.
//
// - The allocator hands out host memory and counts it per card against the card's capacity (the SoC's
//   HBM, or the fraction the process set): past it an allocation raises torch.OutOfMemoryError with the
//   real allocator's message.
// - Kernels: factories, copies, views, resize and set_ are registered for PrivateUse1; every other op goes
//   to a boxed fallback that runs the CPU kernel on host aliases of the npu tensors (CPU tensors over the
//   same bytes: in-place results land in place) and makes its new outputs npu tensors of the same card.
// - Random ops draw from the card's generator (one per card, as a card has), never from the CPU's.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <cmath>
#include <functional>
#include <memory>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "simnpu.h"

namespace {

using simnpu::kMaxCards;
constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;

// ---- memory: per card, the bytes of live storages, against the card's capacity ----------------------
struct Mem {
  int64_t allocated = 0, peak = 0, reserved = 0, peak_reserved = 0;
  int64_t allocs = 0, frees = 0, ooms = 0, retries = 0;
  double fraction = -1;  // none set
  std::vector<int64_t> segs;  // the reserved segments' sizes (expandable_segments: [small pool, large pool])
};
std::mutex mem_mutex;
Mem mem[kMaxCards];

// The real caching allocator's rules (torch_npu 2.9.0.post2, NPUCachingAllocator.cpp): a request is padded by
// 32 bytes and rounded up to 512; a block comes from a cached segment when one has room, else a new segment is
// reserved (a request up to 1 MiB: 2 MiB; under 10 MiB: 20 MiB; else rounded up to 2 MiB). Freed blocks stay
// reserved (cached) until empty_cache(). Out of memory: a new segment would pass the limit (the card's capacity, or
// the fraction set) even after the cache is released. Fragmentation is not simulated: cached bytes always fit.
constexpr int64_t kBlock = 512;
constexpr int64_t kSmallSize = 1 << 20, kSmallBuffer = 2 << 20, kMinLargeAlloc = 10 << 20, kLargeBuffer = 20 << 20;
constexpr int64_t kRoundLarge = 2 << 20;

int64_t block_size(int64_t n) { return n <= 0 ? 0 : (n + 32 + kBlock - 1) / kBlock * kBlock; }
int64_t segment_size(int64_t b) {
  if (b <= kSmallSize) return kSmallBuffer;
  if (b < kMinLargeAlloc) return kLargeBuffer;
  return (b + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}
int64_t released(int64_t allocated) { return (allocated + kRoundLarge - 1) / kRoundLarge * kRoundLarge; }
bool g_expandable = false;  // PYTORCH_NPU_ALLOC_CONF (or 2.14.0's PYTORCH_ALLOC_CONF) expandable_segments:True

// With expandable_segments the real allocator keeps one segment per pool that maps pages as it needs them
// (NPUCachingAllocator.cpp ExpandableSegment: kSmallBuffer pages for the small pool, kLargeBuffer for the large
// one); its snapshot reports those segments with is_expandable true. Here: reserve only the pages the request
// lacks, into that pool's one segment.
int64_t reserve_size(const Mem& m, int64_t b) {  // what a request that does not fit the cache reserves
  if (!g_expandable) return segment_size(b);
  const int64_t page = b <= kSmallSize ? kSmallBuffer : kLargeBuffer;
  return std::max<int64_t>(0, (m.allocated + b - m.reserved + page - 1) / page * page);
}
void grow(Mem& m, int64_t b, int64_t size) {
  if (!g_expandable) {
    m.segs.push_back(size);
    return;
  }
  if (m.segs.size() < 2) m.segs.resize(2, 0);
  m.segs[b <= kSmallSize ? 0 : 1] += size;
}
void release(Mem& m) {  // the cache given back: what stays reserved is one segment (of its pool when expandable)
  m.reserved = released(m.allocated);
  m.segs.assign(g_expandable ? 2 : (m.reserved > 0 ? 1 : 0), 0);
  if (m.reserved > 0) m.segs[g_expandable && m.reserved > kSmallSize ? 1 : 0] = m.reserved;
}

std::string format_size(int64_t n) {  // the real allocator's format_size
  char buf[64];
  if (n <= 1024) {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(n));
  } else if (n <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", n / 1024.0);
  } else if (n <= 1073741824) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", n / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
  }
  return buf;
}

int64_t capacity(int) { return simnpu::soc().hbm; }
bool fraction_set(int dev) { return mem[dev].fraction >= 0; }
int64_t allowed(int dev) {
  return fraction_set(dev) ? static_cast<int64_t>(mem[dev].fraction * capacity(dev)) : capacity(dev);
}

void count_alloc(int dev, int64_t n) {
  const int64_t b = block_size(n);
  if (b == 0) return;
  std::lock_guard<std::mutex> lock(mem_mutex);
  Mem& m = mem[dev];
  if (m.allocated + b > m.reserved) {  // no cached room: reserve a segment
    int64_t seg = reserve_size(m, b);
    if (m.reserved + seg > allowed(dev)) {  // release the cache, retry (the real one counts num_alloc_retries)
      release(m);
      ++m.retries;
      seg = reserve_size(m, b);
    }
    if (m.reserved + seg > allowed(dev)) {
      ++m.ooms;
      const std::string allowed_info = fraction_set(dev) ? format_size(allowed(dev)) + " allowed; " : "";
      // the request's allocation size (segment_size), with expandable segments too (the pages are not named)
      const std::string msg = "NPU out of memory. Tried to allocate " + format_size(segment_size(b)) + " (NPU " +
          std::to_string(dev) + "; " + format_size(capacity(dev)) + " total capacity; " + format_size(m.allocated) +
          " already allocated; " + format_size(m.allocated) + " current active; " +
          format_size(capacity(dev) - m.reserved) + " free; " + allowed_info + format_size(m.reserved) +
          " reserved in total by PyTorch).If reserved memory is >> allocated memory try setting max_split_size_mb "
          "to avoid fragmentation.";
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    }
    grow(m, b, seg);
    m.reserved += seg;
    m.peak_reserved = std::max(m.peak_reserved, m.reserved);
  }
  m.allocated += b;
  ++m.allocs;
  m.peak = std::max(m.peak, m.allocated);
}

void count_free(int dev, int64_t n) {
  const int64_t b = block_size(n);
  if (b == 0) return;
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem[dev].allocated -= b;
  ++mem[dev].frees;
}

// An npu DataPtr owns a host DataPtr and gives its bytes back to the card's count when it dies.
struct Held {
  c10::DataPtr host;
  int64_t n;
  int dev;
};

void free_held(void* p) {
  auto* h = static_cast<Held*>(p);
  count_free(h->dev, h->n);
  delete h;
}

c10::DataPtr npu_data(c10::DataPtr&& host, int64_t n, int dev) {
  void* data = host.get();
  return c10::DataPtr(data, new Held{std::move(host), n, dev}, &free_held, c10::Device(kNpu, dev));
}

// PYTORCH_NPU_ALLOC_CONF, read at the first allocation and validated with the real allocator's messages
// (NPUAllocatorConfig.cpp). torch_npu 2.14.0 (SIMNPU_TORCH_NPU) reads PYTORCH_ALLOC_CONF too and refuses both at
// once. expandable_segments shapes the reservations and the snapshot (above); the other options change nothing here.
void check_alloc_conf() {
  const char* env = std::getenv("PYTORCH_NPU_ALLOC_CONF");
  if (simnpu::soc().alloc_conf_2_14) {
    const char* acc = std::getenv("PYTORCH_ALLOC_CONF");
    TORCH_CHECK(env == nullptr || acc == nullptr,
                "Both PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF have been set, please set only one of them.");
    if (env == nullptr) env = acc;
  }
  if (env == nullptr) return;
  std::vector<std::string> tok;  // the real lexer: split on , : [ ] and drop spaces
  std::string cur;
  for (const char* c = env; *c; ++c) {
    if (*c == ',' || *c == ':' || *c == '[' || *c == ']') {
      if (!cur.empty()) tok.push_back(cur);
      tok.push_back(std::string(1, *c));
      cur.clear();
    } else if (*c != ' ') {
      cur += *c;
    }
  }
  if (!cur.empty()) tok.push_back(cur);
  auto value = [&](size_t i, const char* name) -> std::string {
    TORCH_CHECK(i + 1 < tok.size() && tok[i + 1] == ":", "Error parsing CachingAllocator settings, expected :");
    TORCH_CHECK(i + 2 < tok.size(), "Error, expecting ", name, " value");
    return tok[i + 2];
  };
  auto is_int = [](const std::string& v) { return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos; };
  bool expandable = false, split_or_gc = false;
  for (size_t i = 0; i < tok.size(); ++i) {
    const std::string& key = tok[i];
    if (key == ",") continue;
    if (key == "max_split_size_mb") {
      const std::string v = value(i, "max_split_size_mb");
      TORCH_CHECK(is_int(v), "CachingAllocator option max_split_size_mb is invalid.");
      TORCH_CHECK(std::stoll(v) > 20, "CachingAllocator option max_split_size_mb too small, must be > ", 20);
      split_or_gc = true;
    } else if (key == "garbage_collection_threshold") {
      const double v = std::atof(value(i, "garbage_collection_threshold").c_str());
      TORCH_CHECK(v > 0, "garbage_collect_threshold too small, set it 0.0~1.0");
      TORCH_CHECK(v < 1.0, "garbage_collect_threshold too big, set it 0.0~1.0");
      split_or_gc = true;
    } else if (key == "expandable_segments" || key == "pin_memory_expandable_segments" ||
               key == "pinned_mem_register" || key == "pinned_use_background_threads" ||
               key == "multi_stream_lazy_reclaim") {
      const std::string v = value(i, key.c_str());
      TORCH_CHECK(v == "True" || v == "False", "Expected a single True/False argument for ", key);
      if (key == "expandable_segments") expandable = v == "True";
    } else if (key == "base_addr_aligned_kb") {
      const std::string v = value(i, "base_addr_aligned_kb");
      TORCH_CHECK(is_int(v), "CachingAllocator option base_addr_aligned_kb is invalid.");
      TORCH_CHECK(std::stoll(v) <= 16, "CachingAllocator option base_addr_aligned_kb error, must be [0~16], dtype is int");
    } else if (key == "segment_size_mb") {
      const std::string v = value(i, "segment_size_mb");
      TORCH_CHECK(is_int(v) && std::stoll(v) >= 20 && std::stoll(v) <= 512,
                  "CachingAllocator option segment_size_mb error, must be [20, 512], dtype is int");
    } else if (key == "page_size") {
      const std::string v = value(i, "page_size");
      TORCH_CHECK(v == "1g", "Unsupported page_size value: ", v);
    } else if (key == "roundup_power2_divisions") {
      size_t j = i + 2;  // a number, or a [..] list: taken as written
      if (j < tok.size() && tok[j] == "[") while (j < tok.size() && tok[j] != "]") ++j;
      i = j;
      continue;
    } else {
      TORCH_CHECK(false, "Unrecognized CachingAllocator option: ", key);
    }
    i += 2;
  }
  g_expandable = expandable;
  TORCH_CHECK(!(expandable && split_or_gc),
              "`max_split_size_mb` or `garbage_collection_threshold`, cannot be enabled with `expandable_segments`, "
              "please set `expandable_segments` to `False`.");
}

struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    const int dev = simnpu::current();
    simnpu::touch(dev);
    static const bool conf_checked = (check_alloc_conf(), true);
    (void)conf_checked;
    count_alloc(dev, static_cast<int64_t>(n));
    c10::DataPtr host;
    try {
      host = c10::GetCPUAllocator()->allocate(n);
    } catch (...) {
      count_free(dev, static_cast<int64_t>(n));
      throw;
    }
    return npu_data(std::move(host), static_cast<int64_t>(n), dev);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

Allocator allocator;
REGISTER_ALLOCATOR(kNpu, &allocator);

struct OnCard {  // the allocator takes the current card: make it `dev` for a scope
  c10::DeviceIndex prev;
  explicit OnCard(c10::DeviceIndex dev) : prev(simnpu::current()) { simnpu::set_current(dev); }
  ~OnCard() { simnpu::set_current_unchecked(prev); }
};

void refuse_bf16(c10::ScalarType t, const std::string& what) {
  TORCH_CHECK(t != at::kBFloat16 || simnpu::soc().bf16, what, " not implemented for DT_BFLOAT16 on ",
              simnpu::soc().name, " (this SoC has no bfloat16 support; use float16)");
}

void refuse_in_bad_fork() {
  TORCH_CHECK(!simnpu::in_bad_fork(),
              "Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, you must use the "
              "'spawn' start method");
}

c10::DeviceIndex card_of(std::optional<c10::Device> d) {
  if (!d.has_value() || !d->has_index()) return simnpu::current();
  return d->index();
}

// ---- host aliases: CPU tensors over an npu tensor's bytes --------------------------------------------
void keep_storage(void* p) { delete static_cast<c10::Storage*>(p); }

c10::Storage host_storage(const c10::Storage& st) {
  void* data = st.unsafeGetStorageImpl()->mutable_data_ptr().get();
  c10::DataPtr dp(data, new c10::Storage(st), &keep_storage, c10::Device(c10::kCPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), st.nbytes(),
                                                            std::move(dp), nullptr, /*resizable=*/false));
}

at::Tensor on_storage(const c10::Storage& st, c10::DispatchKeySet ks, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(st), ks, like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

at::Tensor host_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNpu) return t;
  return on_storage(host_storage(t.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU), t);
}

// ---- factories, copies, views, resize, set_ ---------------------------------------------------------
const c10::DispatchKeySet kNpuKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>,
                               std::optional<c10::MemoryFormat> memory_format) {
  refuse_in_bad_fork();
  const auto t = dtype.value_or(c10::get_default_dtype_as_scalartype());
  refuse_bf16(t, "aten.empty.memory_format");
  TORCH_CHECK(!memory_format.has_value() || *memory_format == c10::MemoryFormat::Contiguous ||
                  *memory_format == c10::MemoryFormat::Preserve,
              "Only c10::MemoryFormat::Contiguous is supported for creating a npu tensor");
  OnCard on(card_of(device));
  return at::detail::empty_generic(size, &allocator, kNpuKeys, t, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  refuse_in_bad_fork();
  const auto t = dtype.value_or(c10::get_default_dtype_as_scalartype());
  refuse_bf16(t, "aten.empty_strided.default");
  OnCard on(card_of(device));
  return at::detail::empty_strided_generic(size, stride, &allocator, kNpuKeys, t);
}

at::Tensor host_of(const at::Tensor& t) { return t.device().type() == kNpu ? host_alias(t) : t; }

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  refuse_in_bad_fork();
  if (self.device().type() == kNpu) refuse_bf16(self.scalar_type(), "aten._copy_from.default");
  if (dst.device().type() == kNpu) {
    refuse_bf16(dst.scalar_type(), "aten._copy_from.default");
    simnpu::touch(dst.device().index());
  }
  host_of(dst).copy_(host_of(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

}  // namespace

namespace simnpu {

void resize_bytes(c10::StorageImpl* storage, size_t n) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const int dev = storage->device().index();
  OnCard on(dev);
  c10::DataPtr fresh = allocator.allocate(n);
  const size_t keep = std::min(n, storage->nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage->data(), keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(n);
}

}  // namespace simnpu

namespace {

void grow_storage(c10::TensorImpl* impl) {
  const int64_t need = impl->numel() == 0 ? 0
      : static_cast<int64_t>(at::detail::computeStorageNbytes(impl->sizes(), impl->strides(),
                                                               impl->dtype().itemsize(), impl->storage_offset()));
  if (need > static_cast<int64_t>(impl->storage().nbytes())) {
    simnpu::resize_bytes(impl->storage().unsafeGetStorageImpl(), static_cast<size_t>(need));
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  grow_storage(impl);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNpu, "Attempted to set the storage of a tensor on device \"",
              self.device(), "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(offset);
  } else {
    impl->set_sizes_and_strides(size, stride, offset);
  }
  grow_storage(impl);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  OnCard on(self.device().index());
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, &allocator, true);
  return set_storage(self, std::move(st), 0, {0}, {});
}

// CPU tensors and npu tensors of any card are "dense" alike: `p.data = p.to("npu")` and Module._apply's
// in-place path keep Parameter objects, as with the real torch_npu.
bool compatible_shallow_copy(const at::Tensor& a, const at::Tensor& b) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.device().type() == kNpu || t.device().type() == c10::kCPU);
  };
  return dense(a) && dense(b);
}

// kernels run synchronously on the host: no stream outlives a tensor's use
void record_stream(at::Tensor&, c10::Stream) {}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(compatible_shallow_copy));
  m.impl("record_stream", TORCH_FN(record_stream));
}

// the real NPU kernels know one memory format: a tensor that is not already channels_last-contiguous cannot be made so
at::Tensor contiguous(const at::Tensor& self, c10::MemoryFormat memory_format) {
  if (self.is_contiguous(memory_format)) return self;
  TORCH_CHECK(memory_format == c10::MemoryFormat::Contiguous,
              "NPU contiguous operator only supported contiguous memory format.");
  return self.clone(memory_format);
}

// composite ops: with a backend kernel of their own, autograd needs one too (contiguous keeps its autograd: it
// runs clone, which has one)
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(compatible_shallow_copy));
  m.impl("contiguous", TORCH_FN(contiguous));
}

// ---- generators: one per card ------------------------------------------------------------------------
constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // c10's default, as torch_npu seeds a fresh generator

struct NpuGenerator final : c10::GeneratorImpl {
  at::Generator host;  // the CPU generator the kernels draw from
  NpuGenerator(c10::DeviceIndex dev, uint64_t seed)
      : c10::GeneratorImpl(c10::Device(kNpu, dev), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host(at::detail::createCPUGenerator(seed)) {}
  void set_current_seed(uint64_t seed) override { host.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { host.set_offset(offset); }
  uint64_t get_offset() const override { return host.get_offset(); }
  uint64_t current_seed() const override { return host.current_seed(); }
  uint64_t seed() override { return host.seed(); }
  void set_state(const c10::TensorImpl& state) override { host.unsafeGetGeneratorImpl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return host.unsafeGetGeneratorImpl()->get_state(); }
  NpuGenerator* clone_impl() const override {
    auto* g = new NpuGenerator(device().index(), 0);
    g->host = host.clone();
    return g;
  }
};

std::mutex gen_mutex;
std::vector<at::Generator> defaults;

at::Generator& host_generator(const at::Generator& g) {
  return static_cast<NpuGenerator*>(g.unsafeGetGeneratorImpl())->host;
}

}  // namespace

namespace simnpu {

const at::Generator& default_generator(c10::DeviceIndex i) {
  check_index(i);
  std::lock_guard<std::mutex> lock(gen_mutex);
  while (static_cast<int>(defaults.size()) <= i) {
    defaults.push_back(at::make_generator<NpuGenerator>(static_cast<c10::DeviceIndex>(defaults.size()), kDefaultSeed));
  }
  return defaults[i];
}

at::Generator new_generator(c10::DeviceIndex i) {
  check_index(i);
  return at::make_generator<NpuGenerator>(i, kDefaultSeed);
}

}  // namespace simnpu

namespace {

// ---- every other op: the CPU kernel on host aliases -------------------------------------------------
struct Call {
  std::optional<c10::Device> device;   // the npu card of the op
  bool cpu_tensor = false;             // a CPU tensor with dimensions among the arguments
  std::string name;
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> host_of_npu;  // npu storage -> its host alias
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> npu_of_host;  // host alias -> npu storage

  void see(const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == kNpu) {
      refuse_bf16(t.scalar_type(), name);
      if (device.has_value() && *device != t.device()) {
        const bool first = device->index() < t.device().index();
        TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                    first ? *device : t.device(), " and ", first ? t.device() : *device, "! (", name, ")");
      }
      device = t.device();
    } else if (t.device().type() == c10::kCPU && t.dim() > 0) {
      cpu_tensor = true;
    }
  }

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) return t;
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    for (auto& [k, host] : host_of_npu) {
      if (k == key) return on_storage(host, c10::DispatchKeySet(c10::DispatchKey::CPU), t);
    }
    c10::Storage host = host_storage(t.storage());
    host_of_npu.emplace_back(key, host);
    npu_of_host.emplace_back(host.unsafeGetStorageImpl(), t.storage());
    return on_storage(host, c10::DispatchKeySet(c10::DispatchKey::CPU), t);
  }

  // A CPU result as an npu tensor: a view of an argument's bytes stays a view of that npu storage; new bytes
  // move to the card (counted against its capacity).
  at::Tensor back(const at::Tensor& t, std::vector<std::pair<c10::StorageImpl*, c10::Storage>>& fresh) {
    if (!t.defined() || t.device().type() != c10::kCPU || !t.has_storage()) return t;
    refuse_bf16(t.scalar_type(), name);
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    for (auto& [k, st] : npu_of_host) {
      if (k == key) return on_storage(st, kNpuKeys, t);
    }
    for (auto& [k, st] : fresh) {
      if (k == key) return on_storage(st, kNpuKeys, t);
    }
    const int dev = device->index();
    const int64_t n = static_cast<int64_t>(t.storage().nbytes());
    c10::Storage st;
    if (c10::raw::intrusive_ptr::use_count(key) == 1 + 1) {  // held by `t` and by the result on the stack only: take its bytes over
      count_alloc(dev, n);
      c10::DataPtr host = key->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
      st = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), n,
                                                              npu_data(std::move(host), n, dev), &allocator, true));
    } else {  // shared with something else: copy
      OnCard on(dev);
      st = c10::Storage(c10::Storage::use_byte_size_t(), n, &allocator, true);
      if (n > 0) std::memcpy(st.mutable_data(), key->data(), n);
    }
    fresh.emplace_back(key, st);
    return on_storage(st, kNpuKeys, t);
  }
};

const std::vector<std::string> kMixedOk = {"index", "index_put_", "index_put", "_index_put_impl_"};

c10::IValue map_ivalue(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isList()) {
    auto list = v.toList();
    bool has_tensor = false;
    for (const auto& e : list) has_tensor = has_tensor || static_cast<c10::IValue>(e).isTensor();
    if (!has_tensor) return v;
    auto copy = list.copy();
    for (size_t i = 0; i < copy.size(); ++i) {
      c10::IValue e = copy.get(i);
      if (e.isTensor()) copy.set(i, f(e.toTensor()));
    }
    return c10::IValue(copy);
  }
  return v;
}

std::mutex swap_mutex;

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  refuse_in_bad_fork();
  const auto& schema = op.schema();
  const auto& args_schema = schema.arguments();
  const size_t nargs = args_schema.size();
  const size_t base = stack->size() - nargs;
  Call call;
  call.name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  std::vector<c10::IValue> given(stack->begin() + base, stack->end());

  for (size_t i = 0; i < nargs; ++i) {
    map_ivalue(given[i], [&](const at::Tensor& t) { call.see(t); return t; });
  }
  for (size_t i = 0; i < nargs; ++i) {  // factories: an npu device argument
    const c10::IValue& v = given[i];
    if (v.isDevice() && v.toDevice().type() == kNpu) {
      c10::Device d = v.toDevice();
      if (!d.has_index()) d = c10::Device(kNpu, simnpu::current());
      if (!call.device.has_value()) call.device = d;
      (*stack)[base + i] = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  TORCH_CHECK(call.device.has_value(), "simulated NPU: ", call.name, " reached the npu backend with no npu tensor");
  simnpu::touch(call.device->index());
  const std::string short_name = schema.name().substr(schema.name().find("::") + 2);
  if (call.cpu_tensor && std::find(kMixedOk.begin(), kMixedOk.end(), short_name) == kMixedOk.end()) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", *call.device,
                " and cpu! (", call.name, ")");
  }

  // out= arguments go to fresh CPU tensors (a kernel may resize them), copied back afterwards
  std::vector<std::pair<size_t, at::Tensor>> outs;
  for (size_t i = 0; i < nargs; ++i) {
    const auto& a = args_schema[i];
    const c10::IValue& v = given[i];
    if (v.isTensor() && a.kwarg_only() && a.alias_info() && a.alias_info()->isWrite() &&
        v.toTensor().device().type() == kNpu) {
      const at::Tensor& o = v.toTensor();
      auto tmp = at::empty_strided(o.sizes(), o.strides(), o.options().device(c10::kCPU));
      outs.emplace_back(i, tmp);
      (*stack)[base + i] = c10::IValue(tmp);
    } else if (!v.isDevice()) {
      (*stack)[base + i] = map_ivalue(v, [&](const at::Tensor& t) { return call.alias(t); });
    }
  }

  // random ops draw from the card's generator
  const bool seeded = op.hasTag(at::Tag::nondeterministic_seeded);
  bool has_generator_arg = false;
  if (seeded) {
    const at::Generator& card = simnpu::default_generator(call.device->index());
    for (size_t i = 0; i < nargs; ++i) {
      if (args_schema[i].name() != "generator") continue;
      has_generator_arg = true;
      const c10::IValue& v = given[i];
      if (v.isNone()) {
        (*stack)[base + i] = c10::IValue(host_generator(card));
      } else {
        const at::Generator g = v.toGenerator();
        TORCH_CHECK(g.device().type() == kNpu, "Expected a 'npu' device type for generator but found '",
                    c10::DeviceTypeName(g.device().type(), true), "'");
        (*stack)[base + i] = c10::IValue(host_generator(g));
      }
    }
    if (!has_generator_arg) {  // no generator argument: the kernel takes the CPU's default, so swap its state
      std::lock_guard<std::mutex> lock(swap_mutex);
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      at::Generator& dev = host_generator(card);
      at::Tensor saved;
      {
        std::lock_guard<std::mutex> g(cpu.mutex());
        saved = cpu.get_state();
        cpu.set_state(dev.get_state());
      }
      try {
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
      } catch (...) {
        std::lock_guard<std::mutex> g(cpu.mutex());
        dev.set_state(cpu.get_state());
        cpu.set_state(saved);
        throw;
      }
      std::lock_guard<std::mutex> g(cpu.mutex());
      dev.set_state(cpu.get_state());
      cpu.set_state(saved);
    }
  }
  if (!seeded || has_generator_arg) op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  // results
  const auto& rets = schema.returns();
  const size_t nret = rets.size();
  const size_t rbase = stack->size() - nret;
  for (auto& [i, tmp] : outs) {
    const at::Tensor& o = given[i].toTensor();
    if (o.sizes() != tmp.sizes()) o.resize_(tmp.sizes());
    host_alias(o).copy_(tmp);
  }
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> fresh;
  for (size_t r = 0; r < nret; ++r) {
    const auto* info = rets[r].alias_info();
    if (info && info->isWrite()) {  // in-place / out=: the very npu tensor given
      for (size_t i = 0; i < nargs; ++i) {
        const auto* ai = args_schema[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == info->beforeSets()) {
          (*stack)[rbase + r] = given[i];
          break;
        }
      }
      continue;
    }
    (*stack)[rbase + r] = map_ivalue((*stack)[rbase + r], [&](const at::Tensor& t) { return call.back(t, fresh); });
  }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

// Autograd of ops with no formula of their own (other namespaces: fsdp::, simnpu::, ...): torch 2.9 registers a
// fallback for the built-in backends' autograd keys but not for AutogradPrivateUse1 (a backend brings its own, as
// torch_npu does); later torch has one, and a second would be refused.
struct AutogradFallback {
  std::unique_ptr<torch::Library> lib;
  AutogradFallback() {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::AutogradPrivateUse1)) return;
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::AutogradPrivateUse1,
                                           __FILE__, __LINE__);
    lib->fallback(torch::autograd::basicAutogradNotImplementedFallback());
  }
} autograd_fallback;

// simnpu::host_alias: a CPU tensor over an npu tensor's bytes (the hccl group runs gloo on it)
at::Tensor host_alias_op(const at::Tensor& t) { return host_alias(t); }

TORCH_LIBRARY(simnpu, m) { m.def("host_alias(Tensor self) -> Tensor"); }
TORCH_LIBRARY_IMPL(simnpu, PrivateUse1, m) { m.impl("host_alias", TORCH_FN(host_alias_op)); }

}  // namespace

// ---- C entry points for the Python side (ctypes) --------------------------------------------------------
extern "C" {
// stats: allocated, peak, reserved, peak reserved, allocs, frees, ooms, limit, capacity, retries
void simnpu_memory(int dev, long long* out) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  const Mem& m = mem[dev];
  const long long v[] = {m.allocated, m.peak, m.reserved, m.peak_reserved, m.allocs, m.frees, m.ooms,
                         allowed(dev), capacity(dev), m.retries};
  std::memcpy(out, v, sizeof v);
}
void simnpu_reset_peak(int dev) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem[dev].peak = mem[dev].allocated;
  mem[dev].peak_reserved = mem[dev].reserved;
}
void simnpu_reset_accumulated(int dev) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem[dev].allocs = mem[dev].frees = mem[dev].ooms = mem[dev].retries = 0;
}
void simnpu_empty_cache(int dev) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  release(mem[dev]);
}
// the reserved segments of card `dev` (sizes into `out`, up to `cap`; empty ones skipped); returns how many.
// `*is_expandable` tells whether they are expandable segments, `*small` how many leading ones are the small pool's.
int simnpu_segments(int dev, long long* out, int cap, int* is_expandable, int* small) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  int n = 0;
  *is_expandable = g_expandable;
  *small = 0;
  for (size_t i = 0; i < mem[dev].segs.size(); ++i) {
    const int64_t size = mem[dev].segs[i];
    if (size <= 0 || n >= cap) continue;
    if (g_expandable ? i == 0 : size <= kSmallBuffer) ++*small;
    out[n++] = size;
  }
  return n;
}
void simnpu_set_fraction(int dev, double fraction) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem[dev].fraction = fraction;
}
double simnpu_get_fraction(int dev) { return fraction_set(dev) ? mem[dev].fraction : 1.0; }

// generators
void simnpu_manual_seed(int dev, unsigned long long seed) {
  at::Generator& g = host_generator(simnpu::default_generator(dev));
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);
}
unsigned long long simnpu_seed(int dev) {
  at::Generator& g = host_generator(simnpu::default_generator(dev));
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.seed();
}
unsigned long long simnpu_initial_seed(int dev) {
  return host_generator(simnpu::default_generator(dev)).current_seed();
}
// the card's generator state as bytes: returns its size, copies it to `buf` when `cap` allows
long long simnpu_get_rng_state(int dev, unsigned char* buf, long long cap) {
  at::Generator& g = host_generator(simnpu::default_generator(dev));
  std::lock_guard<std::mutex> lock(g.mutex());
  at::Tensor s = g.get_state();
  const long long n = s.numel();
  if (buf && cap >= n) std::memcpy(buf, s.data_ptr(), n);
  return n;
}
int simnpu_set_rng_state(int dev, const unsigned char* buf, long long n) {
  at::Generator& g = host_generator(simnpu::default_generator(dev));
  at::Tensor s = at::empty({n}, at::kByte);
  std::memcpy(s.data_ptr(), buf, n);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
  return 0;
}
}
