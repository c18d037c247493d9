#include "plan/plan_report.h"

#include <fmt/format.h>

#include <cmath>

#include "plan/model_spec.h"

namespace lattice::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
  return fmt::format("{:8.2f} GiB", bytes / kGiB);
}
std::string secs(double s) {
  return s >= 1.0 ? fmt::format("{:9.3f} s ", s) : fmt::format("{:9.2f} ms", s * 1e3);
}

std::string one_line(const Evaluation& e) {
  return fmt::format("step {}  {:>10.0f} tokens/s  MFU {:5.1f}%  memory {}", secs(e.time.step),
                     e.time.tokens_per_second, e.time.mfu * 100.0, gib(e.memory.total));
}

}  // namespace

std::string format_software(const RuntimeFactors& r) {
  return fmt::format(
      "software profile {}: gradient reduction hidden behind up to {:.0f}% of the backward "
      "({:.0f} MiB buckets), {:.0f} µs fixed per layer and micro-batch, GEMMs at {:.0f}% of "
      "the device curve{}",
      r.software.empty() ? std::string("(not named)") : "'" + r.software + "'",
      r.dp_overlap * 100.0, r.dp_bucket_bytes / (1024.0 * 1024.0), r.layer_overhead_s * 1e6,
      r.compute_efficiency * 100.0,
      r.compute_efficiency_from.empty() ? std::string()
                                        : " (measured on " + r.compute_efficiency_from + ")");
}

std::string format_memory(const MemoryBreakdown& m) {
  std::string out = fmt::format("  memory per rank (pipeline stage {}): {} of {} usable\n", m.stage,
                                gib(m.total), gib(m.capacity));
  auto row = [&](const char* name, double bytes, std::string note = {}) {
    out += fmt::format("    {:<24}{}{}\n", name, gib(bytes), note.empty() ? "" : "  " + note);
  };
  row("parameters", m.parameters,
      fmt::format("({:.1f} M on this tp shard)", m.parameter_count / 1e6));
  row("gradients", m.gradients);
  row("optimizer states", m.optimizer_states);
  row("activations", m.activations);
  if (m.recompute_working > 0) row("recompute working set", m.recompute_working);
  row("embedding inputs", m.embedding_activations);
  row("logits and loss", m.logits);
  row("communication buffers", m.communication_buffers);
  if (m.zero3_gathered > 0) row("zero-3 gathered layers", m.zero3_gathered);
  row("fragmentation allowance", m.fragmentation);
  return out;
}

std::string format_time(const TimeBreakdown& t) {
  std::string out = fmt::format("  time per step: {}  {:.0f} tokens/s  MFU {:.1f}%  HFU {:.1f}%\n",
                                secs(t.step), t.tokens_per_second, t.mfu * 100.0, t.hfu * 100.0);
  auto row = [&](const char* name, double s, std::string note = {}) {
    out += fmt::format("    {:<24}{}{}\n", name, secs(s), note.empty() ? "" : "  " + note);
  };
  row("forward", t.forward);
  row("backward", t.backward);
  row("recompute", t.recompute);
  row("tp collectives", t.tp_communication, std::string(transport_name(t.tp_link)));
  if (t.cp_communication > 0)
    row("cp ring (exposed)", t.cp_communication, std::string(transport_name(t.cp_link)));
  if (t.ep_communication > 0)
    row("expert all-to-alls", t.ep_communication, std::string(transport_name(t.ep_link)));
  row("pipeline sends", t.pp_communication, std::string(transport_name(t.pp_link)));
  row("pipeline bubble", t.bubble, fmt::format("{:.1f}% of compute", t.bubble_ratio * 100.0));
  row("dp traffic (exposed)", t.dp_communication,
      fmt::format("of {} total, {}", secs(t.dp_communication_total), transport_name(t.dp_link)));
  row("optimizer step", t.optimizer);
  return out;
}

