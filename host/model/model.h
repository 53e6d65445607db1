/* Decoder-only transformer (docs/training-step.md#the-model): embedding; per layer RMSNorm ->
 * causal GQA attention with RoPE -> residual -> RMSNorm -> SwiGLU MLP or MoE
 * -> residual; final RMSNorm; output projection; softmax cross-entropy.
 *
 * Parameters and gradients each live in one allocation with the same
 * layout; every tensor is addressed by name, carries logical axis names
 * (docs/sharding.md) and is stacked per layer ([layers, ...]) so a pipeline can view
 * it as [repeats, stages, layers_per_stage, ...]. Linear weights are stored
 * [out, in] as in Hugging Face checkpoints. */
#ifndef MESHRUN_MODEL_H
#define MESHRUN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/model/param.h"

struct model_dims {
	int V, C, T;           /* vocab, d_model, sequence length */
	int L, L_dense, L_moe; /* layers; first L_dense dense, then L_moe MoE */
	int Hq, Hkv, D;        /* heads, kv heads, head dim (mla: Hkv = Hq, D = Dn + Dr) */
	/* multi-head latent attention (attention_type mla, docs/deepseek.md):
	 * q_lora_rank (0: a plain q projection), kv_lora_rank, and the
	 * no-rope, rope and value head dims */
	bool mla;
	int Rq, Rkv, Dn, Dr, Dv;
	/* YaRN (rope_type yarn): factor, original_max_position_embeddings,
	 * beta_fast, beta_slow, mscale, mscale_all_dim */
	bool yarn;
	int rope_orig;
	float rope_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
	int F;                 /* dense SwiGLU hidden */
	int E, K, Fe, S;       /* experts, top-k, expert hidden, shared experts */
	int groups, topk_groups; /* group-limited routing: expert groups, groups that compete (0: none) */
	int moe_score;         /* enum moe_score */
	bool norm_topk, tied, router_bias;
	float routed_scale, eps, theta, lb_weight;
	/* batch_split_factor: the parts each device's batch is cut into (0 or
	 * 1: no split; 2: two halves, each with its own products in every
	 * layer, docs/deepseek.md#batch-split); bsplit_sched
	 * (use_batch_split_schedule): the halves' MoE layers run staggered,
	 * their expert exchanges in the background, else one half after the
	 * other. Both orders compute the same products, summed in the same
	 * order: the same bits. */
	int bsplit;
	bool bsplit_sched;
};

/* Where this device sits in a mesh; NULL (or mesh NULL) for one device. */
struct model_mesh {
	const struct mesh *mesh;
	const struct shard_rules *rules;
	int device;                       /* global device id */
	/* each gradient bucket is padded to a multiple of this many floats
	 * (0 or 1: none), so ZeRO-1 can split it evenly in place */
	int bucket_align;
	/* A circular pipeline of pipe_stages stages and pipe_repeats repeats
	 * (0 or 1: none): stacked tensors keep their layers in stage order,
	 * storage index (s*R + r)*Lps + j holding layer (r*S + s)*Lps + j, so
	 * the block of `layers` that stage s stores (split over `stage`) is
	 * the layers it runs. Identity when R is 1. The FSDP window's layer
	 * groups then hold a stage's L / (S*R) layers, and it keeps
	 * pipe_weight_slots of them gathered at once (0 or 1: one; a
	 * schedule's weight_slots, host/pipeline/schedule.h). */
	int pipe_stages, pipe_repeats, pipe_weight_slots;
	/* ZB-V's order instead (pipe_repeats 2): stage s runs the layers of
	 * block s and of block 2S-1-s, stored in that order (the V). */
	bool pipe_v;
	/* The pipelined decoder layers [pipe_first, pipe_first + pipe_layers)
	 * (pipe_layers 0: all of them). A stacked tensor that holds any other
	 * layer (they run data-parallel over `stage`, outside the pipeline)
	 * is not split over `layers`: every stage stores it whole, and runs
	 * those layers (their activations are needed on every stage). */
	int pipe_first, pipe_layers;
	/* Sets of saved layer activations (0 or 1: one): a stage that keeps
	 * the activations of several chunks from their forward to their
	 * backward (the schedule's act_sets, host/pipeline/schedule.h). */
	int pipe_act_sets;
	/* Stashes of the split backward (model_w_stash; 0: none, and
	 * model_layers_backward_input may not be called): how many
	 * input-gradient backwards of a call may wait for their weight
	 * gradients at once (a schedule's peak pending W per stage). */
	int pipe_w_stashes;
	/* The weight backward reads each weight's input in place (the
	 * layers' saved activations, the call's x) instead of a copy in the
	 * stash: the caller keeps them unchanged from the input backward to
	 * the weight backward (no recompute, the activations' set held until
	 * the W). About halves the stash and the input backward's copying. */
	bool pipe_w_reads_acts;
};

