#include "jax_common.h"

#include "flashgrad/status.h"

namespace flashgrad::jax_ffi {
namespace {

[[noreturn]] void binding_error(const std::string& what) {
  throw Error(ErrorKind::invalid_argument, "", "flashgrad: jax binding: " + what);
}

DType dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::f32;
    case ffi::DataType::F16: return DType::f16;
    case ffi::DataType::BF16: return DType::bf16;
    case ffi::DataType::F64: return DType::f64;
    case ffi::DataType::F8E4M3FN: return DType::e4m3;
    case ffi::DataType::S32: return DType::i32;
    case ffi::DataType::S64: return DType::i64;
    default: break;
  }
  binding_error("buffer element type " + std::to_string(static_cast<int>(t)) +
                " is not supported (float32, float16, bfloat16, float64, float8_e4m3fn, int32, int64)");
}

// XLA buffers here are dense row-major (the default layout jax.ffi.ffi_call asks for).
TensorView view(void* data, ffi::DataType type, ffi::Span<const int64_t> dims, const Place& place) {
  if (dims.size() > static_cast<size_t>(TensorView::kMaxRank))
    binding_error("buffer of rank " + std::to_string(dims.size()) + " exceeds the maximum rank");
  TensorView v;
  v.data = data;
  v.dtype = dtype_of(type);
  v.device = place.device;
  v.device_index = place.device_index;
  v.rank = static_cast<int>(dims.size());
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = dims[d];
    v.stride[d] = stride;
    stride *= dims[d] > 0 ? dims[d] : 1;
  }
  return v;
}

// "a,b,c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> split_names(std::string_view list) {
  std::vector<std::string> names;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    names.emplace_back(list.substr(0, comma));
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return names;
}

template <typename T>
T get_attr(const ffi::Dictionary* attrs, std::string_view name, const char* type) {
  auto value = attrs->get<T>(name);
  if (!value.has_value())
    binding_error("attribute '" + std::string(name) + "' (" + type + ") is missing or mistyped");
  return *value;
}

}  // namespace

TensorView NamedViews::operator[](std::string_view name) const {
  for (const auto& [n, v] : views_)
    if (n == name) return v;
  return TensorView{};
}

int64_t Call::int_attr(std::string_view name) const { return get_attr<int64_t>(attrs, name, "int64"); }
float Call::float_attr(std::string_view name) const { return get_attr<float>(attrs, name, "float32"); }
bool Call::bool_attr(std::string_view name) const { return get_attr<bool>(attrs, name, "bool"); }

Workspace Call::workspace(std::size_t bytes) const {
  if (bytes == 0 || scratch == nullptr) return {};
  std::optional<void*> memory = scratch->Allocate(bytes, 256);
  // XLA's GPU runtime may refuse (seen with jax 0.11.2 on an H200 for 66 KiB); the backend then
  // allocates the scratch itself (an empty Workspace asks it to).
  if (!memory.has_value()) return {};
  return {*memory, bytes};
}

ffi::Error run(OpFn op, const Place& place, ffi::RemainingArgs args, ffi::RemainingRets rets,
               const ffi::Dictionary& attrs, ffi::ScratchAllocator* scratch) {
  try {
    Call call;
    call.attrs = &attrs;
    call.scratch = scratch;
    call.exec.stream = place.stream;
    const std::vector<std::string> in_names = split_names(get_attr<std::string_view>(&attrs, "inputs", "str"));
    const std::vector<std::string> out_names = split_names(get_attr<std::string_view>(&attrs, "outputs", "str"));
    if (in_names.size() != args.size() || out_names.size() != rets.size())
      binding_error("names " + std::to_string(in_names.size()) + " inputs / " +
                    std::to_string(out_names.size()) + " outputs, but the call has " +
                    std::to_string(args.size()) + " / " + std::to_string(rets.size()));
    for (size_t i = 0; i < args.size(); ++i) {
      auto b = args.get<ffi::AnyBuffer>(i);
      if (!b.has_value()) binding_error("input '" + in_names[i] + "' is not a buffer");
      call.in.add(in_names[i], view(b->untyped_data(), b->element_type(), b->dimensions(), place));
    }
    for (size_t i = 0; i < rets.size(); ++i) {
      auto r = rets.get<ffi::AnyBuffer>(i);
      if (!r.has_value()) binding_error("output '" + out_names[i] + "' is not a buffer");
      ffi::AnyBuffer b = **r;
      call.out.add(out_names[i], view(b.untyped_data(), b.element_type(), b.dimensions(), place));
    }
    // float64 inputs run the reference in double precision (gradient checks under jax x64).
    const TensorView q = call.in["q"];
    call.exec.precision = q.present() && q.dtype == DType::f64 ? Precision::fp64 : Precision::fp32;
    op(call);
    return ffi::Error::Success();
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::invalid_argument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, e.what());
      case ErrorKind::unsupported: return ffi::Error(ffi::ErrorCode::kUnimplemented, e.what());
      case ErrorKind::backend_failure: break;
    }
    return ffi::Error(ffi::ErrorCode::kInternal, e.what());
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("flashgrad: ") + e.what());
  }
}

}  // namespace flashgrad::jax_ffi
