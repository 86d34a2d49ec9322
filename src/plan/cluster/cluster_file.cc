#include "chorus/plan/cluster_file.h"

#include <toml++/toml.h>
#include <algorithm>
#include <set>

#include "chorus/core/error.h"
#include "chorus/core/input_file.h"
#include "chorus/core/text.h"
#include "chorus/core/toml_checks.h"
#include "chorus/core/units.h"

namespace chorus::plan {
namespace {

constexpr int kMaxCount = 1 << 20;
// Node and device counts multiply: each below kMaxCount could still ask for 2^40 devices, which
// ran the planner out of memory. The planner's largest tested clusters have 1024 devices.
constexpr long long kMaxDevices = 1 << 16;
// No figure of a device or link (GB/s, TFLOP/s, microseconds) comes near this; inf, or a number
// that becomes inf once scaled to bytes or FLOP/s, would only make the cost model's times 0 or
// nan.
constexpr double kMaxFigure = 1e9;

// Reading context: the file name for messages, and the types defined so far.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const toml::source_region& where, const std::string& what) const {
    CHORUS_THROW(ConfigError, source_, ":", std::max<unsigned>(1, where.begin.line), ": ", what);
  }

  // Rejects keys of `table` that are not in `known`; `context` prefixes the message.
  void rejectUnknown(const toml::table& table, const std::set<std::string>& known,
                     const std::string& context) const {
    for (auto&& [key, value] : table) {
      if (known.count(std::string(key.str()))) continue;
      std::string list;
      for (const auto& name : known) list += (list.empty() ? "" : ", ") + name;
      fail(key.source(), context + "unknown key '" + std::string(key.str()) + "'; known: " + list);
    }
  }

  std::string text(const toml::table& table, const char* key, const std::string& fallback,
                   const std::string& context) const {
    const toml::node* node = table.get(key);
    if (!node) return fallback;
    if (!node->is_string()) fail(node->source(), context + "'" + key + "' must be a string");
    return node->as_string()->get();
  }

  long long integer(const toml::table& table, const char* key, long long fallback, long long min,
                    long long max, const std::string& context) const {
    const toml::node* node = table.get(key);
    if (!node) return fallback;
    if (!node->is_integer()) fail(node->source(), context + "'" + key + "' must be an integer");
    const long long value = node->as_integer()->get();
    if (value < min || value > max)
      fail(node->source(), context + "'" + key + "' must be in [" + std::to_string(min) + ", " +
                               std::to_string(max) + "], got " + std::to_string(value));
    return value;
  }

  double number(const toml::table& table, const char* key, double fallback,
                const std::string& context) const {
    const toml::node* node = table.get(key);
    if (!node) return fallback;
    if (!node->is_number()) fail(node->source(), context + "'" + key + "' must be a number");
    const double value = node->is_integer() ? static_cast<double>(node->as_integer()->get())
                                            : node->as_floating_point()->get();
    if (!(value >= 0 && value <= kMaxFigure))
      fail(node->source(), context + "'" + key + "' must be a finite number in [0, 1e9]");
    return value;
  }

  std::uint64_t bytes(const toml::table& table, const char* key, std::uint64_t fallback,
                      const std::string& context) const {
    const toml::node* node = table.get(key);
    if (!node) return fallback;
    if (!node->is_string())
      fail(node->source(), context + "'" + key + "' must be a size string such as \"64GiB\"");
    try {
      return parseBytes(node->as_string()->get());
    } catch (const ConfigError& error) {
      fail(node->source(), context + "'" + key + "': " + error.message());
    }
  }

  // The link named by `key`: a [[link_type]] of the file (`custom`) first, then the catalog.
  LinkType link(const toml::table& table, const char* key, const std::string& fallback,
                const std::string& context, const std::vector<LinkType>& custom) const {
    const std::string name = text(table, key, fallback, context);
    for (const auto& link : custom)
      if (equalsIgnoringCase(link.name, name)) return link;
    const LinkType* link = findLinkType(name);
    if (!link) {
      const toml::node* node = table.get(key);
      std::string known = knownLinkTypes();
      for (const auto& type : custom) known += ", " + type.name;
      fail(node ? node->source() : table.source(),
           context + "'" + key + "': unknown link type '" + name + "'; known: " + known);
    }
    return *link;
  }

  // A fraction in (0, 1] under `key`, or `fallback` when absent.
  double fraction(const toml::table& table, const char* key, double fallback,
                  const std::string& context) const {
    const double value = number(table, key, fallback, context);
    if (value <= 0 || value > 1)
      fail(table.get(key)->source(), context + "'" + key + "' must be in (0, 1]");
    return value;
  }

  const toml::table& tableAt(const toml::node& node, const std::string& what) const {
    if (!node.is_table()) fail(node.source(), what + " must be a table");
    return *node.as_table();
  }

