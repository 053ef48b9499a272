#include "checks.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "backends.h"
#include "host_dtype.h"

namespace flashgrad::checks {

std::string shape_string(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::string shape_string(const TensorView& t) {
  const int rank = std::clamp(t.rank, 0, TensorView::kMaxRank);  // never read past shape[]
  return shape_string(std::vector<int64_t>(t.shape, t.shape + rank));
}

void Checker::tensor(const TensorView& t, const std::string& arg,
                     std::initializer_list<int> ranks) const {
  require(t.present(), arg, "is required");
  require(t.rank <= TensorView::kMaxRank, arg,
          "has rank " + std::to_string(t.rank) + ", above flashgrad's maximum of " +
              std::to_string(TensorView::kMaxRank));
  bool rank_ok = false;
  std::ostringstream want;
  int i = 0;
  for (int r : ranks) {
    rank_ok |= (t.rank == r);
    want << (i++ ? " or " : "") << r;
  }
  require(rank_ok, arg, "must have rank " + want.str() + ", got rank " + std::to_string(t.rank) +
                            " with shape " + shape_string(t));
  for (int d = 0; d < t.rank; ++d)
    require(t.shape[d] >= 0, arg, "has a negative size in dim " + std::to_string(d));
  if (t.numel() == 0) return;  // empty tensors may carry any pointer
  require(t.data != nullptr, arg, "has a null data pointer");
  require(t.shape[t.rank - 1] == 1 || t.stride[t.rank - 1] == 1, arg,
          "must be contiguous in its last dimension (stride 1), got stride " +
              std::to_string(t.stride[t.rank - 1]));
  for (int d = 0; d < t.rank; ++d)
    require(t.stride[d] >= 0, arg, "has a negative stride in dim " + std::to_string(d));
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  require(addr % dtype_size(t.dtype) == 0, arg,
          std::string("data pointer is not aligned to its element size (") +
              std::to_string(dtype_size(t.dtype)) + " bytes for " + dtype_name(t.dtype) + ")");
}

void Checker::dtype(const TensorView& t, const std::string& arg,
                    std::initializer_list<DType> allowed) const {
  std::ostringstream names;
  int i = 0;
  for (DType d : allowed) {
    if (t.dtype == d) return;
    names << (i++ ? ", " : "") << dtype_name(d);
  }
  fail(arg, std::string("dtype must be one of {") + names.str() + "}, got " + dtype_name(t.dtype));
}

void Checker::same_dtype(const TensorView& t, const std::string& arg, const TensorView& other,
                         const std::string& other_arg) const {
  require(t.dtype == other.dtype, arg,
          std::string("dtype must match ") + other_arg + " (" + dtype_name(other.dtype) + "), got " +
              dtype_name(t.dtype));
}

void Checker::same_device(const TensorView& t, const std::string& arg, const TensorView& other,
                          const std::string& other_arg) const {
  require(t.device == other.device && t.device_index == other.device_index, arg,
          std::string("must be on the same device as ") + other_arg + " (" +
              device_name(other.device) + ":" + std::to_string(other.device_index) + "), got " +
              device_name(t.device) + ":" + std::to_string(t.device_index));
}

void Checker::shape(const TensorView& t, const std::string& arg,
                    const std::vector<int64_t>& expected, const std::string& why) const {
  bool ok = t.rank == static_cast<int>(expected.size());
  for (int d = 0; ok && d < t.rank; ++d) ok = t.shape[d] == expected[d];
  require(ok, arg, "must have shape " + shape_string(expected) + " (" + why + "), got " +
                       shape_string(t));
}

void Checker::distinct_elements(const TensorView& t, const std::string& arg) const {
  if (!t.present() || t.numel() == 0) return;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) dims.emplace_back(t.stride[d], t.shape[d]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // the largest offset reachable with the dims seen so far
  for (const auto& [stride, size] : dims) {
    if (stride <= span)
      fail(arg, "is an output and must not map two elements to one address, got strides " +
                    shape_string(std::vector<int64_t>(t.stride, t.stride + t.rank)) + " for shape " +
                    shape_string(t));
    span += stride * (size - 1);
  }
}

namespace {
// [first byte, one past last byte] touched by a strided view.
std::pair<std::uintptr_t, std::uintptr_t> byte_span(const TensorView& t) {
  const auto base = reinterpret_cast<std::uintptr_t>(t.data);
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.stride[d];
  return {base, base + static_cast<std::uintptr_t>((last + 1) * dtype_size(t.dtype))};
}
}  // namespace

void Checker::no_overlap(const TensorView& out, const std::string& out_arg, const TensorView& in,
                         const std::string& in_arg) const {
  if (!out.present() || !in.present() || out.numel() == 0 || in.numel() == 0) return;
  if (out.device != in.device) return;
  const auto a = byte_span(out), b = byte_span(in);
  require(a.second <= b.first || b.second <= a.first, out_arg,
          "must not overlap the memory of input '" + in_arg + "'");
}

std::vector<int64_t> read_index_tensor(const Checker& c, const TensorView& t, const std::string& arg,
                                       void* stream) {
  const int64_t n = t.numel();
  std::vector<int64_t> values(static_cast<size_t>(n));
  if (n == 0) return values;
  // Index tensors are small; gather a contiguous host copy first (strided rank 1 or 2).
  std::vector<unsigned char> raw(static_cast<size_t>(n) * dtype_size(t.dtype));
  if (t.device == Device::cpu) {
    const auto* base = static_cast<const unsigned char*>(t.data);
    int64_t i = 0;
    if (t.rank == 1) {
      for (int64_t a = 0; a < t.shape[0]; ++a, ++i)
        std::copy_n(base + a * t.stride[0] * dtype_size(t.dtype), dtype_size(t.dtype),
                    raw.data() + i * dtype_size(t.dtype));
    } else {
      for (int64_t a = 0; a < t.shape[0]; ++a)
        for (int64_t b = 0; b < t.shape[1]; ++b, ++i)
          std::copy_n(base + (a * t.stride[0] + b * t.stride[1]) * dtype_size(t.dtype),
                      dtype_size(t.dtype), raw.data() + i * dtype_size(t.dtype));
    }
  } else {
    c.require(t.is_contiguous(), arg,
              "must be contiguous when on a CUDA device (it is copied to the host as one block), got "
              "strides " + shape_string(std::vector<int64_t>(t.stride, t.stride + t.rank)) +
                  " for shape " + shape_string(t));
    backend::cuda_copy_to_host(raw.data(), t.data, raw.size(), t.device_index, stream);
  }
  for (int64_t i = 0; i < n; ++i) values[i] = host::load_index(raw.data(), t.dtype, i);
  return values;
}

}  // namespace flashgrad::checks