struct model;

/* Reads and checks model dims from the config; -EINVAL with err naming the
 * key for impossible shapes. */
int model_dims_from_cfg(struct model_dims *d, const struct cfg *c, char *err, size_t errlen);

/* Allocates parameters (this device's shards), gradients and activations
 * for B sequences of T. With a mesh, every tensor is placed by the
 * sharding rules and every linear layer planned (host/mesh/plan.h): weights
 * split over the rows' axes are gathered per layer (FSDP), heads, MLP and
 * vocabulary split over the tensor axes, the embedding over
 * tensor_transpose, experts over their `exp` axes (tokens travel to them
 * with all_to_all). NULL with err (a "config:" or "sharding:" line naming
 * the key, tensor and axes) when a shape does not split or a combination
 * cannot run. */
struct model *model_new(const struct model_dims *d, int B, const struct model_mesh *mm,
			char *err, size_t errlen);
/* model_new that says why it failed: 0 and *out; -EINVAL (the "config:"
 * or "sharding:" line above) or -ENOMEM (a "model: out of memory" line
 * naming the bytes asked for), with err. */
int model_open(struct model **out, const struct model_dims *d, int B, const struct model_mesh *mm,
	       char *err, size_t errlen);
/* The same placement and plans without any buffer: for describing a run
 * (`meshrun shardings`) before making it. Only the table, the plans and
 * the buckets may be read from it. */
struct model *model_plan_new(const struct model_dims *d, const struct model_mesh *mm,
			     char *err, size_t errlen);
void model_free(struct model *m);
/* Bytes of the model's one allocation of activations (what each layer
 * saves for its backward, the residual stream, the head's) and backward
 * scratch for B sequences per device; works on a model_plan_new model
 * too (sizing only, nothing kept). 0 when out of memory. */
size_t model_activation_bytes(struct model *m, int B);
const struct model_dims *model_dims(const struct model *m);

/* Parameter table. */
/* The parameter table of the whole (unsharded) model for dims d without
 * allocating one: copies up to max entries into out; returns the number
 * of parameters, or -ENOMEM. */
int model_param_table(const struct model_dims *d, struct param_info *out, int max);
int model_num_params(const struct model *m);
const struct param_info *model_param(const struct model *m, int i);
const struct param_info *model_param_by_name(const struct model *m, const char *name);
float *model_params(struct model *m);      /* the one allocation */
float *model_grads(struct model *m);       /* same layout */
size_t model_numel(const struct model *m); /* floats in each */

/* The layout is ordered by gradient-sum axes: bucket i is floats
 * [offset, offset + numel) whose gradients are all summed over `axes`,
 * followed by zeros up to offset + padded (a multiple of bucket_align). */
struct model_bucket {
	uint32_t axes;
	size_t offset, numel, padded;
};
int model_buckets(const struct model *m, struct model_bucket *out, int max);
/* The plan of parameter i (host/mesh/plan.h), NULL on one device. */
struct plan_param;
const struct plan_param *model_param_plan(const struct model *m, int i);
/* What one planned linear layer moves (axis masks, 0 for nothing): its
 * weight gathered before use (FSDP), its output's partial sums
 * all-reduced, backward: the input gradient's partial sums all-reduced,
 * the weight gradient reduce-scattered, then summed at the end of the
 * step over gsum. */
struct model_linear_info {
	const char *name, *weight;
	uint32_t gather, reduce, dx_reduce, dw_scatter, gsum;
};
int model_linears(const struct model *m, struct model_linear_info *out, int max);
/* The layer that storage index q of a stacked tensor of n layers holds
 * (model_mesh's pipeline order); q without one. */
