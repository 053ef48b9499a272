// flashgrad example: softmax attention forward and backward through the public C++ API, with the
// backward checked against central finite differences in float64.
//
// Problem: B = 2 sequences, Sq = 12 queries and Sk = 16 keys each, 4 query heads sharing 2 kv
// heads (GQA), head dims D = 8 and Dv = 6, causal mask (bottom-right aligned), tanh softcap.
// The loss is L = sum(out * dout) + sum(lse * dlse) for fixed random dout, dlse; the backward
// returns dL/dq, dL/dk, dL/dv, and every element of them is compared with
// (L(x + h) - L(x - h)) / 2h, h = 1e-5. Exits 1 if any relative error exceeds 1e-6.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flashgrad/attention.h"
#include "flashgrad/status.h"

namespace {

using flashgrad::DType;
using flashgrad::TensorView;

constexpr int64_t B = 2, Sq = 12, Sk = 16, Hq = 4, Hk = 2, D = 8, Dv = 6;

TensorView view(std::vector<double>& storage, std::initializer_list<int64_t> shape) {
  return TensorView(storage.data(), DType::f64, shape);
}

struct Problem {
  std::vector<double> q, k, v, dout, dlse;

  flashgrad::AttentionParams params() {
    flashgrad::AttentionParams p;
    p.q = view(q, {B, Sq, Hq, D});
    p.k = view(k, {B, Sk, Hk, D});
    p.v = view(v, {B, Sk, Hk, Dv});
    p.mask = flashgrad::MaskKind::causal;
    p.softcap = 2.0f;
    p.softcap_method = flashgrad::SoftcapMethod::tanh;
    p.exec.num_threads = 1;
    return p;
  }

  // out and lse of the forward, and the loss L.
  double loss(std::vector<double>& out, std::vector<double>& lse) {
    flashgrad::attention_forward(params(), view(out, {B, Sq, Hq, Dv}), view(lse, {B, Hq, Sq}));
    double total = 0;
    for (size_t i = 0; i < out.size(); ++i) total += out[i] * dout[i];
    for (size_t i = 0; i < lse.size(); ++i)
      if (std::isfinite(lse[i])) total += lse[i] * dlse[i];  // fully masked rows: lse = -inf
    return total;
  }
};

// One line of the report: the worst element of one gradient.
struct Row {
  const char* name;
  int64_t count = 0;
  int64_t worst = -1;  // flat index of the element with the largest relative error
  double analytic = 0, numeric = 0, max_rel = 0;
};

}  // namespace

int main() {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto random_vector = [&](int64_t n) {
    std::vector<double> x(static_cast<size_t>(n));
    for (double& e : x) e = u(rng);
    return x;
  };
  Problem pb{random_vector(B * Sq * Hq * D), random_vector(B * Sk * Hk * D),
             random_vector(B * Sk * Hk * Dv), random_vector(B * Sq * Hq * Dv),
             random_vector(B * Hq * Sq)};

  std::printf("flashgrad attention gradient check (CPU reference, float64)\n");
  std::printf("  q [%lld, %lld, %lld, %lld]  k [%lld, %lld, %lld, %lld]  v [%lld, %lld, %lld, %lld]\n",
              (long long)B, (long long)Sq, (long long)Hq, (long long)D, (long long)B, (long long)Sk,
              (long long)Hk, (long long)D, (long long)B, (long long)Sk, (long long)Hk, (long long)Dv);
  std::printf("  causal mask, softcap tanh 2.0, GQA %lld query heads : %lld kv heads\n",
              (long long)Hq, (long long)Hk);

  std::vector<double> out(B * Sq * Hq * Dv), lse(B * Hq * Sq);
  std::vector<double> dq(pb.q.size()), dk(pb.k.size()), dv(pb.v.size());
  try {
    pb.loss(out, lse);
    flashgrad::AttentionBackwardInputs in;
    in.out = view(out, {B, Sq, Hq, Dv});
    in.lse = view(lse, {B, Hq, Sq});
    in.dout = view(pb.dout, {B, Sq, Hq, Dv});
    in.dlse = view(pb.dlse, {B, Hq, Sq});
    flashgrad::attention_backward(pb.params(), in, view(dq, {B, Sq, Hq, D}),
                                  view(dk, {B, Sk, Hk, D}), view(dv, {B, Sk, Hk, Dv}));
  } catch (const flashgrad::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }

  // Central differences for every element of q, k and v.
  const double h = 1e-5, tolerance = 1e-6;
  std::vector<double>* inputs[3] = {&pb.q, &pb.k, &pb.v};
  const std::vector<double>* grads[3] = {&dq, &dk, &dv};
  Row rows[3] = {{"dq"}, {"dk"}, {"dv"}};
  std::vector<double> out_tmp(out.size()), lse_tmp(lse.size());
  for (int t = 0; t < 3; ++t) {
    std::vector<double>& x = *inputs[t];
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + h;
      const double up = pb.loss(out_tmp, lse_tmp);
      x[i] = keep - h;
      const double down = pb.loss(out_tmp, lse_tmp);
      x[i] = keep;
      const double numeric = (up - down) / (2 * h);
      const double analytic = (*grads[t])[i];
      const double rel = std::fabs(analytic - numeric) / std::max(1.0, std::fabs(numeric));
      Row& r = rows[t];
      r.count++;
      if (r.worst < 0 || !(rel <= r.max_rel)) {  // NaN counts as worst
        r.worst = static_cast<int64_t>(i);
        r.analytic = analytic;
        r.numeric = numeric;
        r.max_rel = rel;
      }
    }
  }

  std::printf("\n  %-8s %8s   %-13s %20s %20s %10s  %s\n", "gradient", "elements", "worst element",
              "analytic", "finite difference", "rel error", "status");
  bool ok = true;
  for (const Row& r : rows) {
    const bool pass = r.max_rel <= tolerance;
    ok &= pass;
    std::printf("  %-8s %8lld   #%-12lld %20.12e %20.12e %10.2e  %s\n", r.name, (long long)r.count,
                (long long)r.worst, r.analytic, r.numeric, r.max_rel, pass ? "ok" : "FAIL");
  }
  std::printf("\n  relative error = |analytic - finite difference| / max(1, |finite difference|), "
              "h = %.0e, tolerance %.0e\n", h, tolerance);
  std::printf("%s\n", ok ? "PASS: the backward matches finite differences"
                         : "FAIL: the backward disagrees with finite differences");
  return ok ? 0 : 1;
}