  const toml::array* arrayAt(const toml::table& table, const char* key,
                             const std::string& context) const {
    const toml::node* node = table.get(key);
    if (!node) return nullptr;
    if (!node->is_array()) fail(node->source(), context + "'" + key + "' must be an array");
    return node->as_array();
  }

  DeviceType customType(const toml::table& table, int index) const {
    const std::string context = "device_type[" + std::to_string(index) + "]: ";
    rejectUnknown(table,
                  {"name", "class", "vendor", "memory", "memory_bandwidth_gbs", "fp32_tflops",
                   "tf32_tflops", "bf16_tflops", "fp16_tflops", "efficiency", "core_fraction"},
                  context);
    DeviceType type;
    type.name = text(table, "name", "", context);
    if (type.name.empty()) fail(table.source(), context + "'name' is required");
    const std::string device_class = text(table, "class", "gpu", context);
    if (device_class != "gpu" && device_class != "cpu")
      fail(table.get("class")->source(), context + "'class' must be \"gpu\" or \"cpu\"");
    type.device_class = device_class == "cpu" ? DeviceClass::kCpu : DeviceClass::kGpu;
    type.vendor = text(table, "vendor", "custom", context);
    type.memory_bytes = bytes(table, "memory", 0, context);
    if (type.memory_bytes == 0) fail(table.source(), context + "'memory' is required");
    type.memory_bandwidth = number(table, "memory_bandwidth_gbs", 0, context) * 1e9;
    const char* keys[kDtypeCount] = {"fp32_tflops", "tf32_tflops", "bf16_tflops", "fp16_tflops"};
    for (int d = 0; d < kDtypeCount; ++d)
      type.peak_flops[d] = number(table, keys[d], 0, context) * 1e12;
    if (type.memory_bandwidth <= 0 || type.peak(Dtype::kFp32) <= 0)
      fail(table.source(), context + "'memory_bandwidth_gbs' and 'fp32_tflops' must be > 0");
    if (table.get("efficiency")) type.efficiency = fraction(table, "efficiency", 1, context);
    type.core_fraction = fraction(table, "core_fraction", 1, context);
    return type;
  }

