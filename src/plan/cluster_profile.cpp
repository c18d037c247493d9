#include "plan/cluster_profile.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace lattice::plan {
namespace {

using nlohmann::json;

// Reads an optional number at `key` of `object` into `field`, naming the key on a type error.
void read_number(const json& object, const char* key, double& field, const std::string& where) {
  if (!object.contains(key)) return;
  if (!object[key].is_number()) {
    LATTICE_THROW(ConfigError, "{}: '{}' must be a number", where, key);
  }
  field = object[key].get<double>();
}

// The integer `value` at `key`: a JSON integer, or a float with an integral value (8.0). Never
// a cast of 3e11 into an int (undefined behaviour) or of 2.5 into 2.
int64_t to_integer(const json& value, const char* key, const std::string& where) {
  // Not a number ("8"): nlohmann's type_error, reported as "a field has the wrong type".
  if (!value.is_number()) return value.get<int64_t>();
  if (value.is_number_integer() &&
      !(value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX))) {
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::trunc(d) == d && d >= -0x1p63 && d < 0x1p63) return int64_t(d);
  }
  LATTICE_THROW(ConfigError,
                "{}: '{}' is {}, expected an integer (at most {}) ---> HINT: write it as a "
                "whole number, as `lattice bench calibrate` does",
                where, key, value.dump(), INT64_MAX);
}

void read_string(const json& object, const char* key, std::string& field) {
  if (object.contains(key) && object[key].is_string()) field = object[key].get<std::string>();
}

const json& member(const json& object, const char* key, const std::string& origin) {
  if (!object.contains(key)) {
    LATTICE_THROW(ConfigError,
                  "{}: missing key '{}' ---> HINT: give it, or name a preset in "
                  "\"base\"",
                  origin, key);
  }
  return object[key];
}

void read_link(const json& j, LinkSpec& link, const std::string& where) {
  read_string(j, "name", link.name);
  read_number(j, "peak_bytes_per_s", link.peak_bytes_per_s, where);
  read_number(j, "achievable", link.achievable, where);
  read_number(j, "alpha_s", link.alpha_s, where);
  read_number(j, "half_bandwidth_bytes", link.half_bandwidth_bytes, where);
}

Transport parse_transport(const std::string& s, const std::string& origin) {
  if (s == "intra_node") return Transport::kIntraNode;
  if (s == "inter_node") return Transport::kInterNode;
  LATTICE_THROW(ConfigError, "{}: transport '{}' ---> HINT: use intra_node or inter_node", origin,
                s);
}

CollectiveOp parse_op(const std::string& s, const std::string& origin) {
  for (CollectiveOp op :
       {CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
        CollectiveOp::kSendRecv, CollectiveOp::kAllToAll}) {
    if (s == collective_name(op)) return op;
  }
  LATTICE_THROW(ConfigError,
                "{}: collective op '{}' ---> HINT: use all_reduce, all_gather, "
                "reduce_scatter, send_recv or all_to_all",
                origin, s);
}

void check_complete(const ClusterSpec& c, const std::string& origin) {
  auto require = [&](bool ok, const char* key) {
    if (!ok) {
      LATTICE_THROW(ConfigError,
                    "{}: '{}' is missing or not positive ---> HINT: give it, or "
                    "name a preset in \"base\"",
                    origin, key);
    }
  };
  require(c.gpus_per_node > 0, "gpus_per_node");
  require(c.device.memory_bytes > 0, "device.memory_bytes");
  require(c.device.hbm_bytes_per_s > 0, "device.hbm_bytes_per_s");
  require(c.device.peak_flops_bf16 > 0 || c.device.peak_flops_fp32 > 0, "device.peak_flops");
  require(c.intra_node.peak_bytes_per_s > 0, "links.intra_node.peak_bytes_per_s");
  require(c.inter_node.peak_bytes_per_s > 0, "links.inter_node.peak_bytes_per_s");
  const PowerSpec& w = c.power;
  if (w.busy_watts < 0 || w.waiting_watts < 0 || w.node_other_watts < 0 || w.pue < 1 ||
      c.price.per_device_hour < 0 || c.price.per_kwh < 0) {
    LATTICE_THROW(ConfigError,
                  "{}: power watts and prices must not be negative, and power.pue is at least 1 "
                  "---> HINT: e.g. \"power\": {{\"busy_watts\": 700, \"pue\": 1.2}}",
                  origin);
  }
  for (const GemmPoint& g : c.gemm) {
    require(g.m > 0 && g.n > 0 && g.k > 0 && g.efficiency > 0, "gemm[].m/n/k/efficiency");
  }
  for (const CollectivePoint& p : c.collectives) {
    require(p.group_size > 1 && p.bus_bytes_per_s > 0, "collectives[].group_size/bus_bytes_per_s");
  }
}

}  // namespace

