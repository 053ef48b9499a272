// Which keys a query may attend to, per sequence (docs/attention.md, "Masks").
//
// Masks are bottom-right aligned: query i of a sequence with Sq queries and Sk keys stands at key
// position a_i = i + Sk - Sq. key_span(i) bounds the allowed keys of row i by a half-open range
// (so loops skip what is surely masked, e.g. the upper triangle of causal); allowed(i, j) is the
// exact rule inside it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/problems.h"

namespace flashgrad::reference::attn {

struct KeySpan {
  int64_t begin = 0, end = 0;  // [begin, end), clipped to [0, Sk)
};

class SequenceMask {
 public:
  SequenceMask(const AttentionParams& p, const AttentionProblem& pr, int64_t n)
      : kind_(p.mask), sq_(pr.q_len(n)), sk_(pr.k_len(n)) {
    if (kind_ == MaskKind::causal) {
      left_ = -1;
      right_ = 0;
    } else if (kind_ == MaskKind::sliding_window) {
      left_ = p.window_left;
      right_ = p.window_right;
    }
    if (kind_ == MaskKind::prefix_lm) prefix_ = pr.prefix_lengths[n];
    if (kind_ == MaskKind::candidate_isolation) {
      const int64_t* b = &pr.candidate_bounds[4 * n];
      h0_ = b[0], h1_ = b[1], c0_ = b[2], c1_ = b[3];
    }
  }

  bool allowed(int64_t i, int64_t j) const {
    const int64_t a = i + sk_ - sq_;
    switch (kind_) {
      case MaskKind::none: return true;
      case MaskKind::causal:
      case MaskKind::sliding_window:
        return (left_ < 0 || j >= a - left_) && (right_ < 0 || j <= a + right_);
      case MaskKind::prefix_lm:  // causal, plus a bidirectional prefix [0, P)
        return j <= a || (a < prefix_ && j < prefix_);
      case MaskKind::candidate_isolation: {  // Sq == Sk here, so a == i
        const bool i_hist = h0_ <= i && i < h1_, i_cand = c0_ <= i && i < c1_;
        const bool j_hist = h0_ <= j && j < h1_;
        return (j_hist && (i_hist || i_cand)) || (i_cand && j == i);
      }
    }
    return false;
  }

  KeySpan key_span(int64_t i) const {
    const int64_t a = i + sk_ - sq_;
    int64_t lo = 0, hi = sk_;  // [lo, hi)
    switch (kind_) {
      case MaskKind::none: break;
      case MaskKind::causal:
      case MaskKind::sliding_window:
        if (left_ >= 0) lo = a - left_;
        if (right_ >= 0) hi = a + right_ + 1;
        break;
      case MaskKind::prefix_lm: hi = std::max(a + 1, a < prefix_ ? prefix_ : int64_t{0}); break;
      case MaskKind::candidate_isolation:
        lo = std::min(h0_, i);
        hi = std::max(h1_, i + 1);
        break;
    }
    KeySpan s{std::max<int64_t>(lo, 0), std::min(hi, sk_)};
    if (s.end < s.begin) s.end = s.begin;
    return s;
  }

 private:
  MaskKind kind_;
  int64_t sq_, sk_;
  int64_t left_ = -1, right_ = -1;  // causal / window; -1 = unbounded
  int64_t prefix_ = 0;
  int64_t h0_ = 0, h1_ = 0, c0_ = 0, c1_ = 0;
};

}  // namespace flashgrad::reference::attn
