/* Pure compute on float32 row-major buffers (docs/conventions.md#kernels, llm.c conventions):
 * op_forward(out, cache..., in, params..., dims) and
 * op_backward(din, dparams..., dout, in, params, cache..., dims); backward
 * ACCUMULATES (+=) into every d-buffer (where a trailing accumulate = 0
 * asks, it writes instead, with the bits a zeroed buffer would get); a
 * NULL d-buffer is skipped.
 * No I/O, no threads of our own, no allocation: scratch is passed in.
 * matmul.c is the only caller of OpenBLAS. */
#ifndef MESHRUN_KERNELS_H
#define MESHRUN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ---- vector instructions of the elementwise kernels (kernels/isa.c) ---- */
/* Each set gives the same bits (kernels/isa.h says why); wider runs faster.
 * The widest the CPU supports is chosen before main. */
enum kernel_isa { KERNEL_ISA_BASE, KERNEL_ISA_AVX2, KERNEL_ISA_AVX512, KERNEL_ISA_COUNT };
enum kernel_isa kernel_isa_best(void);
/* -ENOTSUP if this CPU lacks isa; not thread-safe against running kernels */
int kernel_isa_set(enum kernel_isa isa);
enum kernel_isa kernel_isa(void);
const char *kernel_isa_name(enum kernel_isa isa);

/* ---- matmul (the one BLAS entry point) ---- */
/* out (N,OC) = inp (N,C) . weight(OC,C)^T      [+= if accumulate] */
void matmul_forward(float *out, const float *inp, const float *weight,
		    int N, int C, int OC, int accumulate);
/* dinp (N,C) += dout . weight;  dweight (OC,C) += dout^T . inp */
void matmul_backward(float *dinp, float *dweight, const float *dout,
		     const float *inp, const float *weight, int N, int C, int OC);
/* General sgemm wrapper: C(M,N) = alpha*op(A).op(B) + beta*C, row-major,
 * with leading dimensions, for kernels that need strided views. */
void sgemm_rm(int transA, int transB, int M, int N, int K, float alpha,
	      const float *A, int lda, const float *B, int ldb, float beta,
	      float *C, int ldc);
/* Naive references used by tests. */
void matmul_forward_ref(float *out, const float *inp, const float *weight,
			int N, int C, int OC);
/* Sets OpenBLAS's process-wide thread count (0 leaves it). */
void blas_set_threads(int n);
int blas_get_threads(void);
const char *blas_core_name(void);

/* ---- embedding ---- */
/* out (N,C) = wte[tokens[n]]; tokens (N) in [0,V) */
void embedding_forward(float *out, const int32_t *tokens, const float *wte, int N, int C);
void embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int N, int C);
/* The same with the vocabulary split over devices: wte (Vl,C) holds rows
 * [v0, v0+Vl); a token outside them gives a zero row (the caller sums the
 * partial rows over the vocab devices) and no gradient. */
void embedding_forward_range(float *out, const int32_t *tokens, const float *wte, int v0, int Vl,
			     int N, int C);
void embedding_backward_range(float *dwte, const float *dout, const int32_t *tokens, int v0, int Vl,
			      int N, int C);

/* ---- RMSNorm ---- */
/* inp (N,C), weight (C); rstd (N) cached for backward */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
		     int N, int C, float eps);
void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
		      const float *weight, const float *rstd, int N, int C);

/* Split RMSNorm, for a row spread over devices (columns C of Cg): the
 * caller sums ss (resp. gx) over the devices between the two calls. */
void rmsnorm_partial_sumsq(float *ss, const float *inp, int N, int C);
void rmsnorm_forward_split(float *out, float *rstd, const float *inp, const float *weight,
			   const float *ss, int N, int C, int Cg, float eps);
void rmsnorm_backward_partial(float *gx, const float *dout, const float *inp, const float *weight,
			      int N, int C);
void rmsnorm_backward_split(float *dinp, float *dweight, const float *dout, const float *inp,
			    const float *weight, const float *rstd, const float *gx, int N, int C,
			    int Cg);

/* ---- RoPE (Hugging Face Llama rotate_half: dim i pairs with i + D/2) ---- */
/* cos,sin (T, D/2): theta^(-2i/D) frequencies, positions 0..T-1 */
void rope_table(float *cos_t, float *sin_t, int T, int D, float theta);
/* x (B,T,H,D) rotated in place (out may equal inp) */
void rope_forward(float *out, const float *inp, const float *cos_t, const float *sin_t,
		  int B, int T, int H, int D);