int model_stack_layer(const struct model *m, int q, int n);
/* The storage slice (index along dimension 0) of stacked tensor i of
 * the table that holds decoder layer l on this device, or -1: i is not
 * stacked, has no slice for l, or another device stores it. */
int model_param_slice(const struct model *m, int i, int l);
/* A stacked tensor that has a slice for decoder layer l but does not
 * store it on this device, or NULL when every one does. */
const struct param_info *model_layer_missing(const struct model *m, int l);
/* Mesh axes that split the rows (activation_batch); 0 on one device. */
uint32_t model_rows_axes(const struct model *m);
/* The same axes before there is a model (a job sizes each model's batch
 * by them): the rules resolved for the activation of width C, as
 * model_new resolves them. 0 or -EINVAL with err. */
int model_plan_rows(const struct model_mesh *mm, int C, uint32_t *rows, char *err, size_t errlen);
/* Floats FSDP holds during a step besides the shards (the weight window,
 * host/model/window.h): the gathered non-layer tensors and one layer,
 * their gradients, and the packed buffers gathers and reduce-scatters
 * move them through (the next layer lands in one of them). */
size_t model_window_numel(const struct model *m);

/* Deterministic init: the value of element i of the whole tensor depends
 * only on (seed, tensor name, i), so every sharding holds the same weights. */
void model_init(struct model *m, uint64_t seed, float std);

struct model_step {
	float loss_scale;        /* cross-entropy gradient scale: 1 / global tokens */
	float lb_weight;         /* load-balance loss weight (MoE) */
	double global_tokens;    /* tokens in the global batch */
	const struct model_comm *comm; /* NULL on one device */
	/* results */
	double loss_sum;         /* sum of the per-token losses of these rows */
	double aux;              /* this replica's share of the global load-balance loss */
};

/* Forward only (evaluation; a model without a pipeline), on one device
 * or a mesh (st->comm): st->loss_sum the sum of the per-token losses of
 * these rows (masked targets add nothing). 0 or the first hook error. A
 * training step is the pipeline executor's (host/pipeline/exec.h), with
 * or without a pipeline: it runs the stage calls below. */
int model_forward(struct model *m, const int32_t *inputs, const int32_t *targets,
		  struct model_step *st);

/* ---- one step, stage by stage ----
 *
 * A step is model_step_begin, stage calls, model_step_end. Every stage
 * call works on the model's N = B x T rows (B as given to model_new) of
 * width C (this device's part of the embedding) and returns 0 or the
 * step's first hook error; after one, no call of the step starts a
 * collective (what they compute is garbage) and the caller goes on to
 * model_step_end.
 *
 * Weights split over the rows' axes are read from the FSDP weight window
 * (model_window, host/model/window.h): the group a call uses (the
 * non-layer tensors for the embedding and the head, each layer for a
 * layers call) must be READY there during the call, and its gradient
 * window zeroed before the first backward that adds to it; their
 * gradients reach model_grads by the window's reduce-scatter. Other
 * weights are read from model_params, their gradients added to
 * model_grads.
 *
 * What stays alive between a forward and its backward: the model keeps
 * each layer's activations in the set of saved activations in use
 * (model_act_set), and the head's (one set), so forward and backward of
 * the same layers in one set alternate (a pipeline stage that runs
 * several microbatches either recomputes the forward just before each
 * backward, or gives each chunk in flight its own set); the caller keeps
 * the buffers it passed as inputs. */

/* Sets of saved layer activations (model_mesh.pipe_act_sets), and the
 * one the next layer calls use (0 .. sets - 1; 0 at first). */
int model_act_sets(const struct model *m);
void model_act_set(struct model *m, int k);
/* About the bytes one dense (or MoE) layer's saved activations take for
 * `rows` sequences on one device (what a set holds per layer). */
size_t model_layer_act_bytes(const struct model_dims *d, int rows, bool moe);
/* The bytes one dense (or MoE) layer's part of a stash of the split
 * backward takes for `rows` sequences on one device: its weights' output
 * gradients, and their inputs unless W reads them in place
 * (model_mesh.pipe_w_reads_acts). */
size_t model_layer_w_stash_bytes(const struct model_dims *d, int rows, bool moe, bool reads_acts);

