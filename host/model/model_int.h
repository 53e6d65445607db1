/* Private to host/model: the model's state and the calls between its
 * files. They go one way only:
 *
 *	model.c  -> layer.c -> moe.c
 *	model.c  -> bsplit.c (the batch split's layers) -> layer.c, moe.c
 *	layer.c, bsplit.c -> the attention model.c chose (struct attn_ops:
 *	            attn.c or attn_mla.c), through the table only
 *	all of them -> wgrad.c (weight gradients now or recorded for later),
 *	            params.c (table, placement), window.c (FSDP window)
 *
 * wgrad.c, params.c and window.c call nothing of the others. */
#ifndef MESHRUN_MODEL_INT_H
#define MESHRUN_MODEL_INT_H

#include "host/model/model.h"
#include "host/model/window.h"
#include "host/mesh/plan.h"

/* Parameter ids; each SwiGLU's gate, up and down follow each other.
 * Attention has wq, wk, wv, wo (grouped-query) or wq (q_lora_rank 0) or
 * wq_a, q_a_norm, wq_b, then wkv_a, kv_a_norm, wkv_b, wo (latent). */
enum {
	P_EMBED, P_ATTN_NORM, P_WQ, P_WK, P_WV,
	P_WQ_A, P_Q_A_NORM, P_WQ_B, P_WKV_A, P_KV_A_NORM, P_WKV_B,
	P_WO, P_MLP_NORM,
	P_W_GATE, P_W_UP, P_W_DOWN,
	P_ROUTER, P_ROUTER_BIAS, P_E_GATE, P_E_UP, P_E_DOWN,
	P_S_GATE, P_S_UP, P_S_DOWN,
	P_FINAL_NORM, P_LM_HEAD, P_COUNT
};

/* Saved activations of one layer (pointers into one allocation): what
 * its backward needs besides its input. */
struct layer_acts {
	float *ln1, *rstd1, *q, *k, *v, *att, *atty, *xmid, *ln2, *rstd2;
	/* latent attention: the q latent before and after its norm, the kv
	 * latent and the rotary key [N, Rkv + Dr] (kv before its norm), the
	 * kv latent normed */
	float *qa, *qrstd, *qn, *kva, *kvrstd, *kvn;
	/* dense */
	float *g, *u, *h;
	/* moe */
	float *scores, *weights, *xs, *eg, *eu, *eh, *ey, *sg, *su, *sh;
	int32_t *idx, *order, *offsets, *counts;
	/* expert parallelism: rows received for this device's experts (from
	 * each source device, by expert), their outputs, and the exchange */
	float *xr, *yr;
	int32_t *cnt_all;           /* [ep, E] every device's per-expert counts */
	size_t *send_b, *recv_b;    /* [ep] bytes of rows to/from each device */
};

/* One weight gradient deferred by an input-gradient backward (wgrad.c):
 * dW(id, layer l) [woff ..] += dout^T inp (a linear of N rows, C in, OC
 * out), or an RMSNorm weight's sum of dout * inp * rstd; the operands
 * point into the tape's own memory. */
enum wg_op { WG_LINEAR, WG_NORM };
struct wg_entry {
	uint8_t op, id;
	int l;
	size_t woff;
	const float *dout, *inp, *rstd;
	int N, C, OC;
};

#define WG_MEMO 16

/* A layer's input that several weights read (an activation, unchanged
 * during the backward): copied once. */
struct wg_memo {
	const float *src;
	size_t n;
	const float *copy;
};

/* One layer's weight gradients waiting for their W: the calls in order
 * and the bytes they read. layer is -1 when it holds none. */
struct wg_tape {
	int layer;
	int n, cap;
	struct wg_entry *e;
	float *mem;
	size_t used, mcap;
	int nmemo;
	struct wg_memo memo[WG_MEMO];
};

struct model;

/* One attention implementation (attention_type), chosen once in
 * model_new. forward: out (N, C) = the attention block of layer l on the
 * normed input ln (N, C), output projection included and its partial
 * sums reduced; what the backward needs is saved in m->la[l]. backward:
 * dln (N, C) += dL/dln, complete (every partial sum of it reduced), from
 * dout = dL/dout; the block's weight gradients accumulate. */