  LinkType customLink(const toml::table& table, int index) const {
    const std::string context = "link_type[" + std::to_string(index) + "]: ";
    rejectUnknown(table, {"name", "bandwidth_gbs", "efficiency", "latency_us"}, context);
    LinkType link;
    link.name = text(table, "name", "", context);
    if (link.name.empty()) fail(table.source(), context + "'name' is required");
    link.bandwidth = number(table, "bandwidth_gbs", 0, context) * 1e9;
    if (link.bandwidth <= 0) fail(table.source(), context + "'bandwidth_gbs' must be > 0");
    link.efficiency = fraction(table, "efficiency", 1, context);
    link.latency = number(table, "latency_us", 0, context) * 1e-6;
    return link;
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

struct Parsed {
  std::vector<DeviceType> custom;
  std::vector<LinkType> links;
  std::set<std::string> node_names;
};

// A type of the file shadows a catalog type of the same name: a measured "cpu" describes this
// host better than the catalog's generic server CPU.
const DeviceType* lookup(const Parsed& parsed, const std::string& name) {
  for (const auto& type : parsed.custom)
    if (equalsIgnoringCase(type.name, name)) return &type;
  return findDeviceType(name);
}

bool definedInFile(const Parsed& parsed, const std::string& name) {
  for (const auto& type : parsed.custom)
    if (equalsIgnoringCase(type.name, name)) return true;
  return false;
}

// One entry of a node's `devices` array, resolved to a type (renamed when memory is overridden).
std::pair<DeviceType, int> deviceEntry(const Reader& reader, const Parsed& parsed,
                                       const toml::node& node, const std::string& context) {
  const toml::table& entry = reader.tableAt(node, context + "a device entry");
  reader.rejectUnknown(entry, {"type", "count", "memory"}, context);
  const std::string name = reader.text(entry, "type", "", context);
  if (name.empty()) reader.fail(entry.source(), context + "device entry needs 'type'");
  const DeviceType* base = lookup(parsed, name);
  if (!base) {
    std::string known = knownDeviceTypes();
    for (const auto& type : parsed.custom) known += ", " + type.name;
    reader.fail(entry.get("type")->source(),
                context + "unknown device type '" + name + "'; known: " + known);
  }
  DeviceType type = *base;
  const std::uint64_t memory = reader.bytes(entry, "memory", 0, context);
  if (memory > 0) {
    type.memory_bytes = memory;
    type.name += "/" + formatBytesShort(memory);
  }
  return {type, static_cast<int>(reader.integer(entry, "count", 1, 1, kMaxCount, context))};
}

void addNodes(const Reader& reader, Parsed& parsed, const toml::table& node, int index,
              const LinkType& default_inter, int default_nics, Cluster& cluster) {
  const std::string fallback_name = "node" + std::to_string(index);
  const std::string name =
      reader.text(node, "name", fallback_name, "node[" + std::to_string(index) + "]: ");
  const std::string context = "node '" + name + "': ";
  reader.rejectUnknown(
      node,
      {"name", "count", "intra_node_link", "inter_node_link", "nics", "core_contention", "devices"},
      context);
  const int copies = static_cast<int>(reader.integer(node, "count", 1, 1, kMaxCount, context));
  const toml::array* devices = reader.arrayAt(node, "devices", context);
  if (!devices || devices->empty()) reader.fail(node.source(), context + "'devices' is required");
  std::vector<std::pair<DeviceType, int>> entries;
  bool all_cpu = true;
  for (const toml::node& entry : *devices) {
    entries.push_back(deviceEntry(reader, parsed, entry, context));
    all_cpu = all_cpu && entries.back().first.device_class == DeviceClass::kCpu;
  }
  const LinkType intra =
      reader.link(node, "intra_node_link", all_cpu ? "loopback" : "pcie4", context, parsed.links);
  const LinkType inter =
      reader.link(node, "inter_node_link", default_inter.name, context, parsed.links);
  const int nics = static_cast<int>(reader.integer(node, "nics", default_nics, 1, 1024, context));
  const double contention = reader.number(node, "core_contention", 0, context);
  long long per_copy = 0;
  for (const auto& entry : entries) per_copy += entry.second;
  if (cluster.size() + per_copy * copies > kMaxDevices)
    reader.fail(node.source(), context + std::to_string(copies) + " x " + std::to_string(per_copy) +
                                   " devices make the cluster larger " + "than " +
                                   std::to_string(kMaxDevices) + " devices");
  for (int copy = 0; copy < copies; ++copy) {
    const std::string node_name = copies == 1 ? name : name + "-" + std::to_string(copy);
    if (!parsed.node_names.insert(node_name).second)
      reader.fail(node.source(), "two nodes are named '" + node_name + "'");
    const int id = cluster.addNode(node_name, intra, inter, nics, contention);
    for (const auto& [type, count] : entries) cluster.addDevices(id, type, count);
  }
}

}  // namespace

Cluster parseClusterToml(const std::string& text, const std::string& source) {
  const Reader reader(source);
  toml::table root;
  try {
    root = chorus::detail::parseToml(text, source);
  } catch (const toml::parse_error& error) {
    reader.fail(error.source(), std::string(error.description()));
  }
  reader.rejectUnknown(
      root, {"name", "inter_node_link", "nics_per_node", "device_type", "link_type", "node"}, "");
  Cluster cluster(reader.text(root, "name", "cluster", ""));
  Parsed parsed;
  if (const toml::array* links = reader.arrayAt(root, "link_type", "")) {
    for (size_t i = 0; i < links->size(); ++i) {
      const std::string what = "link_type[" + std::to_string(i) + "]";
      LinkType link = reader.customLink(reader.tableAt(*links->get(i), what), static_cast<int>(i));
      for (const auto& known : parsed.links)
        if (equalsIgnoringCase(known.name, link.name))
          reader.fail(links->get(i)->source(), what + ": link '" + link.name + "' already exists");
      parsed.links.push_back(std::move(link));
    }
  }
  const LinkType inter = reader.link(root, "inter_node_link", "eth-10g", "", parsed.links);
  const int nics = static_cast<int>(reader.integer(root, "nics_per_node", 1, 1, 1024, ""));
  if (const toml::array* types = reader.arrayAt(root, "device_type", "")) {
    for (size_t i = 0; i < types->size(); ++i) {
      const std::string what = "device_type[" + std::to_string(i) + "]";
      DeviceType type =
          reader.customType(reader.tableAt(*types->get(i), what), static_cast<int>(i));
      if (definedInFile(parsed, type.name))
        reader.fail(types->get(i)->source(), what + ": type '" + type.name + "' already exists");
      parsed.custom.push_back(std::move(type));
    }
  }
  const toml::array* nodes = reader.arrayAt(root, "node", "");
  if (!nodes || nodes->empty())
    reader.fail(root.source(), "no [[node]] tables: a cluster needs at least one node");
  for (size_t i = 0; i < nodes->size(); ++i)
    addNodes(reader, parsed, reader.tableAt(*nodes->get(i), "node[" + std::to_string(i) + "]"),
             static_cast<int>(i), inter, nics, cluster);
  return cluster;
}

Cluster loadClusterFile(const std::string& path) {
  return parseClusterToml(readInputFile(path, "cluster file"), path);
}

}  // namespace chorus::plan
