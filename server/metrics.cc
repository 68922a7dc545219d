#include "metrics.h"

#include <httplib.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trisolve::server {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

void Header(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

std::string Num(double v) { return absl::StrFormat("%.9g", v); }

}  // namespace

void Metrics::Histogram::Observe(double v) {
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (v <= kBuckets[i]) ++counts[i];
  ++count;
  sum += v;
}

void Metrics::Record(const CallSample& s) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{s.rpc, s.family, s.method, s.code, s.transport}];
  bytes_in_ += s.bytes_in;
  bytes_out_ += s.bytes_out;
  if (s.solved) {
    queue_[s.family].Observe(s.queue_s);
    transfer_[s.family].Observe(s.transfer_s);
    compute_[s.family].Observe(s.compute_s);
    unknowns_[s.family] += s.unknowns;
    for (int o = 0; o < 4; ++o)
      if (s.outcomes[size_t(o)] > 0) outcomes_[{s.family, o}] += s.outcomes[size_t(o)];
  }
}

void Metrics::ObserveBatch(const std::string& family, int requests, int64_t systems) {
  std::lock_guard<std::mutex> lock(mu_);
  BatchHistogram& h = batches_[family];
  for (size_t i = 0; i < kBatchBuckets.size(); ++i)
    if (requests <= kBatchBuckets[i]) ++h.counts[i];
  ++h.count;
  h.requests += requests;
  h.systems += systems;
}

