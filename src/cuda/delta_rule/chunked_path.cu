// The chunked path (see chunked_path.h): chunk plan, scratch layout, and the stage sequence of
// the forward (1 prepare, 2 state, 3 output) and of the backward (1, 2 again, B1 state backward,
// B2 gradients, then the elementwise finish: L2-norm backward of dq/dk and rounding).
#include "chunked_path.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "chunked_kda.h"
#include "chunked_stages.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "recurrent_launch.cuh"
#include "views.h"

namespace flashgrad::cuda_detail::delta_rule {
namespace {

// Scratch of one call, in the order it is carved off one block (each piece 256-byte aligned).
// rows = B * T token rows; NC chunks; sizes in bytes.
//
// The GDN backward's 16-bit mode (chunked_state16_wanted, the default; session 6) keeps h, dh and
// dv_new in T instead of fp32, puts dh where u was (u's last reader is stage 2, B1 writes dh after
// it; the region is max(u, dh) bytes: equal for full chunks at K = 128), and has B2 write dv,
// dbeta, dg (and with H == HV dq, dk) straight into the user's gradients: no fp32 dv / dbeta / dg
// and, without GVA, no dq / dk accumulators, memset or finish passes. At B8 T4096 H16 K=V=128
// (512 chunks) the backward's scratch goes from 2825 MB (h, dh 537 MB each; u, dv_new, dq_acc,
// dk_acc, dv 268 MB each; A, w, v_new 134 MB each; G, dbeta, dg 2 MB each) to 1076 MB (G 2, A 134,
// w 134, u / dh 268, v_new 134, h 268, dv_new 134).
//
// The forward's scratch holds what its path writes (session 18): the fused state + output kernel (many
// chains, fused_output_wanted) writes no h and no v_new unless kept, the unfused stages h_c in T
// (output_h16_wanted), and no GDN forward writes A. At B8 T4096 H16 K=V=128 (fused, v_new kept) it
// goes from 1078 MB (G 2, colscale 2, A 134, w 134, u 268, h 537) to 406 MB (G, colscale, w, u); at B1
// T32768 H16 (unfused) from 1078 MB to 675 MB (+ h in T, 268).
struct ChunkedScratch {
  ChunkPlanHost plan;
  int64_t rows = 0, num_chunks = 0;
  ChunkedScratchSizes n{};  // element counts of the forward intermediates
  std::size_t elem = 2;     // bytes of one w / v_new element (the input dtype)
  bool kda = false;         // per-channel gate: the KDA stages (G and dg carry a K axis)
  bool half = false;        // the backward's 16-bit mode (h, dh, dv_new in T; direct outputs)
  bool gva = false;         // H < HV: dq, dk still summed over each group in fp32 accumulators
  bool dvn_in_w = false;    // 16-bit mode: dv_new in w's region (dv_new_in_w_allowed)
  bool chains = false;      // 16-bit mode: stage 2 beside B1 in one launch (state_chains_wanted), dh in its own buffer
  bool kept = false;        // v_new lives in the caller's saved_v_new: no scratch for it
  bool forward_only = true;  // the scratch of a forward call
  bool fused_fwd = false;   // a GDN / plain forward on the fused state + output path: no h, v_new only if kept
  bool fwd_h16 = false;     // a GDN / plain forward on the unfused path with h_c in T (output_h16_wanted)
  int64_t colscale_elems = 0;  // stage 1's row scales of the state update, [rows, HV] fp32 (not KDA)