/* dinp += R^T dout   [= if !accumulate: no memset first, the same bits] */
void rope_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t,
		   int B, int T, int H, int D, int accumulate);

/* ---- RoPE on part of each head, adjacent pairs (kernels/mla.c) ----
 * DeepSeek-V3's rope_interleave: dims (off + 2i, off + 2i + 1) of each
 * head rotate together by frequency i. */
/* inp, out (B,T,H,D): dims [off, off + Dr) of each head rotated, the
 * others copied; cos,sin (T, Dr/2); out may equal inp */
void rope_adj_forward(float *out, const float *inp, const float *cos_t, const float *sin_t,
		      int B, int T, int H, int D, int off, int Dr);
/* dinp += J^T dout: R^T on the rotated dims, the others as they are */
void rope_adj_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t,
		       int B, int T, int H, int D, int off, int Dr);
/* YaRN's tables, as Hugging Face computes them: inv_freq blends
 * theta^(-2i/D) (kept) and theta^(-2i/D) / factor (interpolated) by a
 * linear ramp over i between floor(dim(beta_fast)) and ceil(dim(beta_slow)),
 * dim(r) = D ln(orig / (2 pi r)) / (2 ln theta), clamped to [0, D-1]
 * (0 below the ramp: kept; 1 above: interpolated); cos and sin times mult
 * (the attention factor). cos,sin (T, D/2). */
void rope_table_yarn(float *cos_t, float *sin_t, int T, int D, float theta, float factor, int orig,
		     float beta_fast, float beta_slow, float mult);
/* YaRN's mscale(f, m) = 0.1 m ln f + 1, or 1 when f <= 1 */
float rope_yarn_mscale(float factor, float mscale);

/* ---- keys and values of multi-head latent attention (kernels/mla.c) ---- */
/* kvb (N,H,Dn+Dv): kv_b_proj's output, per head [no-rope key | value];
 * kr (N,Dr) the rotary key all heads share. k (N,H,Dn+Dr) = per head
 * [no-rope key | kr], v (N,H,Dv). */
void mla_kv_forward(float *k, float *v, const float *kvb, const float *kr, int N, int H, int Dn, int Dr,
		    int Dv);
/* dkvb += per head [dk's no-rope part | dv]; dkr += dk's rope parts summed
 * over the heads */
void mla_kv_backward(float *dkvb, float *dkr, const float *dk, const float *dv, int N, int H, int Dn,
		     int Dr, int Dv);

/* ---- causal attention, grouped-query ---- */
/* q (B,T,Hq,Dk), k (B,T,Hkv,Dk), v (B,T,Hkv,Dv), out (B,T,Hq,Dv); att
 * (B,Hq,T,T) softmax probabilities cached for backward (upper triangle
 * zero). Scores are scale * q.k (1/sqrt(Dk) for Llama; multi-head latent
 * attention has Dk = nope + rope != Dv and YaRN's factor in it).
 * Hq % Hkv == 0; query head h uses kv head h / (Hq/Hkv). */
void attention_forward(float *out, float *att, const float *q, const float *k,
		       const float *v, int B, int T, int Hq, int Hkv, int Dk, int Dv, float scale);
/* scratch: at least T*T floats; dq, dk, dv +=   [= if !accumulate: no
 * memset first, the same bits] */
void attention_backward(float *dq, float *dk, float *dv, float *scratch,
			const float *dout, const float *q, const float *k, const float *v,
			const float *att, int B, int T, int Hq, int Hkv, int Dk, int Dv, float scale,
			int accumulate);

/* ---- SwiGLU ---- */
/* out (N,H) = silu(gate) * up */
void swiglu_forward(float *out, const float *gate, const float *up, int N, int H);
/* dgate, dup += ...   [= if !accumulate: no memset first, the same bits] */
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
		     const float *up, int N, int H, int accumulate);

/* ---- residual ---- */
void residual_forward(float *out, const float *a, const float *b, int n);

/* ---- softmax cross-entropy ---- */
/* logits (N,V), targets (N); losses (N) per-token -log p; probs (N,V) cached.
 * Returns the mean loss over N (double accumulation). A negative target
 * is masked (a document boundary, a padding row): its loss is 0 and it
 * adds nothing to the total, here and in the split and backward kernels
 * below (backward leaves its row of dlogits alone). */
double softmax_xent_forward(float *losses, float *probs, const float *logits,
			    const int32_t *targets, int N, int V);
