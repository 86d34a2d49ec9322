// The built-in device catalog. Every figure is the vendor's datasheet peak for dense math (the
// datasheets print structured-sparsity figures at twice these; we never use them), and every entry
// cites its document. TFLOPS are 10^12 FLOP/s; memory bandwidth is in 10^9 bytes/s; memory sizes
// are the marketed GB, read as GiB the way the drivers report them (rounded down by the reserve in
// the cost model). A zero peak means the device has no fast path for that format; the planner
// then falls back to the next format (see CostModel::trainingDtype).
#include "chorus/plan/device_catalog.h"

#include "chorus/core/error.h"
#include "chorus/core/name_table.h"
#include "chorus/core/named_catalog.h"

namespace chorus::plan {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr std::uint64_t kGiB = 1ull << 30;

DeviceType make(const char* name, const char* vendor, DeviceClass device_class, double memory_gib,
                double bandwidth_gbs, double fp32, double tf32, double bf16, double fp16) {
  DeviceType type;
  type.name = name;
  type.vendor = vendor;
  type.device_class = device_class;
  type.memory_bytes = static_cast<std::uint64_t>(memory_gib * kGiB);
  type.memory_bandwidth = bandwidth_gbs * kGiga;
  type.peak_flops[static_cast<int>(Dtype::kFp32)] = fp32 * kTera;
  type.peak_flops[static_cast<int>(Dtype::kTf32)] = tf32 * kTera;
  type.peak_flops[static_cast<int>(Dtype::kBf16)] = bf16 * kTera;
  type.peak_flops[static_cast<int>(Dtype::kFp16)] = fp16 * kTera;
  return type;
}

std::vector<DeviceType> buildCatalog() {
  constexpr DeviceClass kGpu = DeviceClass::kGpu;
  return {
      // NVIDIA Tesla V100 SXM2 datasheet (images.nvidia.com/content/technologies/volta/pdf/
      // tesla-volta-v100-datasheet-letter-fnl-web.pdf): FP32 15.7, tensor (FP16) 125 TFLOPS,
      // HBM2 900 GB/s, 16 or 32 GB. Volta has no TF32 or BF16 tensor cores.
      make("V100-16", "NVIDIA", kGpu, 16, 900, 15.7, 0, 0, 125),
      make("V100-32", "NVIDIA", kGpu, 32, 900, 15.7, 0, 0, 125),
      // NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/
      // a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), SXM: FP32 19.5, TF32 156,
      // BF16 312, FP16 312 TFLOPS; HBM2 1,555 GB/s (40 GB), HBM2e 2,039 GB/s (80 GB).
      make("A100-40", "NVIDIA", kGpu, 40, 1555, 19.5, 156, 312, 312),
      make("A100-80", "NVIDIA", kGpu, 80, 2039, 19.5, 156, 312, 312),
      // NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/
      // nvidia-tensor-core-gpu-datasheet), SXM: FP32 67, TF32 494.5, BF16/FP16 989.5 TFLOPS dense
      // (the sheet prints 989/1,979 with sparsity), HBM3 3.35 TB/s, 80 GB.
      make("H100-80", "NVIDIA", kGpu, 80, 3350, 67, 494.5, 989.5, 989.5),
      // NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/), SXM: the H100
      // SXM's compute with 141 GB of HBM3e at 4.8 TB/s.
      make("H200", "NVIDIA", kGpu, 141, 4800, 67, 494.5, 989.5, 989.5),
      // NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4/): FP32 30.3, TF32
      // 60, BF16/FP16 121 TFLOPS dense (120/242 with sparsity), GDDR6 300 GB/s, 24 GB.
      make("L4", "NVIDIA", kGpu, 24, 300, 30.3, 60, 121, 121),
      // NVIDIA T4 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/
      // tesla-t4/t4-tensor-core-datasheet-951643.pdf): FP32 8.1, mixed FP16/FP32 65 TFLOPS,
      // GDDR6 320 GB/s, 16 GB. Turing has no TF32 or BF16 tensor cores.
      make("T4", "NVIDIA", kGpu, 16, 320, 8.1, 0, 0, 65),
      // NVIDIA Ampere GA102 GPU Architecture whitepaper (v2.1, appendix table for GeForce RTX
      // 3090):
      // FP32 35.6, TF32 tensor 35.6, FP16/BF16 tensor with FP32 accumulate 71 TFLOPS (training
      // accumulates in FP32; 142 is the FP16-accumulate figure), GDDR6X 936 GB/s, 24 GB.
      make("RTX3090", "NVIDIA", kGpu, 24, 936, 35.6, 35.6, 71, 71),
      // NVIDIA Ada GPU Architecture whitepaper (v2.1, table for GeForce RTX 4090): FP32 82.6, TF32
      // 82.6, FP16/BF16 tensor with FP32 accumulate 165.2 TFLOPS, GDDR6X 1,008 GB/s, 24 GB.
      make("RTX4090", "NVIDIA", kGpu, 24, 1008, 82.6, 82.6, 165.2, 165.2),
      // AMD Instinct MI250X datasheet (amd.com/system/files/documents/amd-instinct-mi250x-
      // datasheet.pdf): per OAM module FP32 matrix 95.7, FP16/BF16 383 TFLOPS, 128 GB HBM2e at
      // 3.2 TB/s. ROCm exposes each of the module's two GCDs as its own device, so one catalog
      // "MI250X" is one GCD: half of each figure. CDNA2 has no TF32.
      make("MI250X", "AMD", kGpu, 64, 1600, 47.85, 0, 191.5, 191.5),
      // AMD Instinct MI300X datasheet (amd.com/content/dam/amd/en/documents/instinct-tech-docs/
      // data-sheets/amd-instinct-mi300x-data-sheet.pdf): FP32 matrix 163.4, TF32 653.7, FP16/BF16
      // 1,307.4 TFLOPS dense, 192 GB HBM3 at 5.3 TB/s.
      make("MI300X", "AMD", kGpu, 192, 5300, 163.4, 653.7, 1307.4, 1307.4),
      // A generic two-socket server as one CPU worker: 2 x Intel Xeon Platinum 8380 (Intel ARK:
      // 40 cores, 2.3 GHz base, two AVX-512 FMA units per core -> 2 x 40 x 2.3e9 x 32 = 5.9 TFLOPS
      // FP32; no AMX, so BF16 runs at the FP32 rate), 8 channels of DDR4-3200 per socket
      // (2 x 204.8 GB/s), 256 GB. A cluster file can override memory or define its own CPU type.
      make("CPU", "Intel", DeviceClass::kCpu, 256, 409.6, 5.9, 0, 5.9, 0),
  };
}

constexpr NamedValue<Dtype> kDtypeNames[] = {
    {Dtype::kFp32, "fp32"}, {Dtype::kTf32, "tf32"}, {Dtype::kBf16, "bf16"}, {Dtype::kFp16, "fp16"}};

}  // namespace

const char* toString(Dtype dtype) { return nameOf(kDtypeNames, dtype); }

Dtype parseDtype(const std::string& name) {
  if (auto dtype = valueNamed(kDtypeNames, name)) return *dtype;
  CHORUS_THROW(ConfigError, "unknown precision '", name, "'; known: ", namesOf(kDtypeNames));
}

const std::vector<DeviceType>& deviceCatalog() {
  // Immutable after first use; initialization of a function-local static is thread-safe.
  static const std::vector<DeviceType> catalog = buildCatalog();
  return catalog;
}

const DeviceType* findDeviceType(const std::string& name) {
  return findNamed(deviceCatalog(), name);
}

std::string knownDeviceTypes() { return catalogNames(deviceCatalog()); }

}  // namespace chorus::plan