namespace {

ClusterSpec parse_profile_fields(const std::string& json_text, const std::string& origin) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    LATTICE_THROW(ConfigError,
                  "{}: not a JSON object ---> HINT: write it with `lattice bench "
                  "calibrate`",
                  origin);
  }
  if (j.value("format", std::string()) != kClusterProfileFormat) {
    LATTICE_THROW(ConfigError,
                  "{}: \"format\" is not \"{}\" ---> HINT: this is not a cluster "
                  "profile",
                  origin, kClusterProfileFormat);
  }
  const int64_t version = j.contains("version") ? to_integer(j["version"], "version", origin) : 0;
  if (version != kClusterProfileVersion) {
    LATTICE_THROW(ConfigError,
                  "{}: profile version {} is not supported (this build reads {}) "
                  "---> HINT: recalibrate with this build",
                  origin, version, kClusterProfileVersion);
  }
  ClusterSpec c;
  if (j.contains("base")) {
    c = cluster_preset(member(j, "base", origin).get<std::string>());
    c.name.clear();  // the profile's own name, or its file's
    c.gemm.clear();
    c.collectives.clear();
  } else {
    c.gpus_per_node = 0;
    c.device = {};
    c.intra_node = c.inter_node = {};
  }
  read_string(j, "name", c.name);
  if (j.contains("gpus_per_node")) {
    c.gpus_per_node = to_integer(j["gpus_per_node"], "gpus_per_node", origin);
  }
  if (j.contains("device")) {
    const json& d = j["device"];
    read_string(d, "name", c.device.name);
    read_number(d, "memory_bytes", c.device.memory_bytes, origin);
    read_number(d, "reserved_bytes", c.device.reserved_bytes, origin);
    read_number(d, "hbm_bytes_per_s", c.device.hbm_bytes_per_s, origin);
    read_number(d, "max_gemm_efficiency", c.device.max_gemm_efficiency, origin);
    read_number(d, "gemm_half_dim", c.device.gemm_half_dim, origin);
    if (d.contains("peak_flops")) {
      read_number(d["peak_flops"], "bf16", c.device.peak_flops_bf16, origin);
      read_number(d["peak_flops"], "fp32", c.device.peak_flops_fp32, origin);
    }
  }
  if (j.contains("power")) {
    const json& p = j["power"];
    read_number(p, "busy_watts", c.power.busy_watts, origin);
    read_number(p, "waiting_watts", c.power.waiting_watts, origin);
    read_number(p, "node_other_watts", c.power.node_other_watts, origin);
    read_number(p, "pue", c.power.pue, origin);
  }
  if (j.contains("price")) {
    read_number(j["price"], "per_device_hour", c.price.per_device_hour, origin);
    read_number(j["price"], "per_kwh", c.price.per_kwh, origin);
  }
  if (j.contains("links")) {
    if (j["links"].contains("intra_node"))
      read_link(j["links"]["intra_node"], c.intra_node, origin);
    if (j["links"].contains("inter_node"))
      read_link(j["links"]["inter_node"], c.inter_node, origin);
  }
  try {
    for (const json& g : j.value("gemm", json::array())) {
      c.gemm.push_back({.precision = parse_precision(g.at("precision").get<std::string>()),
                        .m = to_integer(g.at("m"), "gemm[].m", origin),
                        .n = to_integer(g.at("n"), "gemm[].n", origin),
                        .k = to_integer(g.at("k"), "gemm[].k", origin),
                        .efficiency = g.at("efficiency").get<double>()});
    }
    for (const json& p : j.value("collectives", json::array())) {
      c.collectives.push_back(
          {.transport = parse_transport(p.at("transport").get<std::string>(), origin),
           .op = parse_op(p.at("op").get<std::string>(), origin),
           .group_size = to_integer(p.at("group_size"), "collectives[].group_size", origin),
           .alpha_s = p.at("alpha_s").get<double>(),
           .bus_bytes_per_s = p.at("bus_bytes_per_s").get<double>()});
    }
  } catch (const json::exception& e) {
    LATTICE_THROW(ConfigError,
                  "{}: malformed gemm or collectives entry: {} ---> HINT: each entry "
                  "needs every key listed in docs/planner.md",
                  origin, e.what());
  }
  if (j.contains("runtime")) {
    read_number(j["runtime"], "dp_overlap", c.runtime.dp_overlap, origin);
    read_number(j["runtime"], "fragmentation", c.runtime.fragmentation, origin);
    read_number(j["runtime"], "dp_bucket_bytes", c.runtime.dp_bucket_bytes, origin);
    read_number(j["runtime"], "layer_overhead_s", c.runtime.layer_overhead_s, origin);
    read_number(j["runtime"], "compute_efficiency", c.runtime.compute_efficiency, origin);
    read_string(j["runtime"], "software", c.runtime.software);
    read_string(j["runtime"], "compute_efficiency_from", c.runtime.compute_efficiency_from);
    if (j["runtime"].contains("zero2_regathers_per_micro_batch")) {
      c.runtime.zero2_regathers_per_micro_batch =
          j["runtime"]["zero2_regathers_per_micro_batch"].get<bool>();
    }
    if (!(c.runtime.compute_efficiency > 0 && c.runtime.compute_efficiency <= 1) ||
        c.runtime.layer_overhead_s < 0 || c.runtime.dp_overlap < 0 || c.runtime.dp_overlap > 1) {
      LATTICE_THROW(ConfigError,
                    "{}: runtime factors out of range (compute_efficiency in (0, 1], dp_overlap "
                    "in [0, 1], layer_overhead_s ≥ 0) ---> HINT: fix the profile's \"runtime\" "
                    "section",
                    origin);
    }
  }
  if (c.name.empty()) c.name = std::filesystem::path(origin).stem().string();
  check_complete(c, origin);
  return c;
}

}  // namespace