std::string format_cost(const PlanOutcome& o, const TimeBreakdown& t) {
  const TrainingSetup& s = o.setup;
  const PowerSpec& w = s.cluster.power;
  const RunCost c = estimate_run_cost(s, t);
  std::string out = fmt::format(
      "  energy per step: {:.4g} kWh, {:.4g} kWh per million tokens (devices busy {:.0f}% of the "
      "step at {:.0f} W, waiting at {:.0f} W; {:.0f} W per node besides; PUE {:.2f})\n",
      c.joules_per_step / 3.6e6, c.kwh_per_million_tokens, c.busy_fraction * 100, w.busy_watts,
      w.waiting_watts, w.node_other_watts, w.pue);
  const PriceSpec& p = s.cluster.price;
  const bool priced = p.per_device_hour > 0 || p.per_kwh > 0;
  if (priced) {
    out += fmt::format(
        "  cost: {:.4g} per step, {:.4g} per million tokens ({:.4g} per device-hour, {:.4g} per "
        "kWh)\n",
        c.money_per_step, c.money_per_million_tokens, p.per_device_hour, p.per_kwh);
  }
  if (o.token_budget > 0 && c.tokens_per_step > 0) {
    const double steps = o.token_budget / c.tokens_per_step;
    const double hours = steps * t.step / 3600.0;
    out += fmt::format("  for {:.3g} tokens: {:.0f} steps, {:.1f} days on {} devices, {:.4g} MWh",
                       o.token_budget, std::ceil(steps), hours / 24, s.devices,
                       steps * c.joules_per_step / 3.6e9);
    if (priced) out += fmt::format(", {:.4g} in money", steps * c.money_per_step);
    out += "\n";
  }
  return out;
}

std::string format_report(const PlanOutcome& o) {
  const TrainingSetup& s = o.setup;
  const ParameterCounts counts = count_parameters(s.model);
  const std::string sparse =
      s.model.moe()
          ? fmt::format(", {:.2f} B active a token: {} experts a layer, {} a token",
                        double(counts.active) / 1e9, s.model.n_experts, s.model.experts_per_token)
          : "";
  std::string out = fmt::format(
      "model {} ({:.2f} B parameters{}, {} layers, h {}), cluster {} ({} devices of {}, {} per "
      "node)\nglobal batch {} sequences × {} tokens, {}\n",
      s.model.name, double(counts.total) / 1e9, sparse, s.model.n_layers, s.model.d_model,
      s.cluster.name, s.devices, s.cluster.device.name, s.cluster.gpus_per_node, s.global_batch,
      s.seq_len, precision_name(s.precision));
  out += format_software(s.cluster.runtime) + "\n";
  if (s.memory_headroom > 0) {
    out += fmt::format(
        "memory headroom {:.0f}%: a layout fits within {} of the {} usable per device\n",
        s.memory_headroom * 100, gib(s.memory_capacity()), gib(s.cluster.usable_memory_bytes()));
  }
  const SearchResult& r = o.search;
  out += fmt::format("evaluated {} layouts in {:.3f} s: {} fit", r.evaluated, o.search_seconds,
                     r.feasible);
  for (RejectReason reason :
       {RejectReason::kDeviceCount, RejectReason::kDivisibility, RejectReason::kBatch,
        RejectReason::kSchedule, RejectReason::kMemory}) {
    if (int64_t n = r.rejected[size_t(reason)]) {
      out += fmt::format(", {} rejected for {}", n, reject_reason_name(reason));
    }
  }
  out += "\n\n";
  if (r.ranked.empty()) {
    out += "no layout fits.\n";
    if (r.closest_to_fitting) {
      out += fmt::format("closest: {}\n  {}\n", describe(r.closest_to_fitting->layout),
                         r.closest_to_fitting->rejection->message);
      out += format_memory(r.closest_to_fitting->memory);
    } else if (r.first_rejected) {
      out += fmt::format("{}: rejected for {}: {}\n", describe(r.first_rejected->layout),
                         reject_reason_name(r.first_rejected->rejection->reason),
                         r.first_rejected->rejection->message);
    }
    return out;
  }
  const Evaluation& best = r.ranked.front();
  if (o.deadline_hours > 0) {
    out += fmt::format(
        "deadline {:.1f} days for {:.3g} tokens: the best by {} that meets it uses {} of the {} "
        "devices given\n",
        o.deadline_hours / 24, o.token_budget, objective_name(o.objective), s.devices,
        o.devices_given);
  } else if (o.objective != Objective::kTime) {
    out += fmt::format("ranked by {} per token\n", objective_name(o.objective));
  }
  out += fmt::format("recommended: {}\n", describe(best.layout));
  if (s.model.moe()) {
    const Layout& l = best.layout;
    out += fmt::format(
        "  experts: {} of each layer's {} on a rank{}; expert gradients summed over {} rank(s)\n",
        s.model.n_experts / l.ep, s.model.n_experts,
        l.ep > 1 ? fmt::format(" (ep {}: tokens dispatched and combined by all-to-all, {})", l.ep,
                               transport_name(best.time.ep_link))
                 : " (ep 1: no all-to-all)",
        l.expert_replicas());
  }
  out += format_memory(best.memory);
  out += format_time(best.time);
  out += format_cost(o, best.time);
  if (r.ranked.size() > 1) {
    out += "\nnext best:\n";
    for (size_t i = 1; i < r.ranked.size(); ++i) {
      out += fmt::format("  #{} {}\n     {}\n", i + 1, describe(r.ranked[i].layout),
                         one_line(r.ranked[i]));
    }
  }
  if (!o.alternatives.empty()) {
    out += "\nwhy not:\n";
    for (const Alternative& a : o.alternatives) {
      out += fmt::format("  {:<24}{}\n", a.change, a.verdict);
    }
  }
  return out;
}