struct attn_ops {
	void (*forward)(struct model *m, int l, float *out, const float *ln);
	void (*backward)(struct model *m, int l, float *dln, const float *dout, const float *ln);
};

extern const struct attn_ops attn_gqa; /* attn.c */
extern const struct attn_ops attn_mla; /* attn_mla.c */

struct model {
	struct model_dims d;        /* the whole model */
	const struct attn_ops *attn; /* grouped-query or latent attention */
	struct model_dims l;        /* what this device computes on */
	int SF;                     /* shared-expert hidden here */
	int El;                     /* local experts */
	/* placement */
	const struct mesh *mesh;
	int device;
	int coord[AX_COUNT];
	int pipe_stages, pipe_repeats; /* model_mesh's layer order (0: none) */
	bool pipe_v;                   /* and ZB-V's V instead of the circle */
	int pipe_first, pipe_layers;   /* and its pipelined layers */
	int pipe_weight_slots;         /* model_mesh's: layer groups the window keeps */
	uint32_t rows, ax_emb, ax_vocab, ax_exp, ax_moe_out;
	int v0, c0, e0;             /* first vocab row, embedding column, expert here */
	int v0e, Ve;                /* the embedding table's rows here */
	int ep;                     /* devices experts are spread over */
	int *ep_blk;                /* [ep] expert block of each of them */
	bool ep_permute;            /* ep_blk is not the identity */
	struct plan_param pp[P_COUNT];
	struct plan_linear pl[P_COUNT];
	const char *lin_name[P_COUNT]; /* planned linear layers, by id */
	int lin_w[P_COUNT];            /* and the weight each multiplies by */
	struct win *win;            /* FSDP: gathered weights, by parameter id */
	/* model_set_parts: called between a layer's attention and
	 * feed-forward blocks (forward: before the MLP norm; backward: after
	 * its weight gradient) and in the attention block's backward, with
	 * the parts (masks) named below, or NULL */
	int (*mid)(void *ctx, int l, bool backward, unsigned parts);
	void *mid_ctx;
	unsigned part_ffn;          /* the feed-forward block's part */
	unsigned part_att;          /* sent after wk's weight gradient in
				     * layer 0: wo's, wq's and wk's
				     * (grouped-query, four parts), or 0 */
	unsigned part_down;         /* the down projection's, in part_ffn:
				     * model_set_fine's layers' W send it
				     * first, or 0 */
	int fine_l;                 /* model_set_fine: a layer whose weight
				     * gradients go as layer 0's, or -1 */
	float *nstat;               /* [2N] split-norm / split-softmax statistics */
	float *xstat;               /* [ngather * N] gathered maxima */
	size_t rmax;                /* rows an expert device may receive */
	struct model_step *st;      /* the step in progress */
	int hook_rc;                /* its first hook error */
	int B, N;
	struct param_info p[P_COUNT];
	int pidx[P_COUNT];          /* index into the table or -1 */
	struct param_info table[MODEL_MAX_PARAMS];
	int ntable;
	struct model_bucket bucket[MODEL_MAX_PARAMS];
	int nbucket;
	size_t numel;
	float *params, *grads;
	/* activations (see lay_out in model.c) */
	int act_layers;             /* layers whose saved activations a set
				     * stores: L, or in a pipeline stage the
				     * Lps it runs at once (la[l] then shares
				     * la[l mod Lps]'s storage) */
	int call_layers;            /* layers one call may run */
	int act_sets;               /* sets of saved activations */
	struct layer_acts *la_all;  /* [act_sets, L] */
	float **resid_all;          /* [act_sets] call_layers - 1 slots of
				     * [N, C]: the inputs of a call's layers
				     * after its first */
	struct layer_acts *la;      /* the set in use (model_act_set) */
	float *resid;               /* its slots */
	float *stream;              /* [2, N, C] model_forward's (no pipeline) */
	float *lnf, *rstdf, *logits, *probs, *losses;
	float *cos_t, *sin_t;
	float att_scale;            /* attention scores = att_scale * q.k */
	/* backward scratch */
	float *dresid, *dln, *dbig1, *dbig2, *dbig3, *dq, *dk, *dv, *dqr, *dkr, *datty,
	      *att_scratch, *dlogits, *dscores, *dweights, *dxs, *dey, *dlogits_r, *dxr, *dyr;
	/* latent attention's: kv_b_proj's output (its forward's too), the
	 * gradients of [normed kv latent | rotary key], of the kv latent, of
	 * the normed and the raw q latent */
	float *dkvb, *dlat, *dkva, *dqn, *dqa;
	int32_t *counts_all;        /* [L_moe, E] */
	int32_t *counts_tmp;        /* [replicas, L_moe, E] */
	enum model_counts counts_how; /* how a forward records them */
	/* the split backward's stashes (model_w_stash): wg_sets sets of a
	 * tape per layer, layer l in the tape of the first layer of its
	 * residue mod act_layers and kind, as the activations */
	int wg_sets;
	bool wg_reads_acts;         /* W reads inputs in place (model_mesh) */
	struct wg_tape **wg_all;    /* [wg_sets, L] */
	struct wg_tape **wg_set;    /* the set in use */
	struct wg_tape *wg;         /* the tape I is recording (NULL: weight
				     * gradients are computed at once) */
	void *act_mem;
	size_t act_bytes;
	/* The batch split (model_dims.bsplit 2, bsplit.c): this struct runs
	 * the first half of the rows (B and N are a half's) and `other` the
	 * second, a copy of it that shares everything (weights, window,
	 * plans, expert counts) but the activations and scratch above; NULL
	 * otherwise. half is 0 or 1. With use_batch_split_schedule stagger is
	 * set in both halves: their MoE layers run staggered and the expert
	 * exchanges in the background (a2a is the one in flight, or NULL);
	 * else one half's layer runs after the other's, the same pieces. */
	struct model *other;
	bool stagger;
	int half;
	void *a2a;
	/* Half 0's record of what crosses from one stage call to the next
	 * (bsplit.c): the MoE layer whose second-half forward is left to
	 * finish (-1: none), the rows it writes and how it records its expert
	 * counts; the MoE layer whose second-half combine backward was
	 * started early (-1: none) and the gradient rows it read. */
	int fwd_left, bwd_early;
	float *fwd_left_y, *bwd_early_d;
	enum model_counts fwd_left_how;
	/* half 0, with expert parallelism: both halves' expert counts, then
	 * every device's, gathered once a MoE layer ([1 + ep, 2, E]) */
	int32_t *cnt2;
};