ClusterSpec parse_cluster_profile(const std::string& json_text, const std::string& origin) {
  try {
    return parse_profile_fields(json_text, origin);
  } catch (const json::exception& e) {
    // A field of the wrong type ("gpus_per_node": "8"): named, not an unexpected error.
    LATTICE_THROW(ConfigError,
                  "{}: a field has the wrong type or is missing: {} ---> HINT: compare it with a "
                  "profile written by `lattice bench calibrate` (docs/planner.md lists the keys "
                  "and their types)",
                  origin, e.what());
  }
}

ClusterSpec load_cluster_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    LATTICE_THROW(IoError,
                  "cannot read cluster profile '{}' ---> HINT: check the path or use a "
                  "preset name",
                  path);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_cluster_profile(buffer.str(), path);
}

std::string write_cluster_profile(const ClusterSpec& c) {
  auto link = [](const LinkSpec& l) {
    return json{{"name", l.name},
                {"peak_bytes_per_s", l.peak_bytes_per_s},
                {"achievable", l.achievable},
                {"alpha_s", l.alpha_s},
                {"half_bandwidth_bytes", l.half_bandwidth_bytes}};
  };
  json gemm = json::array(), collectives = json::array();
  for (const GemmPoint& g : c.gemm) {
    gemm.push_back({{"precision", precision_name(g.precision)},
                    {"m", g.m},
                    {"n", g.n},
                    {"k", g.k},
                    {"efficiency", g.efficiency}});
  }
  for (const CollectivePoint& p : c.collectives) {
    collectives.push_back({{"transport", transport_name(p.transport)},
                           {"op", collective_name(p.op)},
                           {"group_size", p.group_size},
                           {"alpha_s", p.alpha_s},
                           {"bus_bytes_per_s", p.bus_bytes_per_s}});
  }
  json j = {
      {"format", kClusterProfileFormat},
      {"version", kClusterProfileVersion},
      {"name", c.name},
      {"gpus_per_node", c.gpus_per_node},
      {"device",
       {{"name", c.device.name},
        {"memory_bytes", c.device.memory_bytes},
        {"reserved_bytes", c.device.reserved_bytes},
        {"hbm_bytes_per_s", c.device.hbm_bytes_per_s},
        {"peak_flops", {{"bf16", c.device.peak_flops_bf16}, {"fp32", c.device.peak_flops_fp32}}},
        {"max_gemm_efficiency", c.device.max_gemm_efficiency},
        {"gemm_half_dim", c.device.gemm_half_dim}}},
      {"links", {{"intra_node", link(c.intra_node)}, {"inter_node", link(c.inter_node)}}},
      {"power",
       {{"busy_watts", c.power.busy_watts},
        {"waiting_watts", c.power.waiting_watts},
        {"node_other_watts", c.power.node_other_watts},
        {"pue", c.power.pue}}},
      {"price", {{"per_device_hour", c.price.per_device_hour}, {"per_kwh", c.price.per_kwh}}},
      {"gemm", gemm},
      {"collectives", collectives},
      {"runtime",
       {{"dp_overlap", c.runtime.dp_overlap},
        {"fragmentation", c.runtime.fragmentation},
        {"dp_bucket_bytes", c.runtime.dp_bucket_bytes},
        {"layer_overhead_s", c.runtime.layer_overhead_s},
        {"compute_efficiency", c.runtime.compute_efficiency},
        {"compute_efficiency_from", c.runtime.compute_efficiency_from},
        {"zero2_regathers_per_micro_batch", c.runtime.zero2_regathers_per_micro_batch},
        {"software", c.runtime.software}}},
  };
  return j.dump(2) + "\n";
}

void save_cluster_profile(const ClusterSpec& cluster, const std::string& path) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    if (!out) LATTICE_THROW(IoError, "cannot write cluster profile '{}'", temporary);
    out << write_cluster_profile(cluster);
    if (!out.flush()) LATTICE_THROW(IoError, "cannot write cluster profile '{}'", temporary);
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    LATTICE_THROW(IoError, "cannot move cluster profile into place at '{}': {}", path,
                  error.message());
  }
}

}  // namespace lattice::plan