/* Begins a step with st's collectives (st->aux starts at 0); st stays
 * the caller's and alive until model_step_end. */
void model_step_begin(struct model *m, struct model_step *st);
/* Waits for whatever is still in flight (after a failure; its data is
 * dropped) and frees every window slot. Returns the step's first hook
 * error, or 0. */
int model_step_end(struct model *m);

/* x0 (N, C) = the embeddings of inputs (N tokens). */
int model_embed_forward(struct model *m, float *x0, const int32_t *inputs);
/* Adds the embedding's gradient for dx0 (N, C) = dL/dx0; inputs as in
 * the forward. */
int model_embed_backward(struct model *m, const float *dx0, const int32_t *inputs);

/* Layers [l0, l1) (0 <= l0 < l1 <= L) on x (N, C): y (N, C) = the
 * output of layer l1 - 1. Saves what their backward needs in the model:
 * each layer's activations and the inputs of layers l0 + 1 .. l1 - 1;
 * not x, which the caller keeps unchanged until the backward. The model
 * does not read y again. x and y must not overlap. A MoE layer records
 * its expert counts (model_expert_counts), which its backward uses for
 * the load-balance loss; the step sums them over replicas in between. */
int model_layers_forward(struct model *m, int l0, int l1, float *y, const float *x);
/* Backward of the last model_layers_forward of [l0, l1), given the same
 * x: d (N, C, not overlapping x) holds dL/dy on entry and dL/dx on
 * return. Weight gradients accumulate; a MoE layer adds its load-balance
 * loss to the step's aux. */
int model_layers_backward(struct model *m, int l0, int l1, float *d, const float *x);
/* The same backward split in two (the zero-bubble schedules' I and W,
 * docs/training-step.md#the-split-backward). Input: dx (N, C, not
 * overlapping x; it may be dy) = dL/dx from dy = dL/dy, with every
 * collective the input gradient needs (partial sums, the experts'
 * exchanges, the router and the load-balance loss); each weight
 * gradient's operands (the weight's input and output gradient) go into
 * the stash in use (model_w_stash), which must hold no layer of [l0, l1)
 * already. Weight: the weight gradients of the last input backward of
 * [l0, l1) into this stash, accumulated as model_layers_backward does
 * (same weights READY in the window, its gradient window zeroed by the
 * caller); it reads only the stash (and, with pipe_w_reads_acts, the
 * activations and x in place), so dy, and without that flag x and the
 * activations, may be reused after the input backward; the stash is free
 * again after it. Input then weight gives
 * model_layers_backward's results bit for bit; the weight-side
 * reductions (FSDP reduce-scatter, the step's gradient sums) are the
 * caller's, after the weight backward. */
int model_layers_backward_input(struct model *m, int l0, int l1, float *dx, const float *dy, const float *x);
int model_layers_backward_weight(struct model *m, int l0, int l1, const float *dy, const float *x);
/* The split backward's stashes (model_mesh.pipe_w_stashes), and the one
 * the next input or weight backward uses (0 .. stashes - 1; 0 at first). */
int model_w_stashes(const struct model *m);
void model_w_stash(struct model *m, int k);

/* Final norm, output projection and cross-entropy of x (N, C, the last
 * layer's output) against targets: *loss_sum = the sum of the N token
 * losses. Keeps what its backward needs; x stays unchanged until then. */
int model_head_forward(struct model *m, double *loss_sum, const float *x, const int32_t *targets);
/* Backward of the last model_head_forward (same x and targets), scaled by
 * the step's loss_scale: dx (N, C, not overlapping x) = dL/dx
 * (overwritten); the head's and final norm's gradients accumulate. */
int model_head_backward(struct model *m, float *dx, const float *x, const int32_t *targets);

/* The FSDP weight window, for a caller that schedules the gathers itself
 * (a pipeline stage). Its groups hold one layer. */
struct win;
struct win *model_window(struct model *m);