nlohmann::json to_json(const Layout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"virtual_stages", l.virtual_stages},
          {"zero", l.zero},
          {"micro_batch", l.micro_batch},
          {"recompute", recompute_name(l.recompute)},
          {"sequence_parallel", l.sequence_parallel},
          {"schedule", schedule_kind_name(l.schedule)},
          {"cp", l.cp},
          {"ep", l.ep}};
}

nlohmann::json to_json(const MemoryBreakdown& m) {
  return {{"stage", m.stage},
          {"parameter_count", m.parameter_count},
          {"parameters_bytes", m.parameters},
          {"gradients_bytes", m.gradients},
          {"optimizer_states_bytes", m.optimizer_states},
          {"activations_bytes", m.activations},
          {"recompute_working_bytes", m.recompute_working},
          {"embedding_activations_bytes", m.embedding_activations},
          {"logits_bytes", m.logits},
          {"communication_buffers_bytes", m.communication_buffers},
          {"zero3_gathered_bytes", m.zero3_gathered},
          {"fragmentation_bytes", m.fragmentation},
          {"total_bytes", m.total},
          {"capacity_bytes", m.capacity}};
}

nlohmann::json to_json(const TimeBreakdown& t) {
  return {{"step_s", t.step},
          {"forward_s", t.forward},
          {"backward_s", t.backward},
          {"recompute_s", t.recompute},
          {"tp_communication_s", t.tp_communication},
          {"pp_communication_s", t.pp_communication},
          {"cp_communication_s", t.cp_communication},
          {"ep_communication_s", t.ep_communication},
          {"bubble_s", t.bubble},
          {"bubble_ratio", t.bubble_ratio},
          {"dp_communication_exposed_s", t.dp_communication},
          {"dp_communication_total_s", t.dp_communication_total},
          {"optimizer_s", t.optimizer},
          {"tp_link", transport_name(t.tp_link)},
          {"dp_link", transport_name(t.dp_link)},
          {"pp_link", transport_name(t.pp_link)},
          {"model_flops", t.model_flops},
          {"hardware_flops", t.hardware_flops},
          {"mfu", t.mfu},
          {"hfu", t.hfu},
          {"tokens_per_second", t.tokens_per_second}};
}