  // `backward`: the scratch of a backward call (the 16-bit mode applies there only; the forward's own
  // choice of h_c's type is fwd_h16). `kept_v_new`: v_new is the caller's saved_v_new (the forward writes it, the
  // backward reads it: no stage 2 there, so no chains launch either).
  ChunkedScratch(const DeltaRuleProblem& pr, DType dtype, bool backward = false, bool kept_v_new = false)
      : kept(kept_v_new), forward_only(!backward) {
    plan = make_chunk_plan(pr.batch, pr.seq_len, pr.cu_seqlens);
    rows = pr.batch * pr.seq_len;
    num_chunks = static_cast<int64_t>(plan.chunks.size());
    kda = pr.gate == GateKind::per_channel;
    n = kda ? kda_scratch_sizes(rows, num_chunks, pr.value_heads, pr.key_dim, pr.value_dim)
            : chunked_scratch_sizes(rows, num_chunks, pr.value_heads, pr.key_dim, pr.value_dim,
                                    pr.gate != GateKind::none);
    elem = dtype_size(dtype);
    colscale_elems = kda ? 0 : rows * pr.value_heads;
    half = backward && !kda && chunked_state16_wanted();
    gva = pr.heads != pr.value_heads;
    int dev = 0, sms = 0;
    FLASHGRAD_CUDA_CHECK(cudaGetDevice(&dev));
    FLASHGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // The forward's path, by the rules its launcher follows (launch_chunked_forward): what it writes
    // is what its scratch holds.
    if (!backward && !kda) {
      fused_fwd = fused_output_wanted(pr.num_seqs, pr.value_heads, pr.value_dim, sms);
      fwd_h16 = !fused_fwd && output_h16_wanted();
    }
    // dv_new in w's region where that is race-free (dv_new_in_w_allowed decides, the one place that
    // does: the default since run 9.1, FLASHGRAD_CHUNKED_DVNEW_IN_W=0 turns it off).
    if (half) {
      dvn_in_w = dv_new_in_w_allowed(pr.num_seqs * pr.value_heads, pr.key_dim, pr.value_dim, sms);
      chains = !kept_v_new && !dvn_in_w &&
               state_chains_wanted(pr.num_seqs * pr.value_heads, pr.key_dim, pr.value_dim, sms);
    }
  }
  // Bytes of one h / dh element.
  std::size_t state_elem() const { return half || fwd_h16 ? elem : 4; }
  // What stages 1-3 write, in forward_args' order: A only where read (the backward's B2, KDA's output;
  // a GDN forward writes none), v_new unless kept or the fused forward (which writes none), h unless
  // the fused forward (at B8 T4096 H16 K=V=128: 537 MB of fp32 h and 134 MB of A less than session 17's
  // sizing; the unfused forward's h in T, 268 MB).
  bool has_A() const { return kda || !forward_only; }
  bool has_v_new() const { return !kept && !fused_fwd; }
  bool has_h() const { return !fused_fwd; }
  std::size_t forward_bytes() const {
    return align_up(sizeof(ChunkInfo) * plan.chunks.size()) + align_up(8 * plan.seq_first_chunk.size()) +
           align_up(4 * n.G) + align_up(4 * colscale_elems) + (has_A() ? align_up(4 * n.A) : 0) +
           align_up(elem * n.w) + align_up(u_bytes()) + (has_v_new() ? align_up(elem * n.v_new) : 0) +
           (has_h() ? align_up(state_elem() * n.h) : 0);
  }
  // u's region: in the 16-bit mode also dh's, after stage 2.
  std::size_t u_bytes() const { return half ? std::max<std::size_t>(4 * n.u, elem * n.h) : 4 * n.u; }
  // Backward adds dh (as h), dv_new, dq/dk accumulators, dv, dbeta, dg (all fp32); in the 16-bit
  // mode only dv_new (T; dh is in u's region, or with `chains` its own) and, with GVA, the dq/dk
  // accumulators.
  std::size_t backward_bytes(const DeltaRuleProblem& pr) const {
    const int64_t qk = rows * pr.heads * pr.key_dim, vv = rows * pr.value_heads * pr.value_dim,
                  per_head = rows * pr.value_heads;
    // (+ B0's row scales of do for B1, fp32 [rows, HV]; + the split B2's dG_state, fp32 [rows, HV], with a gate)
    if (half)
      return forward_bytes() + (dvn_in_w ? 0 : align_up(elem * vv)) + (chains ? align_up(elem * n.h) : 0) +
             (gva ? 2 * align_up(4 * qk) : 0) + align_up(4 * per_head) +
             (pr.gate != GateKind::none ? align_up(4 * per_head) : 0);
    return forward_bytes() + align_up(4 * n.h) + align_up(4 * vv) + 2 * align_up(4 * qk) + align_up(4 * vv) +
           align_up(4 * per_head) + (pr.gate != GateKind::none ? align_up(4 * dg_elems(pr)) : 0);
  }
  // dg accumulator: one per (row, value head), times K for per-channel gates.
  int64_t dg_elems(const DeltaRuleProblem& pr) const {
    return rows * pr.value_heads * (kda ? pr.key_dim : 1);
  }
};

// Uploads the plan and points the forward intermediates into `buf`.
ChunkedArgs forward_args(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const ChunkedScratch& cs,
                         ScratchBuffer& buf, cudaStream_t s) {
  ChunkedArgs a;
  set_inputs_and_sizes(a, p, pr);
  auto* chunks = buf.take<ChunkInfo>(sizeof(ChunkInfo) * cs.plan.chunks.size());
  auto* first = buf.take<int64_t>(8 * cs.plan.seq_first_chunk.size());
  // Pageable sources: staged before cudaMemcpyAsync returns, so `cs` may go out of scope after.
  if (!cs.plan.chunks.empty())
    FLASHGRAD_CUDA_CHECK(cudaMemcpyAsync(chunks, cs.plan.chunks.data(), sizeof(ChunkInfo) * cs.plan.chunks.size(),
                                         cudaMemcpyHostToDevice, s));
  FLASHGRAD_CUDA_CHECK(cudaMemcpyAsync(first, cs.plan.seq_first_chunk.data(), 8 * cs.plan.seq_first_chunk.size(),
                                       cudaMemcpyHostToDevice, s));
  a.chunks = chunks;
  a.seq_first_chunk = first;
  a.num_chunks = cs.num_chunks;
  a.num_seqs = pr.num_seqs;
  a.uniform_chunks = cs.plan.uniform_chunks;
  a.G = cs.n.G ? buf.take<float>(4 * cs.n.G) : nullptr;
  a.colscale = cs.colscale_elems ? buf.take<float>(4 * cs.colscale_elems) : nullptr;
  if (!stage1_colscale_wanted()) a.colscale = nullptr;  // (its space stays taken: the same scratch size)
  a.A = cs.has_A() ? buf.take<float>(4 * cs.n.A) : nullptr;
  a.w = buf.take<char>(cs.elem * cs.n.w);
  a.u = buf.take<float>(cs.u_bytes());
  // (kept: the caller's, set after; the fused forward without it: none)
  a.v_new = cs.has_v_new() ? buf.take<char>(cs.elem * cs.n.v_new) : nullptr;
  if (!cs.has_h()) {
    // the fused forward: no h (launch_chunked_forward takes the fused kernel when given none)
  } else if (cs.half || cs.fwd_h16) {
    a.h16 = buf.take<char>(cs.elem * cs.n.h);
  } else {
    a.h = buf.take<float>(4 * cs.n.h);
  }
  return a;
}

template <typename F>
void by_half_dtype(DType dt, F&& f) {
  if (dt == DType::bf16)
    f(__nv_bfloat16{});
  else
    f(__half{});
}

// The backward's stages up to B1 when it reads the forward's kept v_new: stage 1 without u (its
// reader, stage 2, does not run), the states rebuilt from v_new with u's dead region as their segment
// workspace, then B1 (which in the 16-bit mode writes dh over u's region).
template <typename T>
void kept_v_new_stages(const ChunkedArgs& a, const ChunkedScratch& cs, cudaStream_t stream) {
  ChunkedArgs a1 = a;
  a1.u = nullptr;
  launch_chunk_prepare<T>(a1, stream);
  launch_chunk_state_from_vnew<T>(a, a.u, static_cast<int64_t>(cs.u_bytes() / 4), stream);
  launch_chunk_state_backward<T>(a, stream);
}

Gate gate_code(GateKind g) {
  return g == GateKind::scalar ? Gate::scalar : (g == GateKind::per_channel ? Gate::per_channel : Gate::none);
}

}  // namespace

bool chunked_path_takes(const DeltaRuleParams& p, const DeltaRuleProblem& pr, bool wants_saved_r) {
  if (p.algorithm != DeltaRuleAlgorithm::chunked || wants_saved_r) return false;
  if (p.exec.precision != Precision::fp32) return false;
  if (pr.gate == GateKind::per_channel) return kda_stages_support(p.q.dtype, pr.key_dim, pr.value_dim).empty();
  return chunked_stages_support(p.q.dtype, pr.key_dim, pr.value_dim, false).empty();
}

std::size_t chunked_forward_scratch_bytes(const DeltaRuleProblem& pr, DType dtype, bool kept_v_new) {
  return ChunkedScratch(pr, dtype, false, kept_v_new).forward_bytes();
}

std::size_t chunked_backward_scratch_bytes(const DeltaRuleProblem& pr, DType dtype, bool kept_v_new) {
  return ChunkedScratch(pr, dtype, true, kept_v_new).backward_bytes(pr);
}

void chunked_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleForwardOutputs& out,
                     Workspace ws, cudaStream_t stream) {
  const ChunkedScratch cs(pr, p.q.dtype, false, out.saved_v_new.present());
  ScratchBuffer buf(ws, cs.forward_bytes(), stream);
  ChunkedArgs a = forward_args(p, pr, cs, buf, stream);
  a.o = view_of(out.o);
  a.ht = view_of(out.final_state);
  if (out.saved_v_new.present()) {  // v_new into the caller's tensor (dense [rows, HV, V], validated)
    a.v_new = out.saved_v_new.data;
    a.keep_v_new = true;
  }
  by_half_dtype(p.q.dtype, [&](auto tag) {
    if (cs.kda)
      launch_kda_forward<decltype(tag)>(a, stream);
    else
      launch_chunked_forward<decltype(tag)>(a, stream);
  });
}

