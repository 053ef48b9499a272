// Argument checks shared by every op's validation. Each failure throws flashgrad::Error with
// "flashgrad: <op>: argument '<name>': <rule>" (see status.h), before any output is touched.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "flashgrad/status.h"
#include "flashgrad/tensor.h"

namespace flashgrad::checks {

struct Checker {
  std::string op;  // "attention_forward", "delta_rule_backward", ...

  [[noreturn]] void fail(const std::string& arg, const std::string& rule) const {
    throw_invalid_argument(op, arg, rule);
  }
  void require(bool ok, const std::string& arg, const std::string& rule) const {
    if (!ok) fail(arg, rule);
  }
  [[noreturn]] void unsupported(const std::string& arg, const std::string& what) const {
    throw_unsupported(op, arg, what);
  }

  // Present, non-null, rank in `ranks`, last dim contiguous (stride 1), pointer aligned to the
  // element size, non-negative sizes.
  void tensor(const TensorView& t, const std::string& arg, std::initializer_list<int> ranks) const;
  // dtype is one of `allowed`.
  void dtype(const TensorView& t, const std::string& arg, std::initializer_list<DType> allowed) const;
  // t.dtype == other.dtype (names both in the message).
  void same_dtype(const TensorView& t, const std::string& arg, const TensorView& other,
                  const std::string& other_arg) const;
  // Same device type and index.
  void same_device(const TensorView& t, const std::string& arg, const TensorView& other,
                   const std::string& other_arg) const;
  // t.shape == expected exactly (message shows both).
  void shape(const TensorView& t, const std::string& arg, const std::vector<int64_t>& expected,
             const std::string& why) const;
  // An output's elements must not share memory (a zero stride on a dim of size > 1, or strides
  // that interleave): two work items would write one address. Sufficient test: taking the dims of
  // size > 1 by increasing stride, each stride exceeds the span of the dims before it.
  void distinct_elements(const TensorView& t, const std::string& arg) const;
  // Memory ranges of an output and an input must not overlap (an output written first would
  // corrupt the input). Conservative: compares [lowest, highest] byte spans.
  void no_overlap(const TensorView& out, const std::string& out_arg, const TensorView& in,
                  const std::string& in_arg) const;
};

std::string shape_string(const std::vector<int64_t>& s);
std::string shape_string(const TensorView& t);

// The values of a small integer tensor (cu_seqlens, prefix lengths, bounds) on the host, copied
// from the device if needed. `t` must already have passed Checker::tensor; a device copy also
// needs it contiguous (a failure names `arg`).
std::vector<int64_t> read_index_tensor(const Checker& c, const TensorView& t, const std::string& arg,
                                       void* stream);

}  // namespace flashgrad::checks