nlohmann::json to_json(const Evaluation& e) {
  nlohmann::json j = {{"layout", to_json(e.layout)}, {"feasible", e.feasible()}};
  if (e.rejection) {
    j["rejection"] = {{"reason", reject_reason_name(e.rejection->reason)},
                      {"message", e.rejection->message}};
  }
  if (!e.rejection || e.rejection->reason == RejectReason::kMemory) {
    j["memory"] = to_json(e.memory);
    j["time"] = to_json(e.time);
  }
  return j;
}

nlohmann::json to_json(const PlanOutcome& o) {
  const TrainingSetup& s = o.setup;
  nlohmann::json rejected = nlohmann::json::object();
  for (RejectReason reason :
       {RejectReason::kDeviceCount, RejectReason::kDivisibility, RejectReason::kBatch,
        RejectReason::kSchedule, RejectReason::kMemory}) {
    rejected[std::string(reject_reason_name(reason))] = o.search.rejected[size_t(reason)];
  }
  nlohmann::json ranked = nlohmann::json::array();
  for (const Evaluation& e : o.search.ranked) ranked.push_back(to_json(e));
  nlohmann::json alternatives = nlohmann::json::array();
  for (const Alternative& a : o.alternatives) {
    alternatives.push_back({{"change", a.change},
                            {"verdict", a.verdict},
                            {"slowdown", a.slowdown},
                            {"evaluation", to_json(a.evaluation)}});
  }
  nlohmann::json j = {
      {"model", {{"name", s.model.name}, {"parameters", count_parameters(s.model).total}}},
      {"cluster",
       {{"name", s.cluster.name},
        {"devices", s.devices},
        {"gpus_per_node", s.cluster.gpus_per_node},
        {"software",
         {{"name", s.cluster.runtime.software},
          {"dp_overlap", s.cluster.runtime.dp_overlap},
          {"dp_bucket_bytes", s.cluster.runtime.dp_bucket_bytes},
          {"layer_overhead_s", s.cluster.runtime.layer_overhead_s},
          {"compute_efficiency", s.cluster.runtime.compute_efficiency},
          {"compute_efficiency_from", s.cluster.runtime.compute_efficiency_from}}}}},
      {"global_batch", s.global_batch},
      {"seq_len", s.seq_len},
      {"precision", precision_name(s.precision)},
      {"search",
       {{"evaluated", o.search.evaluated},
        {"feasible", o.search.feasible},
        {"rejected", rejected},
        {"seconds", o.search_seconds}}},
      {"ranked", ranked},
      {"alternatives", alternatives},
  };
  j["objective"] = objective_name(o.objective);
  if (!o.search.ranked.empty()) {
    const RunCost c = estimate_run_cost(s, o.search.ranked.front().time);
    j["cost"] = {{"busy_fraction", c.busy_fraction},
                 {"kwh_per_step", c.joules_per_step / 3.6e6},
                 {"kwh_per_million_tokens", c.kwh_per_million_tokens},
                 {"money_per_step", c.money_per_step},
                 {"money_per_million_tokens", c.money_per_million_tokens}};
    if (o.token_budget > 0 && c.tokens_per_step > 0) {
      const double steps = o.token_budget / c.tokens_per_step;
      j["budget"] = {{"tokens", o.token_budget},
                     {"hours", steps * o.search.ranked.front().time.step / 3600.0},
                     {"mwh", steps * c.joules_per_step / 3.6e9},
                     {"money", steps * c.money_per_step}};
    }
  }
  if (o.deadline_hours > 0) {
    j["deadline_hours"] = o.deadline_hours;
    j["devices_given"] = o.devices_given;
  }
  if (o.search.closest_to_fitting) j["closest_to_fitting"] = to_json(*o.search.closest_to_fitting);
  if (o.search.ranked.empty() && o.search.first_rejected) {
    j["first_rejected"] = to_json(*o.search.first_rejected);
  }
  return j;
}