/* dlogits += (probs - onehot(target)) * scale   (scale = 1/N for a mean) */
void softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
			   float scale, int N, int V);
/* Cross-entropy over a vocabulary split over devices: logits (N,Vl) are
 * columns [v0, v0+Vl) of V. Three passes with the caller combining
 * statistics over the vocab devices between them:
 *   xent_split_max:   mx (N) = row maxima of the local columns
 *                     (the caller takes the maximum over devices)
 *   xent_split_sums:  st (2N): st[n] = sum exp(x - mx[n]) over the local
 *                     columns, st[N+n] = the target's logit if it is local,
 *                     else 0 (the caller sums st over devices); probs
 *                     (N,Vl) keeps each exp(x - mx[n]) for the last pass
 *   xent_split_finish: losses (N) = log st[n] - (st[N+n] - mx[n]), probs
 *                     scaled into the local softmax columns; returns the
 *                     loss sum
 * and xent_split_backward adds (probs - onehot) * scale to the local
 * columns. */
void xent_split_max(float *mx, const float *logits, int N, int Vl);
void xent_split_sums(float *st, float *probs, const float *logits, const float *mx,
		     const int32_t *targets, int v0, int N, int Vl);
double xent_split_finish(float *losses, float *probs, const float *mx, const float *st,
			 const int32_t *targets, int N, int Vl);
void xent_split_backward(float *dlogits, const float *probs, const int32_t *targets, int v0,
			 float scale, int N, int Vl);

/* ---- MoE (kernels/moe.c) ---- */
enum moe_score { MOE_SOFTMAX = 0, MOE_SIGMOID = 1 };
#define MOE_MAX_EXPERTS 1024
/* How the router chooses and weighs experts (DeepSeek-V3's router when
 * sigmoid with a bias and groups; docs/training-step.md#the-v3-router). */
struct moe_routing {
	int E, k;                /* experts (<= MOE_MAX_EXPERTS), experts per token */
	enum moe_score score;    /* softmax or sigmoid of the logits */
	int norm_topk;           /* chosen weights divided by their sum (+1e-20) */
	float scale;             /* then times routed_scaling_factor */
	/* group-limited selection: E / groups experts per group (at least
	 * 2); a group's score is the sum of its two best selection keys and
	 * only the topk_groups best groups' experts compete (k <= topk_groups
	 * x E / groups). groups <= 1: every expert competes. */
	int groups, topk_groups;
};
/* logits (N,E) -> scores (N,E) (softmax or sigmoid, cached); weights,
 * idx (N,k). Selection key = score + bias (bias (E) may be NULL; only
 * selection sees it, DeepSeek-V3's e_score_correction_bias; NaN ranks
 * last); with groups only the best groups' experts compete; the k best
 * keys win, ties to the lower index (groups too). idx ascending by rank
 * (best first). weights = the chosen UNBIASED scores, divided by their
 * sum + 1e-20 if norm_topk, times scale. */
void moe_router_forward(float *weights, int32_t *idx, float *scores, const float *logits,
			const float *bias, int N, const struct moe_routing *r);
/* dlogits (N,E) += d(weights)/d(logits)^T dweights (N,k): through the
 * chosen experts' unbiased scores; the selection is not differentiated */
void moe_router_backward(float *dlogits, const float *dweights, const float *scores,
			 const int32_t *idx, int N, const struct moe_routing *r);
/* Switch/DeepSeek load-balance loss over N tokens:
 *   L = E/(k) * sum_e f_e * P_e, f_e = (tokens choosing e)/N (constant),
 *   P_e = mean_n p(n,e) with p = scores normalised per token to sum 1.
 * Returns L; counts (E) receives the per-expert token counts. */
double moe_aux_loss_forward(int32_t *counts, const float *scores, const int32_t *idx,
			    int N, int E, int k);
/* Sum over these N tokens of sum_e counts[e] p(n,e) (p = scores
 * normalised per token). With counts of a global batch of Ng tokens spread
 * over replicas, the global loss is E/(k Ng^2) times the sum of this over
 * the replicas. */
double moe_aux_loss_dot(const float *scores, const int32_t *counts, int N, int E);
/* dscores += dL * dL/dscores */
void moe_aux_loss_backward(float *dscores, const float *scores, const int32_t *counts,
			   float dL, int N, int E, int k);
/* dlogits (N,E) += d(scores)/d(logits)^T dscores: the scoring function's
 * own backward, to carry the load-balance loss's dscores to the logits. */
void moe_scores_backward(float *dlogits, const float *dscores, const float *scores,
			 int N, int E, enum moe_score score);