std::string Metrics::Render(const BackendInfo& backend, int64_t in_flight, int64_t queued) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  Header(out, "trisolve_requests_total", "counter",
         "Calls by RPC, family, method and gRPC status code (errors are the codes other than OK); "
         "calls through a request ring carry transport=\"ring\".");
  for (const auto& [k, v] : requests_) {
    const auto& [rpc, family, method, code, transport] = k;
    absl::StrAppend(&out, "trisolve_requests_total{rpc=\"", Escape(rpc), "\",family=\"",
                    Escape(family), "\",method=\"", Escape(method), "\",code=\"", Escape(code),
                    transport.empty() ? "" : "\",transport=\"", Escape(transport), "\"} ", v,
                    "\n");
  }
  auto hist = [&](const char* name, const char* help, const std::map<std::string, Histogram>& h) {
    Header(out, name, "histogram", help);
    for (const auto& [family, hg] : h) {
      for (size_t i = 0; i < kBuckets.size(); ++i)
        absl::StrAppend(&out, name, "_bucket{family=\"", Escape(family), "\",le=\"",
                        Num(kBuckets[i]), "\"} ", hg.counts[i], "\n");
      absl::StrAppend(&out, name, "_bucket{family=\"", Escape(family), "\",le=\"+Inf\"} ",
                      hg.count, "\n", name, "_sum{family=\"", Escape(family), "\"} ",
                      Num(hg.sum), "\n", name, "_count{family=\"", Escape(family), "\"} ",
                      hg.count, "\n");
    }
  };
  hist("trisolve_queue_seconds", "Time a job waited for a slot.", queue_);
  hist("trisolve_transfer_seconds",
       "Time moving a job's arrays: receiving and checking the request, host-device copies.",
       transfer_);
  hist("trisolve_compute_seconds", "Time solving (kernels, or the CPU reference).", compute_);
  Header(out, "trisolve_batch_requests", "histogram",
         "Requests solved in one backend call by the batcher of small unary requests (1: alone).");
  for (const auto& [family, h] : batches_) {
    for (size_t i = 0; i < kBatchBuckets.size(); ++i)
      absl::StrAppend(&out, "trisolve_batch_requests_bucket{family=\"", Escape(family),
                      "\",le=\"", Num(kBatchBuckets[i]), "\"} ", h.counts[i], "\n");
    absl::StrAppend(&out, "trisolve_batch_requests_bucket{family=\"", Escape(family),
                    "\",le=\"+Inf\"} ", h.count, "\n", "trisolve_batch_requests_sum{family=\"",
                    Escape(family), "\"} ", h.requests, "\n",
                    "trisolve_batch_requests_count{family=\"", Escape(family), "\"} ", h.count,
                    "\n");
  }
  Header(out, "trisolve_batch_systems_total", "counter",
         "Systems solved through the batcher, by family.");
  for (const auto& [family, h] : batches_)
    absl::StrAppend(&out, "trisolve_batch_systems_total{family=\"", Escape(family), "\"} ",
                    h.systems, "\n");
  Header(out, "trisolve_unknowns_solved_total", "counter", "Unknowns of solved jobs, by family.");
  for (const auto& [family, v] : unknowns_)
    absl::StrAppend(&out, "trisolve_unknowns_solved_total{family=\"", Escape(family), "\"} ", v,
                    "\n");
  Header(out, "trisolve_systems_total", "counter",
         "Systems answered, by family and outcome (ok, singular, not_converged, diverged): a "
         "request whose call succeeded can still hold systems that were not solved.");
  static constexpr const char* kOutcome[] = {"ok", "singular", "not_converged", "diverged"};
  for (const auto& [key, v] : outcomes_)
    absl::StrAppend(&out, "trisolve_systems_total{family=\"", Escape(key.first),
                    "\",outcome=\"", kOutcome[key.second], "\"} ", v, "\n");
  Header(out, "trisolve_received_bytes_total", "counter", "Bytes of arrays received.");
  absl::StrAppend(&out, "trisolve_received_bytes_total ", bytes_in_, "\n");
  Header(out, "trisolve_sent_bytes_total", "counter", "Bytes of solutions sent.");
  absl::StrAppend(&out, "trisolve_sent_bytes_total ", bytes_out_, "\n");
  Header(out, "trisolve_jobs_in_flight", "gauge", "Jobs being solved now.");
  absl::StrAppend(&out, "trisolve_jobs_in_flight ", in_flight, "\n");
  Header(out, "trisolve_jobs_queued", "gauge", "Jobs waiting for a slot now.");
  absl::StrAppend(&out, "trisolve_jobs_queued ", queued, "\n");
  Header(out, "trisolve_pool_bytes", "gauge", "Pooled memory by pool and state.");
  for (const auto& p : backend.pools)
    absl::StrAppend(&out, "trisolve_pool_bytes{pool=\"", p.name, "\",state=\"cached\"} ",
                    p.cached_bytes, "\n", "trisolve_pool_bytes{pool=\"", p.name,
                    "\",state=\"in_use\"} ", p.in_use_bytes, "\n", "trisolve_pool_bytes{pool=\"",
                    p.name, "\",state=\"peak\"} ", p.peak_bytes, "\n",
                    "trisolve_pool_bytes{pool=\"", p.name, "\",state=\"cap\"} ", p.cap_bytes,
                    "\n");
  Header(out, "trisolve_pool_events_total", "counter", "Pool hits, misses and evictions.");
  for (const auto& p : backend.pools)
    absl::StrAppend(&out, "trisolve_pool_events_total{pool=\"", p.name, "\",event=\"hit\"} ",
                    p.hits, "\n", "trisolve_pool_events_total{pool=\"", p.name,
                    "\",event=\"miss\"} ", p.misses, "\n", "trisolve_pool_events_total{pool=\"",
                    p.name, "\",event=\"eviction\"} ", p.evictions, "\n");
  Header(out, "trisolve_device_memory_used_bytes", "gauge", "Device memory in use (all users).");
  for (size_t i = 0; i < backend.devices.size(); ++i)
    absl::StrAppend(&out, "trisolve_device_memory_used_bytes{device=\"", i, "\"} ",
                    backend.devices[i].total_memory_bytes - backend.devices[i].free_memory_bytes,
                    "\n");
  // Per device where the backend counts its calls (several devices: --devices).
  bool counted = false;
  for (const auto& d : backend.devices) counted |= d.jobs >= 0;
  if (counted) {
    Header(out, "trisolve_device_jobs_total", "counter",
           "Solves placed on each device (position in --devices).");
    for (size_t i = 0; i < backend.devices.size(); ++i)
      absl::StrAppend(&out, "trisolve_device_jobs_total{device=\"", i, "\"} ",
                      std::max<int64_t>(backend.devices[i].jobs, 0), "\n");
    Header(out, "trisolve_device_jobs_in_flight", "gauge", "Solves running on each device now.");
    for (size_t i = 0; i < backend.devices.size(); ++i)
      absl::StrAppend(&out, "trisolve_device_jobs_in_flight{device=\"", i, "\"} ",
                      std::max<int64_t>(backend.devices[i].jobs_in_flight, 0), "\n");
    const struct {
      const char* name;
      const char* help;
      double DeviceInfo::*seconds;
    } times[] = {
        {"trisolve_device_job_seconds_total", "Seconds of the solves on each device, summed.",
         &DeviceInfo::job_seconds},
        {"trisolve_device_h2d_seconds_total",
         "Seconds of copies to each device within its solves, summed.", &DeviceInfo::h2d_seconds},
        {"trisolve_device_kernel_seconds_total",
         "Seconds of kernels on each device within its solves, summed.",
         &DeviceInfo::kernel_seconds},
        {"trisolve_device_d2h_seconds_total",
         "Seconds of copies from each device within its solves, summed.",
         &DeviceInfo::d2h_seconds},
    };
    for (const auto& t : times) {
      Header(out, t.name, "counter", t.help);
      for (size_t i = 0; i < backend.devices.size(); ++i)
        absl::StrAppend(&out, t.name, "{device=\"", i, "\"} ",
                        Num(std::max(backend.devices[i].*t.seconds, 0.0)), "\n");
    }
  }
  return out;
}

MetricsServer::MetricsServer() = default;
MetricsServer::~MetricsServer() { Stop(); }

absl::StatusOr<int> MetricsServer::Start(const std::string& address, Renderer render) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address,
                                                   "' is not HOST:PORT"));
  const std::string host = address.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (...) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "': bad port"));
  }
  http_ = std::make_unique<httplib::Server>();
  http_->Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", address));
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return bound;
}

void MetricsServer::Stop() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace trisolve::server