/* ---- params.c ---- */

/* The table, the plans and the layout, no buffers; NULL with *rc
 * (-EINVAL: a sharding that cannot be made; -ENOMEM) and err. */
struct model *params_make(const struct model_dims *d, const struct model_mesh *mm, int *rc,
			  char *err, size_t errlen);
/* Frees what params_make allocated besides the struct. */
void params_free(struct model *m);
/* The layers [*first, *first + *count) stacked parameter id has slices
 * for (0, 0 when not stacked). */
void param_layers(const struct model *m, int id, int *first, int *count);
/* The slice of stacked parameter id that layer l uses, or -1. */
int layer_slot(const struct model *m, int id, int l);
int mesh_axes_size_or1(const struct model *m, uint32_t mask);

/* Sums buf over axes (partial sums the plan named). A failure is
 * remembered and reported after the pass; none starts after it. */
static inline void psum(struct model *m, uint32_t axes, float *buf, size_t n)
{
	if (axes && !m->hook_rc)
		m->hook_rc = m->st->comm->all_reduce(m->st->comm->ctx, axes, buf, n);
}

/* Compute-shaped weights (or gradients) of parameter id for layer l: the
 * gathered window, or this device's storage (a slice of it for a
 * replicated norm under a split embedding). NULL for an absent one. */
static inline float *wsel(struct model *m, bool grads, int id, int l)
{
	if (m->pidx[id] < 0)
		return NULL;
	if (m->pp[id].gather)
		return win_block(m->win, grads, id, l);
	const struct param_info *p = &m->p[id];
	float *b = (grads ? m->grads : m->params) + p->offset +
		   (p->stacked ? param_slice_numel(p) * (size_t)layer_slot(m, id, l) : 0);
	if (m->pp[id].slice)
		b += m->c0;
	return b;
}

/* Whether parameter id is the feed-forward block's (its part, model_set_parts). */
static inline bool model_ffn_id(int id)
{
	return id >= P_MLP_NORM && id < P_FINAL_NORM;
}

/* Whether layer l's weight gradients go in layer 0's parts (its
 * attention block's by projection: model_set_parts, model_set_fine). */
