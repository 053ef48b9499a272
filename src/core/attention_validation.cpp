// Validation of softmax-attention calls (docs/attention.md, "Validation rules"). Every rule is
// checked before any backend runs, so a rejected call writes nothing. Messages name the argument
// and the rule: "flashgrad: <op>: argument '<name>': <rule>".
#include "attention_validation.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "checks.h"

namespace flashgrad {
namespace {

using checks::Checker;
using checks::shape_string;

std::string num(int64_t x) { return std::to_string(x); }

std::string fnum(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

bool valid_mask(MaskKind m) {
  switch (m) {
    case MaskKind::none:
    case MaskKind::causal:
    case MaskKind::sliding_window:
    case MaskKind::prefix_lm:
    case MaskKind::candidate_isolation: return true;
  }
  return false;
}

bool valid_softcap_method(SoftcapMethod m) {
  return m == SoftcapMethod::tanh || m == SoftcapMethod::soft_sign;
}

// The dtype of out / dq / dk / dv for inputs of dtype `in`: the same, except that fp8 inputs give
// 16-bit results (bfloat16 or float16, the caller picks by the dtype of `out`).
bool is_result_dtype(DType in, DType result) {
  if (in == DType::e4m3) return result == DType::bf16 || result == DType::f16;
  return result == in;
}

std::string result_dtype_rule(DType in) {
  if (in == DType::e4m3) return "dtype must be bfloat16 or float16 for float8_e4m3fn inputs";
  return std::string("dtype must be ") + dtype_name(in) + " (the dtype of q)";
}

// lse and dlse are float32; float64 is also accepted when the inputs are float64 (gradient checks
// in double precision need an lse that is not rounded to float).
void check_lse_dtype(const Checker& c, const TensorView& t, const std::string& arg, DType q_dtype) {
  if (q_dtype == DType::f64)
    c.dtype(t, arg, {DType::f32, DType::f64});
  else
    c.dtype(t, arg, {DType::f32});
}

// A small per-sequence tensor (cu_seqlens, prefix lengths, bounds: int32; fp8 descales: float32):
// rank, dtype, device.
void check_small_tensor(const Checker& c, const TensorView& t, const std::string& arg, int rank,
                        DType dtype, const TensorView& q) {
  c.tensor(t, arg, {rank});
  c.dtype(t, arg, {dtype});
  c.same_device(t, arg, q, "q");
}

// cu_seqlens: int32 [N+1], 0 = c[0] <= c[1] <= ... <= c[N] = total.
std::vector<int64_t> check_cu_seqlens(const Checker& c, const TensorView& t, const std::string& arg,
                                      int64_t total, const std::string& total_name,
                                      const AttentionParams& p) {
  check_small_tensor(c, t, arg, 1, DType::i32, p.q);
  c.require(t.shape[0] >= 1, arg, "must have length N+1 >= 1 (N = number of sequences), got length 0");
  std::vector<int64_t> v = checks::read_index_tensor(c, t, arg, p.exec.stream);
  c.require(v[0] == 0, arg, "must start at 0, got entry 0 = " + num(v[0]));
  for (size_t i = 1; i < v.size(); ++i)
    c.require(v[i] >= v[i - 1], arg,
              "must be non-decreasing (entry " + num(static_cast<int64_t>(i)) + " = " + num(v[i]) +
                  " < entry " + num(static_cast<int64_t>(i - 1)) + " = " + num(v[i - 1]) + ")");
  c.require(v.back() == total, arg,
            "must end at the number of tokens " + total_name + " = " + num(total) + ", got last entry " +
                num(v.back()));
  return v;
}

void check_max_seqlen(const Checker& c, int64_t given, const std::string& arg, int64_t actual) {
  c.require(given >= 0, arg, "must be >= 0 (0 = compute from the lengths), got " + num(given));
  c.require(given == 0 || given >= actual, arg,
            "must be >= the longest sequence (" + num(actual) + "), got " + num(given));
}

void check_mask(const Checker& c, const AttentionParams& p, AttentionProblem& pr) {
  c.require(valid_mask(p.mask), "mask",
            "unknown mask kind value " + num(static_cast<int64_t>(p.mask)) +
                " (expected none, causal, sliding_window, prefix_lm or candidate_isolation)");

  // Sliding window: -1 is unbounded; other negative values mean nothing.
  if (p.mask == MaskKind::sliding_window) {
    c.require(p.window_left >= -1, "window_left",
              "must be >= 0, or -1 for unbounded, got " + num(p.window_left));
    c.require(p.window_right >= -1, "window_right",
              "must be >= 0, or -1 for unbounded, got " + num(p.window_right));
  } else {
    const std::string rule = std::string("is only used with mask sliding_window (mask is ") +
                             mask_name(p.mask) + "); leave it at -1";
    c.require(p.window_left == -1, "window_left", rule + ", got " + num(p.window_left));
    c.require(p.window_right == -1, "window_right", rule + ", got " + num(p.window_right));
  }

  if (p.mask == MaskKind::prefix_lm) {
    c.require(p.prefix_lengths.present(), "prefix_lengths", "is required with mask prefix_lm");
    check_small_tensor(c, p.prefix_lengths, "prefix_lengths", 1, DType::i32, p.q);
    c.shape(p.prefix_lengths, "prefix_lengths", {pr.num_seqs}, "one prefix length per sequence");
    pr.prefix_lengths = checks::read_index_tensor(c, p.prefix_lengths, "prefix_lengths", p.exec.stream);
    for (int64_t n = 0; n < pr.num_seqs; ++n)
      c.require(pr.prefix_lengths[n] >= 0, "prefix_lengths",
                "must be >= 0, got " + num(pr.prefix_lengths[n]) + " for sequence " + num(n));
  } else {
    c.require(!p.prefix_lengths.present(), "prefix_lengths",
              std::string("is only used with mask prefix_lm (mask is ") + mask_name(p.mask) + ")");
  }

  if (p.mask == MaskKind::candidate_isolation) {
    c.require(p.candidate_bounds.present(), "candidate_bounds",
              "is required with mask candidate_isolation");
    check_small_tensor(c, p.candidate_bounds, "candidate_bounds", 2, DType::i32, p.q);
    c.shape(p.candidate_bounds, "candidate_bounds", {pr.num_seqs, 4},
            "h0, h1, c0, c1 per sequence");
    pr.candidate_bounds = checks::read_index_tensor(c, p.candidate_bounds, "candidate_bounds", p.exec.stream);
    for (int64_t n = 0; n < pr.num_seqs; ++n) {
      const int64_t sq = pr.q_len(n), sk = pr.k_len(n);
      c.require(sq == sk, "q",
                "mask candidate_isolation needs equal query and key lengths per sequence; sequence " +
                    num(n) + " has Sq = " + num(sq) + ", Sk = " + num(sk));
      const int64_t* b = &pr.candidate_bounds[4 * n];
      const std::string where = " (sequence " + num(n) + ", length " + num(sq) + ": h0 = " +
                                num(b[0]) + ", h1 = " + num(b[1]) + ", c0 = " + num(b[2]) +
                                ", c1 = " + num(b[3]) + ")";
      c.require(0 <= b[0] && b[0] <= b[1] && b[1] <= sq, "candidate_bounds",
                "history must satisfy 0 <= h0 <= h1 <= sequence length" + where);
      c.require(0 <= b[2] && b[2] <= b[3] && b[3] <= sq, "candidate_bounds",
                "candidates must satisfy 0 <= c0 <= c1 <= sequence length" + where);
      c.require(std::max(b[0], b[2]) >= std::min(b[1], b[3]), "candidate_bounds",
                "history [h0, h1) and candidates [c0, c1) must not overlap" + where);
    }
  } else {
    c.require(!p.candidate_bounds.present(), "candidate_bounds",
              std::string("is only used with mask candidate_isolation (mask is ") +
                  mask_name(p.mask) + ")");
  }
}

void check_fp8_descales(const Checker& c, const AttentionParams& p, const AttentionProblem& pr) {
  const TensorView* ds[3] = {&p.descale_q, &p.descale_k, &p.descale_v};
  const char* names[3] = {"descale_q", "descale_k", "descale_v"};
  for (int i = 0; i < 3; ++i) {
    if (p.q.dtype == DType::e4m3) {
      c.require(ds[i]->present(), names[i], "is required for float8_e4m3fn inputs");
      check_small_tensor(c, *ds[i], names[i], 2, DType::f32, p.q);
      c.shape(*ds[i], names[i], {pr.num_seqs, pr.heads_k}, "one descale per sequence and kv head");
    } else {
      c.require(!ds[i]->present(), names[i],
                std::string("is only used with float8_e4m3fn inputs (q is ") + dtype_name(p.q.dtype) +
                    ")");
    }
  }
}

// A result tensor (an output, or the forward's results read back by the backward): rank, device
// and exact shape.
void check_result(const Checker& c, const TensorView& t, const std::string& arg,
                  const std::vector<int64_t>& shape, const std::string& why, const TensorView& q) {
  c.tensor(t, arg, {static_cast<int>(shape.size())});
  c.same_device(t, arg, q, "q");
  c.shape(t, arg, shape, why);
}

std::vector<int64_t> out_shape(const AttentionProblem& pr) {
  if (pr.varlen) return {pr.total_q, pr.heads_q, pr.head_dim_v};
  return {pr.num_seqs, pr.seqlen_q, pr.heads_q, pr.head_dim_v};
}

std::vector<int64_t> lse_shape(const AttentionProblem& pr) {
  if (pr.varlen) return {pr.heads_q, pr.total_q};
  return {pr.num_seqs, pr.heads_q, pr.seqlen_q};
}

std::string out_why(const AttentionProblem& pr) {
  return pr.varlen ? "[Tq, Hq, Dv]" : "[B, Sq, Hq, Dv]";
}

std::string lse_why(const AttentionProblem& pr) { return pr.varlen ? "[Hq, Tq]" : "[B, Hq, Sq]"; }

}  // namespace

AttentionProblem validate_attention_inputs(const char* op, const AttentionParams& p) {
  const Checker c{op};
  AttentionProblem pr;

  // Layout: packed varlen (rank 3 + both cu_seqlens) or padded (rank 4, no cu_seqlens).
  if (p.cu_seqlens_q.present() != p.cu_seqlens_k.present()) {
    const bool has_q = p.cu_seqlens_q.present();
    c.fail(has_q ? "cu_seqlens_k" : "cu_seqlens_q",
           std::string("must be given together with ") + (has_q ? "cu_seqlens_q" : "cu_seqlens_k") +
               " (both or neither)");
  }
  pr.varlen = p.cu_seqlens_q.present();
  c.tensor(p.q, "q", {3, 4});
  if (pr.varlen)
    c.require(p.q.rank == 3, "q",
              "must have rank 3 [Tq, Hq, D] with cu_seqlens (packed layout), got shape " +
                  shape_string(p.q));
  else
    c.require(p.q.rank == 4, "q",
              "must have rank 4 [B, Sq, Hq, D] without cu_seqlens (rank 3 is the packed layout, "
              "which needs cu_seqlens_q and cu_seqlens_k), got shape " + shape_string(p.q));
  const int rank = p.q.rank;
  c.tensor(p.k, "k", {rank});
  c.tensor(p.v, "v", {rank});

  c.dtype(p.q, "q", {DType::f32, DType::f16, DType::bf16, DType::f64, DType::e4m3});
  c.same_dtype(p.k, "k", p.q, "q");
  c.same_dtype(p.v, "v", p.q, "q");
  c.same_device(p.k, "k", p.q, "q");
  c.same_device(p.v, "v", p.q, "q");

  // Sizes. Token dimension first in both layouts after the batch dimension.
  const int t = pr.varlen ? 0 : 1;  // index of the sequence/token dimension
  pr.heads_q = p.q.shape[t + 1];
  pr.heads_k = p.k.shape[t + 1];
  pr.head_dim = p.q.shape[t + 2];
  pr.head_dim_v = p.v.shape[t + 2];
  if (!pr.varlen) {
    c.require(p.k.shape[0] == p.q.shape[0], "k",
              "batch size must match q (B = " + num(p.q.shape[0]) + "), got " + num(p.k.shape[0]));
    c.require(p.v.shape[0] == p.q.shape[0], "v",
              "batch size must match q (B = " + num(p.q.shape[0]) + "), got " + num(p.v.shape[0]));
  }
  c.require(p.v.shape[t] == p.k.shape[t], "v",
            std::string(pr.varlen ? "number of tokens" : "sequence length") + " must match k (" +
                num(p.k.shape[t]) + "), got " + num(p.v.shape[t]));
  c.require(pr.heads_q >= 1, "q", "must have at least one head, got shape " + shape_string(p.q));
  c.require(pr.heads_k >= 1, "k", "must have at least one head, got shape " + shape_string(p.k));
  c.require(p.v.shape[t + 1] == pr.heads_k, "v",
            "number of heads must match k (Hk = " + num(pr.heads_k) + "), got " + num(p.v.shape[t + 1]));
  c.require(pr.heads_q % pr.heads_k == 0, "k",
            "number of heads (Hk = " + num(pr.heads_k) + ") must divide the number of query heads (Hq = " +
                num(pr.heads_q) + ")");
  c.require(pr.head_dim >= 1, "q", "head dim must be >= 1, got shape " + shape_string(p.q));
  c.require(p.k.shape[t + 2] == pr.head_dim, "k",
            "head dim must match q (D = " + num(pr.head_dim) + "), got " + num(p.k.shape[t + 2]));
  c.require(pr.head_dim_v >= 1, "v", "head dim must be >= 1, got shape " + shape_string(p.v));

  if (pr.varlen) {
    pr.total_q = p.q.shape[0];
    pr.total_k = p.k.shape[0];
    pr.cu_seqlens_q = check_cu_seqlens(c, p.cu_seqlens_q, "cu_seqlens_q", pr.total_q, "Tq", p);
    c.require(p.cu_seqlens_k.shape[0] == p.cu_seqlens_q.shape[0], "cu_seqlens_k",
              "must have the same length as cu_seqlens_q (N+1 = " + num(p.cu_seqlens_q.shape[0]) +
                  "), got " + num(p.cu_seqlens_k.shape[0]));
    pr.cu_seqlens_k = check_cu_seqlens(c, p.cu_seqlens_k, "cu_seqlens_k", pr.total_k, "Tk", p);
    pr.num_seqs = static_cast<int64_t>(pr.cu_seqlens_q.size()) - 1;
    int64_t longest_q = 0, longest_k = 0;
    for (int64_t n = 0; n < pr.num_seqs; ++n) {
      longest_q = std::max(longest_q, pr.q_len(n));
      longest_k = std::max(longest_k, pr.k_len(n));
    }
    check_max_seqlen(c, p.max_seqlen_q, "max_seqlen_q", longest_q);
    check_max_seqlen(c, p.max_seqlen_k, "max_seqlen_k", longest_k);
    pr.seqlen_q = p.max_seqlen_q > 0 ? p.max_seqlen_q : longest_q;
    pr.seqlen_k = p.max_seqlen_k > 0 ? p.max_seqlen_k : longest_k;
  } else {
    pr.num_seqs = p.q.shape[0];
    pr.seqlen_q = p.q.shape[1];
    pr.seqlen_k = p.k.shape[1];
    pr.total_q = pr.num_seqs * pr.seqlen_q;
    pr.total_k = pr.num_seqs * pr.seqlen_k;
    check_max_seqlen(c, p.max_seqlen_q, "max_seqlen_q", pr.seqlen_q);
    check_max_seqlen(c, p.max_seqlen_k, "max_seqlen_k", pr.seqlen_k);
  }

  // Scale: NaN (the default marker) means 1/sqrt(D); anything else must be finite.
  if (std::isnan(p.scale)) {
    pr.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(pr.head_dim)));
  } else {
    c.require(std::isfinite(p.scale), "scale",
              "must be finite (NaN selects the default 1/sqrt(D)), got " + fnum(p.scale));
    pr.scale = p.scale;
  }

