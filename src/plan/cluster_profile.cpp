#include "plan/cluster_profile.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/json_field.h"

namespace lattice::plan {
namespace {

using nlohmann::json;

// Reads the optional number `key` of `object` into `field`.
void read_number(const JsonField& object, const char* key, double& field) {
  field = object.number_or(key, field);
}

void read_link(const JsonField& j, LinkSpec& link) {
  link.name = j.string_or("name", link.name);
  read_number(j, "peak_bytes_per_s", link.peak_bytes_per_s);
  read_number(j, "achievable", link.achievable);
  read_number(j, "alpha_s", link.alpha_s);
  read_number(j, "half_bandwidth_bytes", link.half_bandwidth_bytes);
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

constexpr const char* kProfileHint =
    "compare it with a profile written by `lattice bench calibrate` (docs/planner.md lists the "
    "keys and their types)";

ClusterSpec parse_profile_fields(const json& document, const std::string& origin) {
  const JsonField j(document, origin, kProfileHint);
  if (j.string_or("format", "") != kClusterProfileFormat) {
    LATTICE_THROW(ConfigError,
                  "{}: \"format\" is not \"{}\" ---> HINT: this is not a cluster "
                  "profile",
                  origin, kClusterProfileFormat);
  }
  const int64_t version = j.integer_or("version", 0);
  if (version != kClusterProfileVersion) {
    LATTICE_THROW(ConfigError,
                  "{}: profile version {} is not supported (this build reads {}) "
                  "---> HINT: recalibrate with this build",
                  origin, version, kClusterProfileVersion);
  }
  ClusterSpec c;
  if (std::optional<JsonField> base = j.find("base")) {
    c = cluster_preset(base->string());
    c.name.clear();  // the profile's own name, or its file's
    c.gemm.clear();
    c.collectives.clear();
  } else {
    c.gpus_per_node = 0;
    c.device = {};
    c.intra_node = c.inter_node = {};
  }
  c.name = j.string_or("name", c.name);
  c.gpus_per_node = j.integer_or("gpus_per_node", c.gpus_per_node);
  if (std::optional<JsonField> d = j.find("device")) {
    c.device.name = d->string_or("name", c.device.name);
    read_number(*d, "memory_bytes", c.device.memory_bytes);
    read_number(*d, "reserved_bytes", c.device.reserved_bytes);
    read_number(*d, "hbm_bytes_per_s", c.device.hbm_bytes_per_s);
    read_number(*d, "max_gemm_efficiency", c.device.max_gemm_efficiency);
    read_number(*d, "gemm_half_dim", c.device.gemm_half_dim);
    if (std::optional<JsonField> peak = d->find("peak_flops")) {
      read_number(*peak, "bf16", c.device.peak_flops_bf16);
      read_number(*peak, "fp32", c.device.peak_flops_fp32);
    }
  }
  if (std::optional<JsonField> p = j.find("power")) {
    read_number(*p, "busy_watts", c.power.busy_watts);
    read_number(*p, "waiting_watts", c.power.waiting_watts);
    read_number(*p, "node_other_watts", c.power.node_other_watts);
    read_number(*p, "pue", c.power.pue);
  }
  if (std::optional<JsonField> price = j.find("price")) {
    read_number(*price, "per_device_hour", c.price.per_device_hour);
    read_number(*price, "per_kwh", c.price.per_kwh);
  }
  if (std::optional<JsonField> links = j.find("links")) {
    if (std::optional<JsonField> intra = links->find("intra_node")) read_link(*intra, c.intra_node);
    if (std::optional<JsonField> inter = links->find("inter_node")) read_link(*inter, c.inter_node);
  }
  if (std::optional<JsonField> gemm = j.find("gemm")) {
    for (const JsonField& g : gemm->elements()) {
      c.gemm.push_back({.precision = parse_precision(g["precision"].string()),
                        .m = g["m"].integer(),
                        .n = g["n"].integer(),
                        .k = g["k"].integer(),
                        .efficiency = g["efficiency"].number()});
    }
  }
  if (std::optional<JsonField> collectives = j.find("collectives")) {
    for (const JsonField& p : collectives->elements()) {
      c.collectives.push_back({.transport = parse_transport(p["transport"].string(), origin),
                               .op = parse_op(p["op"].string(), origin),
                               .group_size = p["group_size"].integer(),
                               .alpha_s = p["alpha_s"].number(),
                               .bus_bytes_per_s = p["bus_bytes_per_s"].number()});
    }
  }
  if (std::optional<JsonField> r = j.find("runtime")) {
    read_number(*r, "dp_overlap", c.runtime.dp_overlap);
    read_number(*r, "fragmentation", c.runtime.fragmentation);
    read_number(*r, "dp_bucket_bytes", c.runtime.dp_bucket_bytes);
    read_number(*r, "layer_overhead_s", c.runtime.layer_overhead_s);
    read_number(*r, "compute_efficiency", c.runtime.compute_efficiency);
    c.runtime.software = r->string_or("software", c.runtime.software);
    c.runtime.compute_efficiency_from =
        r->string_or("compute_efficiency_from", c.runtime.compute_efficiency_from);
    c.runtime.zero2_regathers_per_micro_batch =
        r->boolean_or("zero2_regathers_per_micro_batch", c.runtime.zero2_regathers_per_micro_batch);
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
  const json document = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded() || !document.is_object()) {
    LATTICE_THROW(ConfigError,
                  "{}: not a JSON object ---> HINT: write it with `lattice bench "
                  "calibrate`",
                  origin);
  }
  return parse_profile_fields(document, origin);
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