static inline bool model_fine_grads(const struct model *m, int l)
{
	return m->part_att && (l == 0 || l == m->fine_l);
}

/* Whether a W of layer l sends its down projection's gradients apart,
 * first (model_set_fine, a dense layer: its downs are the tape's first
 * entries, written before any other feed-forward weight gradient). */
static inline bool model_fine_down(const struct model *m, int l)
{
	return m->part_down && m->fine_l >= 0 && (l == 0 || l == m->fine_l) && l < m->l.L_dense;
}

/* The parts hook (model_set_parts) with mask parts (0: nothing); a
 * failure is the pass's, as a collective's. Not in a batch-split
 * backward: a half's weight gradients are not the layer's yet (the
 * layer's reduce-scatter sends them all). */
static inline void model_mid(struct model *m, int l, bool backward, unsigned parts)
{
	if (m->mid && parts && !m->hook_rc && !(backward && (m->other || m->half)))
		m->hook_rc = m->mid(m->mid_ctx, l, backward, parts);
}

/* Whether this first write of n floats of parameter id's gradient of
 * layer l, from its start, may write instead of add: its FSDP window
 * block's zeroing was deferred (win_grad_write; else it is zeroed now,
 * or it was never deferred). */
static inline bool grad_first(struct model *m, int id, int l, size_t n)
{
	return m->pidx[id] >= 0 && m->pp[id].gather && win_grad_write(m->win, id, l, n);
}

#define WP(id, l) wsel(m, false, id, l)
#define GP(id, l) wsel(m, true, id, l)

/* A call on half x of a batch-split model m starts with m's step error
 * and leaves its own in m, so neither half starts a collective after
 * either failed (no-ops for x == m). */
static inline void half_enter(const struct model *m, struct model *x)
{
	x->hook_rc = m->hook_rc;
}

static inline void half_leave(struct model *m, const struct model *x)
{
	if (!m->hook_rc)
		m->hook_rc = x->hook_rc;
}

/* ---- layer.c ---- */

/* One layer on the model's N rows: y (N, C) from x (N, C), saving what
 * the backward needs in m->la[l]. */
void layer_forward(struct model *m, int l, float *y, const float *x);
/* d holds dL/dy on entry and dL/dx on return; x as in the forward.
 * Each weight gradient goes to wgrad.c: accumulated at once, or recorded
 * into the tape wg_record named. */
void layer_backward(struct model *m, int l, float *d, const float *x);
/* RMSNorm over the embedding, which may be split over devices. */
void norm_forward(struct model *m, float *out, float *rstd, const float *x, const float *w);
void norm_backward(struct model *m, float *dx, float *dw, const float *dout, const float *x,
		   const float *w, const float *rstd);
/* The pieces of MoE layer l's feed-forwards (the rows moe_expert_rows
 * names): the routed experts on the rows they received, Y = their
 * outputs; the shared experts on the normed input, out = (acc: +=)
 * their output; both partial over the hidden's axes. Backward: dX, dln
 * += the input gradients (dX zeroed by moe_return_backward), weight
 * gradients accumulated. */
void layer_experts_forward(struct model *m, int l, const float *X, float *Y);
void layer_shared_forward(struct model *m, int l, float *out, bool acc);
void layer_experts_backward(struct model *m, int l, const float *X, const float *dY, float *dX);
void layer_shared_backward(struct model *m, int l, float *dln, const float *dres);

/* ---- wgrad.c ---- */

/* Where the backward writes an output gradient a weight gradient reads
 * (n floats, uninitialised): scratch when gradients are computed at
 * once, else the tape's memory. */
float *wg_out(struct model *m, float *scratch, size_t n);
/* What a weight gradient reads: buf itself when gradients are computed
 * at once, else a copy in the tape (keep: a buffer the backward may
 * write again; keep_act: a saved activation or the call's input, copied
 * once per layer however many weights read it, or read in place when
 * the model's W reads activations). */
const float *wg_keep(struct model *m, const float *buf, size_t n);
const float *wg_keep_act(struct model *m, const float *buf, size_t n);
/* dW += dout^T inp for weight id of layer l (its gradient block from
 * woff floats), or RMSNorm weight id's gradient: now, or recorded. The
 * operands come from wg_keep / wg_keep_act. */