void chunked_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleBackwardInputs& in,
                      const DeltaRuleGrads& grads, Workspace ws, cudaStream_t stream) {
  // With the forward's v_new kept (in.saved_v_new), the states come from it (launch_chunk_state_from_vnew:
  // chunk-parallel products, a decayed sum over the chunks) instead of stage 2's serial recomputation.
  const bool kept = in.saved_v_new.present();
  const ChunkedScratch cs(pr, p.q.dtype, true, kept);
  ScratchBuffer buf(ws, cs.backward_bytes(pr), stream);
  ChunkedArgs a = forward_args(p, pr, cs, buf, stream);
  if (kept) a.v_new = in.saved_v_new.data;
  const int64_t rows = cs.rows;
  const int64_t qk = rows * pr.heads * pr.key_dim, vv = rows * pr.value_heads * pr.value_dim,
                per_head = rows * pr.value_heads;
  a.dout = view_of(in.dout);
  a.dht = view_of(in.dht);
  a.dh0 = view_of(grads.dh0);
  if (cs.half) {
    // u is dead once stage 2 has run (see ChunkedScratch), unless stage 2 runs beside B1.
    a.dh16 = cs.chains ? buf.take<char>(cs.elem * cs.n.h) : static_cast<void*>(a.u);
    a.dv_new16 = cs.dvn_in_w ? a.w : buf.take<char>(cs.elem * vv);
    a.rowscale = buf.take<float>(4 * per_head);
    a.dv_out = view_of(grads.dv);
    a.dbeta_out = view_of(grads.dbeta);
    if (pr.gate != GateKind::none) {
      a.dg_out = view_of(grads.dg);
      a.dG_state = buf.take<float>(4 * per_head);
    }
    if (!cs.gva) {
      a.dq_out = view_of(grads.dq);
      a.dk_out = view_of(grads.dk);
    } else {  // B2 adds each value head's dq, dk into its key head's rows (atomics): start from zero
      a.dq_acc = buf.take<float>(4 * qk);
      a.dk_acc = buf.take<float>(4 * qk);
      FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(a.dq_acc, 0, 4 * static_cast<std::size_t>(qk), stream));
      FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(a.dk_acc, 0, 4 * static_cast<std::size_t>(qk), stream));
    }
    by_half_dtype(p.q.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (kept) {
        kept_v_new_stages<T>(a, cs, stream);
      } else {
        launch_chunk_prepare<T>(a, stream);  // stages 1-2 again (o and the final state not needed)
        if (cs.chains) {
          launch_chunk_state_chains<T>(a, stream);  // B0, then stage 2 and B1 side by side in one launch
        } else {
          launch_chunk_state<T>(a, stream);
          // The experiment of states_from_vnew_wanted (chunked_stages.h): the states rebuilt from v_new.
          // Its segment pass's workspace is u's region: dead after stage 2, dh's only from B1 on.
          if (states_from_vnew_wanted())
            launch_chunk_state_from_vnew<T>(a, a.u, static_cast<int64_t>(cs.u_bytes() / 4), stream);
          launch_chunk_state_backward<T>(a, stream);
        }
      }
      launch_chunk_grads<T>(a, stream);
      if (cs.gva) launch_chunk_qk_finish<T>(a, view_of(grads.dq), view_of(grads.dk), pr.batch, stream);
    });
    return;
  }
  a.dh = buf.take<float>(4 * cs.n.h);
  a.dv_new = buf.take<float>(4 * vv);
  a.dq_acc = buf.take<float>(4 * qk);
  a.dk_acc = buf.take<float>(4 * qk);
  a.dv = buf.take<float>(4 * vv);
  a.dbeta = buf.take<float>(4 * per_head);
  a.dg = pr.gate != GateKind::none ? buf.take<float>(4 * cs.dg_elems(pr)) : nullptr;
  // B2 adds each value head's dq, dk into its key head's rows (atomics): start from zero.
  FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(a.dq_acc, 0, 4 * static_cast<std::size_t>(qk), stream));
  FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(a.dk_acc, 0, 4 * static_cast<std::size_t>(qk), stream));

  // The finish kernels read the accumulators through the recurrent path's argument struct.
  RecurrentArgs f;
  set_inputs_and_sizes(f, p, pr);
  f.dq_acc = a.dq_acc;
  f.dk_acc = a.dk_acc;
  f.dbeta_acc = a.dbeta;
  f.dg_acc = a.dg;  // complete per step: no per-sequence constant (dg_const stays null)

  by_half_dtype(p.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Stages 1-2 again (o and the final state are not needed: a.o, a.ht stay null).
    if (kept) {  // (fp32 mode, FLASHGRAD_CHUNKED_STATE16=0)
      kept_v_new_stages<T>(a, cs, stream);
      launch_chunk_grads<T>(a, stream);
    } else if (cs.kda) {
      launch_kda_prepare<T>(a, stream);
      launch_kda_state<T>(a, stream);
      launch_kda_state_backward<T>(a, stream);
      launch_kda_grads<T>(a, stream);
    } else {
      launch_chunk_prepare<T>(a, stream);
      launch_chunk_state<T>(a, stream);
      launch_chunk_state_backward<T>(a, stream);
      launch_chunk_grads<T>(a, stream);
    }
    launch_finish<T>(f, view_of(grads.dq), view_of(grads.dk), view_of(grads.dbeta), view_of(grads.dg), pr.batch,
                     pr.num_seqs, gate_code(pr.gate), stream);
    launch_chunk_dv_finish<T>(a, view_of(grads.dv), pr.batch, stream);
  });
}

}  // namespace flashgrad::cuda_detail::delta_rule
