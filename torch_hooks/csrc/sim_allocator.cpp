// Simulated-GPU memory for colocate: a CPU allocator that models PyTorch's CUDA
// caching allocator (CUDACachingAllocator.cpp) and enforces a byte budget.
//
// Every CPU tensor storage of the job goes through this allocator once
// install() has run (c10::SetCPUAllocator). Real memory always comes from
// c10::alloc_cpu; the caching allocator is modelled over a virtual address
// space, so the accounting (allocated vs reserved bytes, segments, cached free
// blocks, empty_cache releasing only wholly free segments) follows the CUDA
// allocator exactly while the storage itself stays ordinary host memory.
//
// Over the cap, an allocation is either served from "host memory" (AntMan's
// universal memory: counted in host_* statistics, not in device reserved) or
// rejected with c10::OutOfMemoryError (torch.OutOfMemoryError in Python).
//
// A simulated GPU's total: where the node keeps a memory ledger for the GPU (colocate/gpus/ledger.py), every
// job on it holds a slot there, and a new segment is reserved only while the reserved bytes of all the slots
// stay within the GPU's total (under flock of the ledger's file); past it, as over the cap.
//
// Thread safety: every entry point takes one mutex.

#include <pybind11/pybind11.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <ctime>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>

namespace py = pybind11;

