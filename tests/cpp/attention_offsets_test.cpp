// Element offsets past 2^31. q, out and dq get a batch stride of 2^31 + 64 elements, so the rows
// of batch 1 sit more than 8 GiB (float32) past the base pointer: any 32-bit offset arithmetic in
// the backend would read or write the wrong rows. The address space is reserved with mmap
// (MAP_NORESERVE) and only the few touched pages are ever committed. The results must equal,
// bit for bit, those of the same problem in contiguous tensors.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "attention_case.h"

namespace flashgrad::test {
namespace {

class Reservation {
 public:
  explicit Reservation(std::size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p != MAP_FAILED) data_ = static_cast<float*>(p);
    else error_ = std::strerror(errno);
  }
  ~Reservation() {
    if (data_) munmap(data_, bytes_);
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  float* data() const { return data_; }
  const std::string& error() const { return error_; }

 private:
  std::size_t bytes_;
  float* data_ = nullptr;
  std::string error_;
};

TEST(AttentionOffsets, BatchStridePast2To31Elements) {
  AttnConfig cfg;
  cfg.dtype = DType::f32;
  cfg.batch = 2;
  cfg.sq = 5;
  cfg.sk = 6;
  cfg.hq = 2;
  cfg.hk = 1;
  cfg.d = 4;
  cfg.dv = 4;
  cfg.mask = MaskKind::causal;
  cfg.threads = 2;
  auto rng = make_rng();
  const AttnCase c = make_case(cfg, rng);
  const ForwardResult ref_fwd = run_forward(c);
  HostTensor dout = c.random_dout(DType::f32, rng);
  const Gradients ref = run_backward(c, ref_fwd, dout, nullptr, 0.0f);

  // [2, 5, 2, 4] with strides (2^31 + 64, 8, 4, 1).
  const int64_t batch_stride = (int64_t{1} << 31) + 64;
  const std::size_t bytes = static_cast<std::size_t>(batch_stride + 5 * 8) * sizeof(float);
  Reservation q_mem(bytes), out_mem(bytes), dq_mem(bytes);
  for (const Reservation* r : {&q_mem, &out_mem, &dq_mem})
    if (!r->data()) GTEST_SKIP() << "cannot reserve 8 GiB of address space: " << r->error();
  auto big_view = [&](float* data) {
    return TensorView(data, DType::f32, {2, 5, 2, 4}, {batch_stride, 8, 4, 1});
  };
  const TensorView q = big_view(q_mem.data()), out = big_view(out_mem.data()), dq = big_view(dq_mem.data());
  for (int64_t x = 0; x < 2 * 5 * 2 * 4; ++x) {  // logical (n, i, h, e) -> strided offset
    const int64_t n = x / 40, rest = x % 40;
    q.ptr<float>()[n * batch_stride + rest] = static_cast<float>(c.q.get(x));
    out.ptr<float>()[n * batch_stride + rest] = std::nanf("");
    dq.ptr<float>()[n * batch_stride + rest] = std::nanf("");
  }

  AttentionParams p = c.params();
  p.q = q;
  HostTensor lse = c.make(DType::f32, c.lse_shape());
  attention_forward(p, out, lse.view());
  HostTensor dk = c.make(DType::f32, c.k_like(cfg.d)), dv = c.make(DType::f32, c.k_like(cfg.dv));
  AttentionBackwardInputs in;
  in.out = out;
  in.lse = lse.view();
  in.dout = dout.view();
  attention_backward(p, in, dq, dk.view(), dv.view());

  for (int64_t x = 0; x < 2 * 5 * 2 * 4; ++x) {
    const int64_t off = (x / 40) * batch_stride + x % 40;
    const float o = static_cast<float>(ref_fwd.out.get(x)), g = static_cast<float>(ref.dq.get(x));
    EXPECT_EQ(std::memcmp(&out.ptr<float>()[off], &o, 4), 0) << "out element " << x;
    EXPECT_EQ(std::memcmp(&dq.ptr<float>()[off], &g, 4), 0) << "dq element " << x;
  }
  EXPECT_TRUE(same_bits(lse, ref_fwd.lse));
  EXPECT_TRUE(same_bits(dk, ref.dk));
  EXPECT_TRUE(same_bits(dv, ref.dv));
}

}  // namespace
}  // namespace flashgrad::test