std::string format_published(const PublishedValidation& v) {
  std::string out =
      fmt::format("{:<30} {:>9} {:>9} {:>8}  {:>6} {:>6}  {:>9}  {}\n", "published run",
                  "published", "predicted", "error", "MFU", "pub.", "memory",
                  "layout predicted (the published dimensions "
                  "fixed, the rest searched)");
  for (const PublishedCheck& c : v.checks) {
    const double published_utilisation =
        c.run.published_mfu > 0 ? c.run.published_mfu : c.run.published_hfu;
    const std::string published_note =
        published_utilisation > 0 ? fmt::format("{:5.1f}%{}", published_utilisation * 100.0,
                                                c.run.published_mfu > 0 ? " " : "h")
                                  : std::string("     - ");
    if (!c.fits()) {
      const std::string why =
          c.search.closest_to_fitting ? c.search.closest_to_fitting->rejection->message
          : c.search.first_rejected   ? c.search.first_rejected->rejection->message
                                      : std::string("no layout");
      out += fmt::format("{:<30} {:>8.3f}s {:>9} {:>8}  {:>6} {}  REJECTED: {}\n", c.run.id,
                         c.run.step_seconds, "-", "-", "-", published_note, why);
      continue;
    }
    const Evaluation& e = c.search.ranked.front();
    const double utilisation = c.run.published_mfu > 0 ? e.time.mfu : e.time.hfu;
    const std::string error =
        c.run.calibration ? std::string("calib.") : fmt::format("{:+.1f}%", c.error() * 100.0);
    out += fmt::format("{:<30} {:>8.3f}s {:>8.3f}s {:>8}  {:5.1f}% {}  {:>5.1f} GiB  {}\n",
                       c.run.id, c.run.step_seconds, e.time.step, error, utilisation * 100.0,
                       published_note, e.memory.total / kGiB, describe(e.layout));
  }
  out += fmt::format(
      "\n{} of {} published layouts accepted as fitting; step time |error| over the {} rows not "
      "used for calibration: mean {:.1f}%, worst {:.1f}% ({})\n",
      v.accepted, v.checks.size(), v.judged, v.mean_abs_error * 100.0, v.max_abs_error * 100.0,
      v.worst);
  out +=
      "(utilisation: MFU, or 'h' where the paper reports hardware FLOPs, recompute counted;\n"
      " calib.: the row sets its software profile's GEMM efficiency, its error 0 by "
      "construction)\n";
  out += "sources:\n";
  for (const PublishedCheck& c : v.checks) {
    out += fmt::format("  {:<30} {}; step time from {}; {}\n", c.run.id, c.run.source,
                       c.run.step_time_from, format_software(c.run.setup.cluster.runtime));
  }
  return out;
}

nlohmann::json to_json(const PublishedValidation& v) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PublishedCheck& c : v.checks) {
    nlohmann::json row = {{"id", c.run.id},
                          {"source", c.run.source},
                          {"software", c.run.setup.cluster.runtime.software},
                          {"step_time_from", c.run.step_time_from},
                          {"published_step_s", c.run.step_seconds},
                          {"published_mfu", c.run.published_mfu},
                          {"published_hfu", c.run.published_hfu},
                          {"fits", c.fits()},
                          {"calibration", c.run.calibration}};
    if (c.fits()) {
      row["predicted"] = to_json(c.search.ranked.front());
      row["error"] = c.error();
    } else if (c.search.closest_to_fitting) {
      row["closest_to_fitting"] = to_json(*c.search.closest_to_fitting);
    }
    rows.push_back(std::move(row));
  }
  return {{"runs", rows},
          {"accepted", v.accepted},
          {"judged", v.judged},
          {"mean_abs_error", v.mean_abs_error},
          {"max_abs_error", v.max_abs_error},
          {"worst", v.worst}};
}

}  // namespace lattice::plan