namespace {

constexpr size_t kMinBlockSize = 512;          // all sizes are rounded to 512 B
constexpr size_t kSmallSize = 1 << 20;         // largest "small" allocation
constexpr size_t kSmallBuffer = 2 << 20;       // small-pool segment size
constexpr size_t kLargeBuffer = 20 << 20;      // segment for 1..10 MiB requests
constexpr size_t kMinLargeAlloc = 10 << 20;    // from here, round to kRoundLarge
constexpr size_t kRoundLarge = 2 << 20;

struct Block {
  size_t size;
  size_t addr;  // virtual device address
  bool allocated = false;
  bool small;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};

// colocate/gpus/ledger.py's layout: a 64-byte head (uint64 total at byte 8), then kLedgerSlots slots of 64 bytes.
struct LedgerSlot {
  std::atomic<int32_t> pid;  // 0: free
  int32_t pad;
  std::atomic<uint64_t> reserved;
  char rest[48];
};
static_assert(sizeof(LedgerSlot) == 64, "ledger slot layout");
constexpr size_t kLedgerHead = 64;
constexpr int kLedgerSlots = 63;

struct Live {
  Block* block;  // nullptr: served from host memory
  size_t nbytes;
};

std::string fmt_bytes(size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.precision(u == 0 ? 0 : 2);
  os << std::fixed << v << " " << units[u];
  return os.str();
}

size_t round_size(size_t n) {
  if (n < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((n + kMinBlockSize - 1) / kMinBlockSize);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

class Model {
 public:
  std::mutex mu;
  std::set<Block*, BlockLess> small_pool, large_pool;
  std::unordered_map<void*, Live> live;
  size_t cap = std::numeric_limits<size_t>::max();
  bool error_on_cap = false;
  size_t next_addr = 1 << 20;

  // current values
  size_t reserved = 0, allocated = 0, host = 0, segments = 0;
  // lifetime peaks and counters
  size_t peak_reserved = 0, peak_allocated = 0, peak_host = 0;
  uint64_t num_allocs = 0, num_host_allocs = 0, num_ooms = 0, num_cache_flushes = 0;
  uint64_t host_alloc_bytes_total = 0;
  uint64_t num_device_full = 0;  // segments refused because the GPU's total was held (the ledger)
  bool last_full = false;        // the last refused segment was refused by the ledger, not the cap
  // the GPU's ledger (set_ledger): its mapping, file (for flock), this process's slot; only the process that
  // attached uses it (a forked child inherits the mapping but not the slot)
  char* ledger = nullptr;
  int ledger_fd = -1;
  int ledger_slot = -1;
  pid_t ledger_pid = 0;
  // window (since the last reset_window(), i.e. the last mini-batch boundary)
  size_t win_peak_reserved = 0, win_peak_allocated = 0, win_peak_host = 0;
  size_t win_host_alloc_bytes = 0, win_host_at_start = 0;

  std::set<Block*, BlockLess>& pool(bool small) { return small ? small_pool : large_pool; }

  void bump_peaks() {
    if (reserved > peak_reserved) peak_reserved = reserved;
    if (allocated > peak_allocated) peak_allocated = allocated;
    if (host > peak_host) peak_host = host;
    if (reserved > win_peak_reserved) win_peak_reserved = reserved;
    if (allocated > win_peak_allocated) win_peak_allocated = allocated;
    if (host > win_peak_host) win_peak_host = host;
  }

  bool ledger_on() const { return ledger != nullptr && getpid() == ledger_pid; }
  LedgerSlot* slot_at(int i) { return reinterpret_cast<LedgerSlot*>(ledger + kLedgerHead + i * sizeof(LedgerSlot)); }
  uint64_t ledger_total() { return reinterpret_cast<std::atomic<uint64_t>*>(ledger + 8)->load(); }

  // Reserved bytes of every other live slot. Caller holds the ledger's flock.
  uint64_t ledger_others(bool reap) {
    uint64_t sum = 0;
    for (int i = 0; i < kLedgerSlots; ++i) {
      if (i == ledger_slot) continue;
      LedgerSlot* s = slot_at(i);
      int32_t pid = s->pid.load(std::memory_order_acquire);
      if (pid == 0) continue;
      if (reap && kill(pid, 0) == -1 && errno == ESRCH) {  // its process is gone: the slot is free
        s->reserved.store(0, std::memory_order_release);
        s->pid.store(0, std::memory_order_release);
        continue;
      }
      sum += s->reserved.load(std::memory_order_acquire);
    }
    return sum;
  }

  // Whether the GPU has room for `seg` more bytes of this process; if so they are in its slot already.
  bool ledger_admit(size_t seg) {
    if (!ledger_on()) return true;
    while (flock(ledger_fd, LOCK_EX) == -1 && errno == EINTR) {
    }
    uint64_t total = ledger_total();
    uint64_t others = ledger_others(false);
    if (others + reserved + seg > total) others = ledger_others(true);
    bool ok = others + reserved + seg <= total;
    if (ok) slot_at(ledger_slot)->reserved.store(reserved + seg, std::memory_order_release);
    flock(ledger_fd, LOCK_UN);
    return ok;
  }

  void ledger_publish() {
    if (ledger_on()) slot_at(ledger_slot)->reserved.store(reserved, std::memory_order_release);
  }

  // Release every cached segment that is wholly free. Caller holds mu.
  size_t release_cached() {
    size_t freed = 0;
    for (auto* p : {&small_pool, &large_pool}) {
      for (auto it = p->begin(); it != p->end();) {
        Block* b = *it;
        if (b->prev == nullptr && b->next == nullptr) {
          freed += b->size;
          reserved -= b->size;
          --segments;
          it = p->erase(it);
          delete b;
        } else {
          ++it;
        }
      }
    }
    ++num_cache_flushes;
    ledger_publish();
    return freed;
  }

  // Find or create a device block of `size` bytes; nullptr when the cap stops it.
  Block* device_block(size_t size) {
    bool small = size <= kSmallSize;
    auto& p = pool(small);
    Block key{size, 0, false, small};
    auto it = p.lower_bound(&key);
    Block* block = nullptr;
    if (it != p.end()) {
      block = *it;
      p.erase(it);
    } else {
      size_t seg = segment_size(size);
      last_full = false;
      if (reserved + seg > cap) {
        release_cached();
        if (reserved + seg > cap) return nullptr;
      }
      if (!ledger_admit(seg)) {  // the GPU is full: what this process caches goes back first
        release_cached();
        if (!ledger_admit(seg)) {
          ++num_device_full;
          last_full = true;
          return nullptr;
        }
      }
      block = new Block{seg, next_addr, false, small};
      next_addr += seg;
      reserved += seg;
      ++segments;
    }
    size_t remaining = block->size - size;
    bool split = small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    if (split) {
      Block* rest = new Block{remaining, block->addr + size, false, small};
      rest->prev = block;
      rest->next = block->next;
      if (block->next) block->next->prev = rest;
      block->next = rest;
      block->size = size;
      p.insert(rest);
    }
    block->allocated = true;
    allocated += block->size;
    return block;
  }

  void free_block(Block* block) {
    auto& p = pool(block->small);
    block->allocated = false;
    allocated -= block->size;
    // merge with free neighbours in the same segment
    if (block->prev && !block->prev->allocated) {
      Block* prev = block->prev;
      p.erase(prev);
      prev->size += block->size;
      prev->next = block->next;
      if (block->next) block->next->prev = prev;
      delete block;
      block = prev;
    }
    if (block->next && !block->next->allocated) {
      Block* next = block->next;
      p.erase(next);
      block->size += next->size;
      block->next = next->next;
      if (next->next) next->next->prev = block;
      delete next;
    }
    p.insert(block);
  }
};

Model& model() {
  static Model* m = new Model();  // leaked on purpose: frees may run at exit
  return *m;
}

void sim_delete(void* ptr);

// ---- device-phase gate (opportunistic jobs yield to the guaranteed job) ----
// The guaranteed job publishes a GateBlock in shared memory (torch_hooks/gate.py):
// `active` is 1 while its mini-batch device work runs; `next_start` is the
// monotonic time its next device phase is expected. A gated process waits
// before each allocation (each operator's launch, in effect) while the
// guaranteed job is active or is about to start, at most `max_wait_s` per wait
// so a vanished publisher cannot stall it. "About to start" is a guard before
// `next_start` as long as this process's operators take: an operator already
// running when the guaranteed job starts cannot be stopped (a kernel in flight),
// so the next one is held back early enough. The operator time is estimated
// from the spacing of this process's allocations (rises fast, decays slowly: a
// high percentile), times `guard_mult`, clamped to [guard_min_s, guard_max_s].
struct GateBlock {
  std::atomic<int32_t> active;
  int32_t pid;
  std::atomic<double> next_start;
  std::atomic<uint64_t> phases;
  std::atomic<double> gap;  // the publisher's typical idle gap between device phases (s)
};

std::atomic<GateBlock*> g_gate{nullptr};
std::atomic<bool> g_gate_on{false};
double g_guard_min_s = 0.001, g_guard_max_s = 0.02, g_guard_mult = 1.5, g_late_s = 0.02, g_max_wait_s = 0.5;
std::atomic<double> g_last_alloc{0.0};
std::atomic<double> g_op_est{0.002};
std::atomic<uint64_t> g_gate_waits{0};
std::atomic<uint64_t> g_gate_wait_ns{0};

double mono_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double guard_s() {
  double guard = g_guard_mult * g_op_est.load(std::memory_order_relaxed);
  return guard < g_guard_min_s ? g_guard_min_s : (guard > g_guard_max_s ? g_guard_max_s : guard);
}

double capped_guard(GateBlock* g, double guard) {
  double gap = g->gap.load(std::memory_order_acquire);
  return (gap > 0 && guard > 0.5 * gap) ? 0.5 * gap : guard;  // leave the follower half the gap
}

bool gate_closed(GateBlock* g, double now, double guard) {
  if (g->active.load(std::memory_order_acquire)) return true;
  double ns = g->next_start.load(std::memory_order_acquire);
  return ns > 0 && now >= ns - guard && now < ns + g_late_s;
}

void note_op(double now) {
  double last = g_last_alloc.load(std::memory_order_relaxed);
  if (last > 0) {
    double dt = now - last;
    if (dt >= 0 && dt < 0.05) {  // longer gaps are host phases or waits, not operators
      double est = g_op_est.load(std::memory_order_relaxed);
      est = dt > est ? 0.7 * est + 0.3 * dt : 0.995 * est + 0.005 * dt;
      g_op_est.store(est, std::memory_order_relaxed);
    }
  }
}

void gate_wait() {
  if (!g_gate_on.load(std::memory_order_relaxed)) return;
  GateBlock* g = g_gate.load(std::memory_order_acquire);
  if (g == nullptr) return;
  double start = mono_now();
  note_op(start);
  double guard = capped_guard(g, guard_s());
  if (!gate_closed(g, start, guard)) {
    g_last_alloc.store(start, std::memory_order_relaxed);
    return;
  }
  double now = start;
  timespec nap{0, 100000};  // 100 us
  while (gate_closed(g, now, guard) && now - start < g_max_wait_s) {
    nanosleep(&nap, nullptr);
    now = mono_now();
  }
  g_last_alloc.store(now, std::memory_order_relaxed);
  g_gate_waits.fetch_add(1, std::memory_order_relaxed);
  g_gate_wait_ns.fetch_add(static_cast<uint64_t>((now - start) * 1e9), std::memory_order_relaxed);
}

class SimAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) {
      return {nullptr, nullptr, &sim_delete, c10::Device(c10::DeviceType::CPU)};
    }
    gate_wait();
    Model& m = model();
    Block* block = nullptr;
    {
      std::lock_guard<std::mutex> g(m.mu);
      block = m.device_block(round_size(nbytes));
      if (block == nullptr && m.error_on_cap) {
        ++m.num_ooms;
        std::ostringstream os;
        if (m.last_full) {
          os << "colocate: the simulated GPU's memory (" << fmt_bytes(m.ledger_total())
             << ") is full: tried to allocate " << fmt_bytes(nbytes) << " with " << fmt_bytes(m.reserved)
             << " reserved by this process and the rest by other jobs on the GPU (--on-cap error)";
        } else {
          os << "colocate: device memory cap of " << fmt_bytes(m.cap) << " exceeded: tried to allocate "
             << fmt_bytes(nbytes) << " with " << fmt_bytes(m.reserved) << " reserved and "
             << fmt_bytes(m.allocated) << " allocated (--on-cap error)";
        }
        TORCH_CHECK_WITH(OutOfMemoryError, false, os.str());
      }
    }
    void* data = nullptr;
    try {
      data = c10::alloc_cpu(nbytes);
    } catch (...) {  // real host memory exhausted: give the modelled block back
      if (block) {
        std::lock_guard<std::mutex> g(m.mu);
        m.free_block(block);
      }
      throw;
    }
    std::lock_guard<std::mutex> g(m.mu);
    if (block == nullptr) {
      m.host += nbytes;
      m.host_alloc_bytes_total += nbytes;
      m.win_host_alloc_bytes += nbytes;
      ++m.num_host_allocs;
    }
    ++m.num_allocs;
    m.live[data] = Live{block, nbytes};
    m.bump_peaks();
    return {data, data, &sim_delete, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &sim_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

void sim_delete(void* ptr) {
  if (ptr == nullptr) return;
  Model& m = model();
  {
    std::lock_guard<std::mutex> g(m.mu);
    auto it = m.live.find(ptr);
    if (it != m.live.end()) {
      if (it->second.block) {
        m.free_block(it->second.block);
      } else {
        m.host -= it->second.nbytes;
      }
      m.live.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

SimAllocator* g_allocator = nullptr;

bool install() {
  if (g_allocator) return false;
  g_allocator = new SimAllocator();
  // priority 1 beats the default CPU allocator registered at priority 0
  c10::SetCPUAllocator(g_allocator, /*priority=*/1);
  return c10::GetCPUAllocator() == g_allocator;
}

bool installed() { return g_allocator != nullptr && c10::GetCPUAllocator() == g_allocator; }

void set_cap(uint64_t cap) {
  std::lock_guard<std::mutex> g(model().mu);
  model().cap = static_cast<size_t>(cap);
}

void set_error_on_cap(bool v) {
  std::lock_guard<std::mutex> g(model().mu);
  model().error_on_cap = v;
}

bool set_ledger(uint64_t addr, int fd, int slot) {
  Model& m = model();
  std::lock_guard<std::mutex> g(m.mu);
  if (addr == 0 || slot < 0 || slot >= kLedgerSlots || fd < 0) {
    m.ledger = nullptr;
    return false;
  }
  m.ledger = reinterpret_cast<char*>(addr);
  m.ledger_fd = fd;
  m.ledger_slot = slot;
  m.ledger_pid = getpid();
  m.ledger_publish();
  return true;
}

uint64_t empty_cache() {
  std::lock_guard<std::mutex> g(model().mu);
  return model().release_cached();
}

py::dict stats() {
  Model& m = model();
  std::lock_guard<std::mutex> g(m.mu);
  py::dict d;
  d["cap"] = m.cap;
  d["error_on_cap"] = m.error_on_cap;
  d["reserved"] = m.reserved;
  d["allocated"] = m.allocated;
  d["host"] = m.host;
  d["segments"] = m.segments;
  d["live_blocks"] = m.live.size();
  d["peak_reserved"] = m.peak_reserved;
  d["peak_allocated"] = m.peak_allocated;
  d["peak_host"] = m.peak_host;
  d["num_allocs"] = m.num_allocs;
  d["num_host_allocs"] = m.num_host_allocs;
  d["num_ooms"] = m.num_ooms;
  d["num_cache_flushes"] = m.num_cache_flushes;
  d["host_alloc_bytes_total"] = m.host_alloc_bytes_total;
  d["num_device_full"] = m.num_device_full;
  d["ledger"] = m.ledger_on();
  d["win_peak_reserved"] = m.win_peak_reserved;
  d["win_peak_allocated"] = m.win_peak_allocated;
  d["win_peak_host"] = m.win_peak_host;
  d["win_host_alloc_bytes"] = m.win_host_alloc_bytes;
  d["win_host_at_start"] = m.win_host_at_start;
  size_t cached = 0;
  for (auto* p : {&m.small_pool, &m.large_pool})
    for (Block* b : *p) cached += b->size;
  d["cached"] = cached;
  return d;
}

void set_gate(uint64_t addr, bool on, double guard_min_s, double guard_max_s, double guard_mult, double late_s,
              double max_wait_s) {
  g_guard_min_s = guard_min_s;
  g_guard_max_s = guard_max_s;
  g_guard_mult = guard_mult;
  g_late_s = late_s;
  g_max_wait_s = max_wait_s;
  g_gate.store(reinterpret_cast<GateBlock*>(addr), std::memory_order_release);
  g_gate_on.store(on && addr != 0, std::memory_order_release);
}

py::dict gate_stats() {
  py::dict d;
  d["waits"] = g_gate_waits.load();
  d["wait_s"] = g_gate_wait_ns.load() * 1e-9;
  d["on"] = g_gate_on.load();
  d["op_estimate_s"] = g_op_est.load();
  d["guard_s"] = guard_s();
  return d;
}

void reset_window() {
  Model& m = model();
  std::lock_guard<std::mutex> g(m.mu);
  m.win_peak_reserved = m.reserved;
  m.win_peak_allocated = m.allocated;
  m.win_peak_host = m.host;
  m.win_host_alloc_bytes = 0;
  m.win_host_at_start = m.host;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.doc() = "colocate simulated-GPU caching allocator model";
  mod.def("install", &install, "Make this the process CPU allocator; False if already installed.");
  mod.def("installed", &installed);
  mod.def("set_cap", &set_cap, "Device byte budget (reserved bytes may not exceed it).");
  mod.def("set_error_on_cap", &set_error_on_cap, "True: raise OutOfMemoryError over the cap; False: serve from host.");
  mod.def("set_ledger", &set_ledger, "Hold the GPU's total through the ledger mapped at addr (fd: its file, "
          "slot: this process's); addr 0 stops.");
  mod.def("empty_cache", &empty_cache, "Release wholly free cached segments; returns bytes released.");
  mod.def("stats", &stats);
  mod.def("set_gate", &set_gate, "Follow the gate block at addr (shared memory); on=False stops waiting.");
  mod.def("gate_stats", &gate_stats);
  mod.def("reset_window", &reset_window, "Start a new statistics window (a mini-batch).");
}