  check_mask(c, p, pr);

  c.require(std::isfinite(p.softcap) && p.softcap >= 0.0f, "softcap",
            "must be a finite number >= 0 (0 = off), got " + fnum(p.softcap));
  c.require(valid_softcap_method(p.softcap_method), "softcap_method",
            "unknown softcap method value " + num(static_cast<int64_t>(p.softcap_method)) +
                " (expected tanh or soft_sign)");

  check_fp8_descales(c, p, pr);

  c.require(p.exec.precision == Precision::fp32 || p.exec.precision == Precision::fp64,
            "exec.precision",
            "unknown precision value " + num(static_cast<int64_t>(p.exec.precision)) +
                " (expected fp32 or fp64)");
  c.require(p.exec.num_threads >= 0, "exec.num_threads",
            "must be >= 0 (0 = one per hardware thread), got " + num(p.exec.num_threads));
  return pr;
}

void validate_attention_forward_outputs(const char* op, const AttentionParams& p,
                                        const AttentionProblem& pr, const TensorView& out,
                                        const TensorView& lse) {
  const Checker c{op};
  check_result(c, out, "out", out_shape(pr), out_why(pr), p.q);
  c.require(is_result_dtype(p.q.dtype, out.dtype), "out",
            result_dtype_rule(p.q.dtype) + ", got " + dtype_name(out.dtype));
  c.distinct_elements(out, "out");
  if (lse.present()) {
    check_result(c, lse, "lse", lse_shape(pr), lse_why(pr), p.q);
    check_lse_dtype(c, lse, "lse", p.q.dtype);
    c.distinct_elements(lse, "lse");
  }

  const std::pair<const TensorView*, const char*> inputs[] = {
      {&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.cu_seqlens_q, "cu_seqlens_q"},
      {&p.cu_seqlens_k, "cu_seqlens_k"}, {&p.prefix_lengths, "prefix_lengths"},
      {&p.candidate_bounds, "candidate_bounds"}, {&p.descale_q, "descale_q"},
      {&p.descale_k, "descale_k"}, {&p.descale_v, "descale_v"}};
  for (const auto& [in, name] : inputs) {
    c.no_overlap(out, "out", *in, name);
    c.no_overlap(lse, "lse", *in, name);
  }
  c.no_overlap(lse, "lse", out, "out");
}

