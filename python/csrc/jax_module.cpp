// The nanobind module flashgrad._jax_ffi: XLA FFI handler symbols for every op, on the CPU and
// (in CUDA builds) on CUDA, handed to Python as capsules for jax.ffi.register_ffi_target.
#include <nanobind/nanobind.h>

#include "jax_common.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;
using flashgrad::jax_ffi::OpFn;
using flashgrad::jax_ffi::Place;

namespace {

template <OpFn op>
ffi::Error cpu_call(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return flashgrad::jax_ffi::run(op, Place{}, args, rets, attrs, nullptr);
}

#ifdef FLASHGRAD_WITH_CUDA
template <OpFn op>
ffi::Error cuda_call(void* stream, int32_t device, ffi::ScratchAllocator scratch,
                     ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  const Place place{flashgrad::Device::cuda, device, stream};
  return flashgrad::jax_ffi::run(op, place, args, rets, attrs, &scratch);
}
#endif

}  // namespace

#define FLASHGRAD_CPU_BINDING \
  ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>()
#define FLASHGRAD_CUDA_BINDING                                                                   \
  ffi::Ffi::Bind()                                                                               \
      .Ctx<ffi::PlatformStream<void*>>()                                                         \
      .Ctx<ffi::DeviceOrdinal>()                                                                 \
      .Ctx<ffi::ScratchAllocator>()                                                              \
      .RemainingArgs()                                                                           \
      .RemainingRets()                                                                           \
      .Attrs<ffi::Dictionary>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradAttentionForwardCpu,
                              cpu_call<flashgrad::jax_ffi::attention_forward_op>, FLASHGRAD_CPU_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradAttentionBackwardCpu,
                              cpu_call<flashgrad::jax_ffi::attention_backward_op>, FLASHGRAD_CPU_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradDeltaRuleForwardCpu,
                              cpu_call<flashgrad::jax_ffi::delta_rule_forward_op>, FLASHGRAD_CPU_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradDeltaRuleBackwardCpu,
                              cpu_call<flashgrad::jax_ffi::delta_rule_backward_op>, FLASHGRAD_CPU_BINDING);
#ifdef FLASHGRAD_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradAttentionForwardCuda,
                              cuda_call<flashgrad::jax_ffi::attention_forward_op>, FLASHGRAD_CUDA_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradAttentionBackwardCuda,
                              cuda_call<flashgrad::jax_ffi::attention_backward_op>, FLASHGRAD_CUDA_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradDeltaRuleForwardCuda,
                              cuda_call<flashgrad::jax_ffi::delta_rule_forward_op>, FLASHGRAD_CUDA_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradDeltaRuleBackwardCuda,
                              cuda_call<flashgrad::jax_ffi::delta_rule_backward_op>, FLASHGRAD_CUDA_BINDING);
#endif

namespace {
template <typename Fn>
nb::capsule capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_jax_ffi, m) {
  m.doc() = "flashgrad XLA FFI handlers (registered by flashgrad.jax)";
  // {target name: {platform: capsule}}; platforms as jax.ffi.register_ffi_target spells them.
  m.def("registrations", []() {
    nb::dict targets;
    auto add = [&](const char* name, nb::capsule cpu, nb::object cuda) {
      nb::dict platforms;
      platforms["cpu"] = cpu;
      if (!cuda.is_none()) platforms["CUDA"] = cuda;
      targets[name] = platforms;
    };
#ifdef FLASHGRAD_WITH_CUDA
    add("flashgrad_attention_forward", capsule(FlashgradAttentionForwardCpu), capsule(FlashgradAttentionForwardCuda));
    add("flashgrad_attention_backward", capsule(FlashgradAttentionBackwardCpu), capsule(FlashgradAttentionBackwardCuda));
    add("flashgrad_delta_rule_forward", capsule(FlashgradDeltaRuleForwardCpu), capsule(FlashgradDeltaRuleForwardCuda));
    add("flashgrad_delta_rule_backward", capsule(FlashgradDeltaRuleBackwardCpu), capsule(FlashgradDeltaRuleBackwardCuda));
#else
    add("flashgrad_attention_forward", capsule(FlashgradAttentionForwardCpu), nb::none());
    add("flashgrad_attention_backward", capsule(FlashgradAttentionBackwardCpu), nb::none());
    add("flashgrad_delta_rule_forward", capsule(FlashgradDeltaRuleForwardCpu), nb::none());
    add("flashgrad_delta_rule_backward", capsule(FlashgradDeltaRuleBackwardCpu), nb::none());
#endif
    return targets;
  });
  m.def("cuda_built", []() {
#ifdef FLASHGRAD_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