/* DeepSeek-V3 aux-loss-free balancing: bias[e] += rate * sign(mean - counts[e])
 * where counts (E) are the token counts of the whole (global) batch and the
 * mean is over all E. bias holds experts [e0, e0 + n) (a device's slice;
 * 0, E for all of them): bias[j] is expert e0 + j's. */
void moe_bias_update(float *bias, const int32_t *counts, int E, int e0, int n, float rate);
/* Groups the N*k (token, slot) assignments by expert, stable by token:
 * order (N*k) lists flat assignment ids a = n*k + j sorted by (expert, n);
 * offsets (E+1) are the start of each expert's run in order. */
void moe_sort(int32_t *order, int32_t *offsets, const int32_t *idx, int N, int E, int k);
/* xs (N*k, C): xs[r] = x[order[r] / k] */
void moe_gather(float *xs, const float *x, const int32_t *order, int Nk, int k, int C);
/* dx (N,C) += dxs[r] for the token of each row */
void moe_gather_backward(float *dx, const float *dxs, const int32_t *order, int Nk, int k, int C);
/* out (N,C) += weights[a] * ys[r] where a = order[r] */
void moe_combine(float *out, const float *ys, const float *weights, const int32_t *order,
		 int Nk, int k, int C);
/* dys[r] += weights[a] * dout[n];  dweights[a] += dot(dout[n], ys[r]) */
void moe_combine_backward(float *dys, float *dweights, const float *dout, const float *ys,
			  const float *weights, const int32_t *order, int Nk, int k, int C);

/* ---- optimizers (kernels/optim.c) ---- */
/* AdamW, decoupled weight decay, bias-corrected; t is the 1-based step.
 *   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
 *   p -= lr * ( mhat / (sqrt(vhat) + eps) + wd * p ) */
void adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
		  float b1, float b2, float eps, float wd, int t);
/* The same update, bit for bit, with m and v read from m, v and written
 * to mo, vo (other buffers), and the old p and g copied to pk, gk on the
 * way: an update that can be taken back (the trainer's update ahead). */
void adamw_update_keep(float *p, const float *g, const float *m, const float *v, float *mo, float *vo, float *pk,
		       float *gk, size_t n, float lr, float b1, float b2, float eps, float wd, int t);
/* Newton–Schulz orthogonalisation, 5 steps, (a,b,c) = (3.4445, -4.7750,
 * 2.0315), of G (R,C) scaled by 1/(||G||_F + 1e-7); works on the wide
 * orientation internally. out (R,C). scratch >= 3*max(R,C)^2 + 2*R*C floats. */
void newton_schulz5(float *out, const float *G, float *scratch, int R, int C);
/* newton_schulz5 on k matrices of one shape, step-major (each step of
 * every matrix before the next step of any): the same bits per matrix.
 * scratch >= 2 min(R,C)^2 + 2 k R C floats. */
void newton_schulz5_batch(float *const *out, const float *const *G, float *scratch, int k, int R, int C);
/* newton_schulz5's floating-point operations on an (R,C) matrix: five
 * steps of X X^T, A A and B X (r = min(R,C), c = max(R,C)): 10 r^2 (2c + r). */
double newton_schulz5_flops(int R, int C);
/* Muon step on one 2-D matrix: buf = mu buf + g; g' = g + mu buf (Nesterov);
 * O = NS5(g'); p -= lr * (O * sqrt(max(1, R/C)) + wd * p). */
void muon_update(float *p, const float *g, float *buf, float *scratch, int R, int C,
		 float lr, float mu, float wd);
/* muon_update in three parts, for a matrix split over devices: the
 * momentum is elementwise on each device's part (o = g + mu buf after
 * buf = mu buf + g), NS5 needs the whole o, and the update is elementwise
 * again with k = sqrt(max(1, R/C)) of the whole matrix. */
void muon_momentum(float *o, float *buf, const float *g, size_t n, float mu);
/* the update's scale for an R x C matrix: sqrt(max(1, R/C)) */
float muon_scale(int R, int C);
void muon_apply(float *p, const float *o, size_t n, float lr, float k, float wd);
/* sum of squares in double (global-norm clipping sums these across shards) */
double sumsq(const float *x, size_t n);
void scale_inplace(float *x, size_t n, float s);
/* warmup (linear from 0 over warmup steps) then cosine from lr to
 * lr*final_fraction at total steps; step is 0-based. */
float lr_schedule(int step, float lr, int warmup, int total, float final_fraction);

#endif