/* Parts a layer (fsdp_layer_parts): the window cuts each layer group
 * into the attention block's parts and the feed-forward block's, the
 * last part (the MLP norm, the dense MLP or the MoE block's router,
 * experts and shared experts). The attention block is one part (0); in
 * layer 0 (the step's first forward and last backward), grouped-query
 * attention's is four, one a projection in the order forward reads
 * them: wq (0), wk (1), wv (2), wo (3), the feed-forward block then 4 in
 * every layer, where each projection's block on a member is above the
 * comm's direct-exchange size (else, and for latent attention, the
 * feed-forward block is 1). mid,
 * when set, is called with a mask of parts (bit p: part p): in forward
 * between the two blocks (before the MLP norm, the feed-forward block's
 * part; the forward's own reads of the attention block's weights wait
 * for their parts in the window); in backward once parts' weight
 * gradients are written: the feed-forward block's after the MLP norm's
 * backward, and (four parts) wo's, wq's and wk's after wk's weight
 * gradient; wv's go with the layer's last reduce-scatter. A failure it
 * returns is the pass's. on false: whole groups, no call. 0 or
 * -ENOMEM. */
int model_set_parts(struct model *m, bool on, int (*mid)(void *ctx, int l, bool backward, unsigned parts),
		    void *ctx);
/* After model_set_parts (on, four parts): the weight gradients of layer
 * l (-1: none; also reset by model_set_parts) go as layer 0's, wo's, wq's
 * and wk's part sent after wk's weight gradient, in a B or a W (its
 * weights gathered in two parts still); and in a W of layer 0 or l, a
 * dense layer's down projection's first, once written (then the rest of
 * the feed-forward block's). For a pipeline stage's last W's layer. */
void model_set_fine(struct model *m, int l);
/* Sleep mode's plan of an F or B of layer l in parts (model_set_parts):
 * n steps (returned, at most MODEL_PART_STEPS), step j the share[j] of
 * the action's time (as the layer's matmul FLOPs split), then mid with
 * mask[j] (0: none), as the model calls it. */
#define MODEL_PART_STEPS 6
int model_part_steps(const struct model *m, int l, bool backward, double *share, unsigned *mask);
/* The same for a W (the weight gradients of a split backward, from its
 * I's tape) of layer l: the feed-forward block's weight gradients, then
 * mid with its part, then the attention's (as model_layers_backward_weight
 * calls it: the caller acts on it in the last W before the layer's
 * reduce-scatter only); in layer 0 or model_set_fine's, with four
 * parts, wo's, wq's and wk's, mid with their part, then wv's; and in
 * model_set_fine's layers, dense, first the down projection's, mid with
 * its part. */
int model_part_steps_w(const struct model *m, int l, double *share, unsigned *mask);
/* The share of a layer's matmul FLOPs in its feed-forward block (part B)
 * on this device's rows: the attention projections, its scores and
 * values (causal: T/2 keys a query on average) against the MLP's or the
 * routed and shared experts' (K of them) and the router's. */
double model_ffn_share(const struct model *m, int l);

/* Per-expert token counts of the last step, [L_moe, E] (NULL if dense),
 * summed over replicas by the counts hook; used by the router bias update. */
const int32_t *model_expert_counts(const struct model *m);

/* How a MoE layer's forward records its expert counts (the load-balance
 * loss of its backward and the router bias update read them):
 * MODEL_COUNTS_SET (the default) replaces the layer's counts with this
 * forward's; MODEL_COUNTS_ADD adds them (a pipeline's forward passes, one
 * per microbatch); MODEL_COUNTS_KEEP leaves them (a pipeline's recomputed
 * forward in backward). */
enum model_counts { MODEL_COUNTS_SET, MODEL_COUNTS_ADD, MODEL_COUNTS_KEEP };
void model_count_experts(struct model *m, enum model_counts how);
/* Zeroes every layer's counts (before a step's MODEL_COUNTS_ADD forwards). */
void model_zero_counts(struct model *m);
/* Sums the counts over the devices that differ from this one on `axes`
 * (within a step, with its collectives; exact integers added in rank
 * order). Returns the step's error. */
int model_sum_counts(struct model *m, uint32_t axes);

/* Matmul FLOPs per token for forward+backward (6 x matmul params active per
 * token + 6 x L x T x Hq x (Dq.k + Dv) for attention: 12 x L x T x Hq x D
 * for grouped-query), for TFLOP/s and MFU. */
double model_flops_per_token(const struct model_dims *d);

#endif