void wg_linear(struct model *m, int id, int l, size_t woff, const float *dout, const float *inp,
	       int N, int C, int OC);
void wg_norm(struct model *m, int id, int l, const float *dout, const float *x, const float *rstd,
	     int N, int C);
/* The weight gradients that follow go into tape t for layer l (t NULL:
 * computed at once). t must hold no layer. */
void wg_record(struct model *m, struct wg_tape *t, int l);
/* Runs the weight gradients t holds for layer l; t holds none after. */
void wg_replay(struct model *m, struct wg_tape *t, int l);
/* Bounds of one tape of a dense or MoE layer: floats and entries. */
size_t wg_layer_floats(const struct model *m, bool moe);
int wg_layer_entries(const struct model *m, bool moe);

/* ---- moe.c ---- */

#define MOE_MAX_BLOCKS 1024         /* num_experts <= 1024 */

/* The blocks of X this device's experts process: block b is rows
 * [start[b], start[b] + rows[b]) for local expert w[b]. Returns their
 * number (0 after a failure). */
int moe_expert_blocks(const struct model *m, int l, int *start, int *rows, int *w);
/* Router, top-k, sort by expert, the expert inputs gathered and, with
 * expert parallelism, sent to the experts' devices. *X: the rows this
 * device's experts read, *Y: where they write their outputs. */
void moe_route_forward(struct model *m, int l, float **X, float **Y);
/* moe_route_forward in two parts, for a caller that learns every
 * device's counts (la[l].cnt_all) itself between them: the router, the
 * sort and the expert inputs gathered (moe_route_prepare); with expert
 * parallelism, the rows sent to the experts' devices (moe_dispatch_start,
 * nothing without). */
void moe_route_prepare(struct model *m, int l);
void moe_dispatch_start(struct model *m, int l);
/* The outputs back from the experts' devices, the counts recorded, and
 * out (N, C) = their weighted sum per token: moe_return_start (the
 * exchange) then moe_return_finish (the rest). */
void moe_return_forward(struct model *m, int l, float *out);
void moe_return_start(struct model *m, int l);
void moe_return_finish(struct model *m, int l, float *out);
/* Backward of moe_return_forward: the output gradients dout reach the
 * experts as *dY (rows of *X); *dX, zeroed, receives their inputs'. */
void moe_return_backward(struct model *m, int l, const float *dout, float **X, float **dY, float **dX);
/* Backward of moe_route_forward: the input gradients back from the
 * experts' devices (moe_route_backward_start), added into dln, and the
 * router's, with the load-balance loss, whose value is added to the
 * step's aux (moe_route_backward_finish). */
void moe_route_backward(struct model *m, int l, float *dln);
void moe_route_backward_start(struct model *m, int l);
void moe_route_backward_finish(struct model *m, int l, float *dln);
/* The rows of layer l's experts: their inputs X, outputs Y, and in
 * backward dY and dX (received from / sent back to every device with
 * expert parallelism). */
void moe_expert_rows(struct model *m, int l, float **X, float **Y, float **dY, float **dX);
/* Waits for m's exchange in flight (a batch split's half), if any; its
 * error becomes the step's. */
void moe_a2a_wait(struct model *m);

/* ---- bsplit.c ---- */

/* The batch split's stage calls (docs/deepseek.md#batch-split), on the
 * whole device's rows of x, y and d (the first half's rows, then the
 * second's), with the calls' contracts of model.h. A MoE layer's forward
 * leaves the second half's combine in flight and finishes it in the next
 * call of the step: under the next layer's first-half attention when
 * that call is the next layer's forward on these rows of y, else at its
 * start (bsplit_flush). A MoE layer's backward starts the second half's
 * combine backward of the layer below it early, on the rows of d it
 * returns, for the next call: the backward of that layer on the same d. */
int bsplit_layers_forward(struct model *m, int l0, int l1, float *y, const float *x);
int bsplit_layers_backward(struct model *m, int l0, int l1, float *d, const float *x);
/* Finishes the forward left to finish, if any (before anything reads
 * its rows, and before the expert counts are summed). */
void bsplit_flush(struct model *m);
/* The start and end of a step: nothing left over; at the end, every
 * exchange in flight waited for (after a failure; its data dropped). */
void bsplit_step_begin(struct model *m);
void bsplit_step_end(struct model *m);

#endif
