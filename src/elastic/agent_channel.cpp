#include "elastic/agent_channel.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace lattice {
namespace {

using nlohmann::json;

json to_json(const ProcessReport& p) {
  return {{"id", p.id},
          {"pid", p.pid},
          {"exited", p.exited},
          {"signal", p.signal},
          {"exit_code", p.exit_code},
          {"generation", p.generation},
          {"step", p.step},
          {"phase", int(p.phase)},
          {"group", p.collective_group},
          {"seq", p.collective_seq},
          {"compute_ns", p.last_step_compute_ns},
          {"longest_gap_ns", p.longest_progress_gap_ns},
          {"heartbeat_age_s", p.heartbeat_age_s},
          {"progress_age_s", p.progress_age_s},
          {"error", p.error}};
}

ProcessReport process_from_json(const json& j) {
  ProcessReport p;
  p.id = j.at("id");
  p.pid = j.at("pid");
  p.exited = j.at("exited");
  p.signal = j.at("signal");
  p.exit_code = j.at("exit_code");
  p.generation = j.at("generation");
  p.step = j.at("step");
  p.phase = Phase(j.at("phase").get<int>());
  p.collective_group = j.at("group");
  p.collective_seq = j.at("seq");
  p.last_step_compute_ns = j.at("compute_ns");
  p.longest_progress_gap_ns = j.at("longest_gap_ns");
  p.heartbeat_age_s = j.at("heartbeat_age_s");
  p.progress_age_s = j.at("progress_age_s");
  p.error = j.at("error");
  return p;
}

std::string report_key(int node) {
  return fmt::format("agent/{}/report", node);
}
std::string order_key(int node, int64_t n) {
  return fmt::format("agent/{}/order/{}", node, n);
}

}  // namespace

AgentChannel::AgentChannel(std::unique_ptr<RedisStore> store, int node)
    : store_(std::move(store)), node_(node) {}

void AgentChannel::hello(const std::string& host) {
  store_->put(fmt::format("agent/{}/hello", node_), host);
}

std::optional<std::string> AgentChannel::hello_of(int node) {
  return store_->try_get(fmt::format("agent/{}/hello", node));
}

void AgentChannel::publish(const NodeReport& report) {
  json processes = json::array();
  for (const ProcessReport& p : report.processes) processes.push_back(to_json(p));
  store_->put(report_key(node_),
              json{{"seq", report.seq}, {"host", report.host}, {"processes", processes}}.dump());
}

std::optional<NodeReport> AgentChannel::report_of(int node) {
  const std::optional<std::string> text = store_->try_get(report_key(node));
  if (!text) return std::nullopt;
  const json j = json::parse(*text);
  NodeReport report;
  report.seq = j.at("seq");
  report.host = j.at("host");
  for (const json& p : j.at("processes")) report.processes.push_back(process_from_json(p));
  return report;
}

void AgentChannel::order(int node, const AgentOrder& order) {
  if (sent_.size() <= size_t(node)) sent_.resize(size_t(node) + 1, 0);
  const json j = {{"kind", int(order.kind)},
                  {"process", order.process},
                  {"generation", order.assignment.generation},
                  {"rank", order.assignment.rank},
                  {"world", order.assignment.world},
                  {"refit", order.assignment.refit},
                  {"exit_code", order.exit_code}};
  store_->put(order_key(node, sent_[size_t(node)]++), j.dump());
}

std::optional<AgentOrder> AgentChannel::next_order() {
  const std::optional<std::string> text = store_->try_get(order_key(node_, next_order_));
  if (!text) return std::nullopt;
  ++next_order_;
  const json j = json::parse(*text);
  AgentOrder order;
  order.kind = AgentOrder::Kind(j.at("kind").get<int>());
  order.process = j.at("process");
  order.assignment.generation = j.at("generation");
  order.assignment.rank = j.at("rank");
  order.assignment.world = j.at("world");
  order.assignment.refit = j.at("refit");
  order.exit_code = j.at("exit_code");
  return order;
}

void AgentChannel::end() {
  store_->put(fmt::format("agent/{}/ended", node_), "1");
}

bool AgentChannel::has_ended(int node) {
  return store_->try_get(fmt::format("agent/{}/ended", node)).has_value();
}

void AgentChannel::beat() {
  store_->put("agent0/beat", std::to_string(++beat_));
}

std::optional<int64_t> AgentChannel::agent0_beat() {
  const std::optional<std::string> text = store_->try_get("agent0/beat");
  if (!text) return std::nullopt;
  return std::stoll(*text);
}

}  // namespace lattice