void validate_attention_backward_args(const char* op, const AttentionParams& p,
                                      const AttentionProblem& pr, const AttentionBackwardInputs& in,
                                      const TensorView& dq, const TensorView& dk,
                                      const TensorView& dv) {
  const Checker c{op};
  // The forward's results, read back as inputs.
  check_result(c, in.out, "out", out_shape(pr), out_why(pr), p.q);
  c.require(is_result_dtype(p.q.dtype, in.out.dtype), "out",
            result_dtype_rule(p.q.dtype) + ", got " + dtype_name(in.out.dtype));
  c.require(in.lse.present(), "lse", "is required by the backward (pass the forward's lse)");
  check_result(c, in.lse, "lse", lse_shape(pr), lse_why(pr), p.q);
  check_lse_dtype(c, in.lse, "lse", p.q.dtype);
  check_result(c, in.dout, "dout", out_shape(pr), "the shape of out " + out_why(pr), p.q);
  c.same_dtype(in.dout, "dout", in.out, "out");
  if (in.dlse.present()) {
    check_result(c, in.dlse, "dlse", lse_shape(pr), "the shape of lse " + lse_why(pr), p.q);
    check_lse_dtype(c, in.dlse, "dlse", p.q.dtype);
  }
  c.require(std::isfinite(in.z_loss_weight), "z_loss_weight",
            "must be finite, got " + fnum(in.z_loss_weight));

  // Gradients: shapes of q, k, v; dtype of q (of out for fp8 inputs).
  const std::pair<const TensorView*, const char*> grads[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  const TensorView* primal[] = {&p.q, &p.k, &p.v};
  const char* primal_name[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const TensorView& g = *grads[i].first;
    const std::string arg = grads[i].second;
    const TensorView& x = *primal[i];
    check_result(c, g, arg, std::vector<int64_t>(x.shape, x.shape + x.rank),
                 std::string("the shape of ") + primal_name[i], p.q);
    if (p.q.dtype == DType::e4m3)
      c.require(g.dtype == in.out.dtype, arg,
                std::string("dtype must match out (") + dtype_name(in.out.dtype) +
                    ") for float8_e4m3fn inputs, got " + dtype_name(g.dtype));
    else
      c.same_dtype(g, arg, p.q, "q");
    c.distinct_elements(g, arg);
  }

  const std::pair<const TensorView*, const char*> inputs[] = {
      {&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&in.out, "out"}, {&in.lse, "lse"},
      {&in.dout, "dout"}, {&in.dlse, "dlse"}, {&p.cu_seqlens_q, "cu_seqlens_q"},
      {&p.cu_seqlens_k, "cu_seqlens_k"}, {&p.prefix_lengths, "prefix_lengths"},
      {&p.candidate_bounds, "candidate_bounds"}, {&p.descale_q, "descale_q"},
      {&p.descale_k, "descale_k"}, {&p.descale_v, "descale_v"}};
  for (const auto& [g, gname] : grads)
    for (const auto& [x, xname] : inputs) c.no_overlap(*g, gname, *x, xname);
  c.no_overlap(dq, "dq", dk, "dk");
  c.no_overlap(dq, "dq", dv, "dv");
  c.no_overlap(dk, "dk", dv, "dv");
}

}  // namespace flashgrad
