// The built-in link catalog. Bandwidths are nominal per direction (GB/s = 10^9 bytes/s) from the
// cited specifications; `efficiency` is what nccl-tests-style measurements reach (busbw over the
// nominal rate); latencies are typical small-message figures for NCCL/Gloo over each link.
#include "chorus/plan/link_catalog.h"

#include "chorus/core/named_catalog.h"

namespace chorus::plan {
namespace {

constexpr double kGB = 1e9;
constexpr double kMicro = 1e-6;

LinkType make(const char* name, double gb_per_s, double efficiency, double latency_us) {
  return LinkType{name, gb_per_s * kGB, efficiency, latency_us * kMicro};
}

std::vector<LinkType> buildCatalog() {
  return {
      // NVLink 2 on V100 SXM2 (Tesla V100 datasheet: 300 GB/s total, six links of 25 GB/s per
      // direction = 150 GB/s per direction per GPU).
      make("nvlink-v100", 150, 0.8, 3),
      // NVLink 3 through NVSwitch on A100 (A100 datasheet: 600 GB/s total, 300 per direction).
      // FIELD.md / nccl-tests: 8 x A100 all-reduce reaches 230-240 GB/s busbw -> 0.78.
      make("nvswitch-a100", 300, 0.78, 3),
      // NVLink 4 through NVSwitch on H100/H200 (H100 datasheet: 900 GB/s total).
      make("nvswitch-h100", 450, 0.8, 3),
      // AMD Infinity Fabric: MI250X datasheet, up to 800 GB/s aggregate per OAM (two GCDs),
      // i.e. 200 GB/s per direction per GCD; MI300X datasheet, 896 GB/s aggregate peer bandwidth
      // (7 links x 64 GB/s per direction = 448).
      make("xgmi-mi250x", 200, 0.7, 4),
      make("xgmi-mi300x", 448, 0.7, 4),
      // PCI Express x16 (PCI-SIG base specifications 3.0/4.0/5.0: 8/16/32 GT/s per lane with
      // 128b/130b coding -> 15.75/31.5/63 GB/s per direction).
      make("pcie3", 15.75, 0.8, 5),
      make("pcie4", 31.5, 0.8, 5),
      make("pcie5", 63, 0.8, 5),
      // Workers of one host talking through the loopback interface (Gloo over TCP). FIELD.md: on a
      // 2-vCPU machine c10d Gloo moves 1.2-1.45 GB/s for 1-64 MiB all-reduces.
      make("loopback", 2, 0.7, 30),
      // Workers of one host talking through shared memory (comm's shm transport): every byte is
      // copied into the segment and out again, so the rate is about half the host's memcpy rate.
      // The nominal figure is a small cloud VM's (~10 GB/s memcpy, read + write counted);
      // `chorus devices --cluster-toml` writes the measured rate of the host instead. The
      // latency is a futex hand-off between processes, a few microseconds.
      make("shm", 5, 0.8, 5),
      // InfiniBand (IBTA: EDR 100, HDR 200, NDR 400 Gb/s per port). FIELD.md: about 12 GB/s per
      // 100G NIC, 24 per 200G -> 0.96.
      make("ib-edr", 12.5, 0.96, 5),
      make("ib-hdr", 25, 0.96, 5),
      make("ib-ndr", 50, 0.96, 5),
      // RDMA over Converged Ethernet v2 at 100 and 200 Gb/s.
      make("roce-100g", 12.5, 0.9, 8),
      make("roce-200g", 25, 0.9, 8),
      // TCP over Ethernet (IEEE 802.3 rates); Gloo/NCCL-socket reach about 85% of line rate.
      make("eth-10g", 1.25, 0.85, 30),
      make("eth-25g", 3.125, 0.85, 25),
      make("eth-100g", 12.5, 0.85, 20),
  };
}

}  // namespace

const std::vector<LinkType>& linkCatalog() {
  static const std::vector<LinkType> catalog = buildCatalog();
  return catalog;
}

const LinkType* findLinkType(const std::string& name) { return findNamed(linkCatalog(), name); }

std::string knownLinkTypes() { return catalogNames(linkCatalog()); }

}  // namespace chorus::plan
