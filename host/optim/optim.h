/* The optimizer, a room of its own: the state of this device's shards
 * (AdamW's m and v, or Muon's momentum in m); the gradients summed over
 * the mesh in buckets while the backward runs (packed layer-major, each
 * bucket's all-reduce started in the background the moment its last
 * gradient is final); ZeRO-1's split state (its gradients reduce-scattered
 * over `data` bucket by bucket during the backward, its updated
 * parameters all-gathered bucket by bucket as the update finishes each,
 * waited for by the next step's first use of them); the global gradient norm and clipping; the learning
 * rate; the update (AdamW, Muon); the DeepSeek router bias. It works on a
 * model's one allocation of parameters and gradients (host/model/model.h)
 * and reaches other devices only through struct optim_comm. Order of a
 * step and what overlaps what: docs/training-step.md. */
#ifndef MESHRUN_OPTIM_H
#define MESHRUN_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/model/model.h"

struct optim;

/* A run of layout floats [off, off + n). */
struct optim_run {
	size_t off, n;
};

/* Collectives started in the background (on the device's communication
 * thread, run one at a time in the order started), and their wait: each
 * sets *h (NULL: nothing to wait for), which wait(h) finishes; the
 * floats stay untouched until then. name says what moves, for the trace
 * ("grads L7-6"). Each works in place on one list of runs, base +
 * run[i].off for run[i].n floats, as on their concatenation
 * (net/coll.h's coll_*_v: no packing copy, the sums bit for bit those
 * of the op on the concatenation): all_reduce_v sums it over the
 * members; reduce_scatter_v and all_gather_v cut it into one block per
 * member, block b counts[b] floats (counts the same on every member):
 * reduce_scatter_v leaves the sum of the member's own block there (the
 * other blocks hold partial sums), all_gather_v fills every block from
 * its member. run and counts may be reused at once. Each returns 0 or
 * -errno (the caller keeps the message). */
struct optim_bg {
	int (*all_reduce_v)(void *ctx, uint32_t axes, float *base, const struct optim_run *run, int nrun,
			    const char *name, void **h);
	int (*reduce_scatter_v)(void *ctx, uint32_t axes, float *base, const struct optim_run *run, int nrun,
				const size_t *counts, const char *name, void **h);
	int (*all_gather_v)(void *ctx, uint32_t axes, float *base, const struct optim_run *run, int nrun,
			    const size_t *counts, const char *name, void **h);
	int (*wait)(void *ctx, void *h);
	/* Optional (NULL: the stage sums run synchronously, by mc, after
	 * the table): buf's n floats summed over axes in place, the same
	 * algorithm as mc->all_reduce's, on the same queue as the above
	 * (so a bucket issued after it sums what it left). */
	int (*all_reduce)(void *ctx, uint32_t axes, float *buf, size_t n, const char *name, void **h);
	void *ctx;
};

/* The collectives the optimizer uses: the model's by axis set (mc), an
 * exact sum of doubles over an axis set (the same bits on every member),
 * and the background ones (bg: required on a mesh, where the gradient
 * buckets are summed by them). The structs pointed to outlive the
 * optimizer's use of them (the job's, for the whole run). */
struct optim_comm {
	const struct model_comm *mc;
	int (*sum)(void *ctx, uint32_t axes, double *x, int n);
	const struct optim_bg *bg;
};

/* Where the optimizer's device sits and what its table does. mesh NULL:
 * one device. ndata > 1: ZeRO-1 splits the state of buckets summed over
 * `data` (rdata: this device's data coordinate). stages > 1: a pipeline,
 * whose tensors stored whole on every stage are summed after the table.
 * order: the weight groups in the order the step's table makes their
 * gradients final (pipe_exec_grad_order: layers [l0, l1), or l0 -1 the
 * head, -2 the embedding). */
struct optim_place {
	const struct mesh *mesh;
	int device;
	int ndata, rdata;
	int stages;
	const int *order_l0, *order_l1;
	int norder;
};

/* What the last step's optimizer did. */
struct optim_stats {
	int buckets;          /* gradient buckets summed during the table */
	int late;             /* of them, started only after the table */
	int64_t ns_matrices;  /* matrices this device ran Newton-Schulz on */
	int64_t muon_bytes;   /* bytes it sent other devices for Muon */
	double ns_flops;      /* their floating-point operations */
	double ns_plan_max;   /* the plan's Newton-Schulz flops of the busiest */
	double ns_plan_min;   /* and the least busy device (every device's view) */
};

/* The state for model m's trained tensors on this device (m stays the
 * caller's and outlives it; pl's arrays are only read here). 0 and
 * *out; -EINVAL with err for Muon beside ZeRO-1 (optim_check_zero's
 * line); -ENOMEM with err naming the bytes. */
int optim_new(struct optim **out, struct model *m, const struct cfg *c, const struct optim_place *pl,
	      char *err, size_t errlen);
void optim_free(struct optim *o);

/* Muon needs whole matrices, ZeRO-1 cuts the state of every bucket
 * summed over `data` into flat parts: a Muon matrix in such a bucket is
 * refused. 0, or -EINVAL with one line in err naming the tensor. The
 * trainer's checks (host/train/check.c) and optim_new both ask it. */
int optim_check_zero(const struct model *m, bool muon, int ndata, char *err, size_t errlen);

/* What the optimizer keeps for tensor p on its device: the floats of
 * state (returned), in *slots buffers (AdamW: m and v, 2; Muon's
 * matrices: the momentum, 1; an untrained tensor: 0), and whether ZeRO-1
 * splits them over `data` (ndata > 1: a tensor summed over it). For
 * `meshrun shardings`. */
size_t optim_tensor_state(const struct param_info *p, bool muon, int ndata, int *slots, bool *zero);

/* ---- Muon's owners (host/optim/muon.c) ---- */

/* The axes of the devices that hold the same local matrices of p (its
 * Muon group): p's matrix split and every axis of the mesh p is not
 * split on. */
uint32_t muon_group_axes(const struct mesh *m, const struct param_info *p);

/* Which member of its group runs each Muon matrix's Newton-Schulz, for
 * the whole mesh, from the tensors of model m (any device's: their
 * shards have the same shapes). by_size: longest-processing-time first
 * (matrices by newton_schulz5_flops, ties by tensor then matrix, each to
 * its group's least loaded member, ties to the first); else round robin
 * over each group (a count kept across tensors). Deterministic: every
 * device computes the same plan. */
struct muon_plan {
	int *first;      /* [param]: its matrix 0 in owner, or -1 (not shared) */
	int *owner;      /* the owner's index in device's group (ring order) */
	double *load;    /* [ndev]: each device's Newton-Schulz flops a step,
			  * its own unshared matrices included */
	int ndev;
};
/* 0 or -ENOMEM. Free with muon_plan_free. */
int muon_plan_init(struct muon_plan *mp, const struct model *m, const struct mesh *mesh, int device,
		   bool by_size);
void muon_plan_free(struct muon_plan *mp);
/* The largest and smallest load over the devices. */
void muon_plan_spread(const struct muon_plan *mp, double *max, double *min);

/* ---- a step ----
 *
 * optim_step_begin (before the table runs), optim_hook_grads while it
 * runs, optim_sum_grads after it, optim_update. */

/* The step's collectives (copied; NULL: one device); from now on the
 * grads hook starts each bucket's sum when its last unit is final. */
void optim_step_begin(struct optim *o, const struct optim_comm *oc);
/* The executor's grads_done hook (host/pipeline/exec.h, struct
 * pipe_hooks; ctx the optimizer): a weight group's gradients are final.
 * 0 or a failing collective's -errno. */
int optim_hook_grads(void *ctx, int l0, int l1, bool landed);
/* The executor's weights_needed hook (struct pipe_hooks; ctx the
 * optimizer): before the step first uses weight group [l0, l1) (or
 * PIPE_HOOK_HEAD, PIPE_HOOK_EMBED; gathered: only its tensors the FSDP
 * window gathers), waits for ZeRO-1's all-gathers of the buckets
 * holding it that the last update started. 0 or -errno. */
int optim_hook_weights(void *ctx, int l0, int l1, bool gathered);
/* Waits for every such gather: the parameters are whole again (before
 * anything but the step's table reads them: eval, checkpoints, the end
 * of the run). 0 or -errno. */
int optim_wait_params(struct optim *o);
/* The executor's stage_sums hook (host/pipeline/exec.h, struct
 * pipe_hooks; ctx the optimizer): a pipeline's tensors stored on every
 * stage (not split over `stage`: embedding, head, final norm) are final
 * on this stage. Starts their sums over `stage` in the background, one
 * per tensor in parameter order (the order of every stage), then the
 * buckets holding only such tensors not started yet, in bucket order
 * (the same on every member of their groups): queued behind the stage
 * sums, they sum what those leave. Once a step; optim_sum_grads does it
 * when the table did not (or bg has no all_reduce: then synchronously,
 * after the table). 0 or a failing collective's -errno. */
int optim_hook_stage_sums(void *ctx);
/* After the table: the stage sums unless the table started them (see
 * optim_hook_stage_sums), then starts the buckets left, waits for
 * every bucket, reduce-scatters ZeRO-1's segs (grad_bucket_mb=0; else
 * their buckets were), and returns in *ss this
 * device's share of the squared global norm (each element divided by
 * the devices holding the same value, so the sum over every device
 * counts each element once). 0 or the failing collective's -errno. */
int optim_sum_grads(struct optim *o, double *ss);

/* The next step's first gathers of FSDP-split weights (the groups
 * [l0[i], l1[i]) of n, as pipe_hooks name them, group i read by the
 * table's leading gather by[i] (0, 1, ...; by NULL: all by the first):
 * fn(ctx, upto) starts the leading gathers before upto (INT_MAX: all),
 * and optim_update calls it as soon as it has updated this device's
 * shards of those groups, before the rest, one leading gather at a
 * time (the non-layer group's leaves while layer 0's shards are
 * updated, ...), so they travel during the rest of the update (under
 * Muon all at once, after the exchanges of those shards have landed:
 * muon_flush). Not with
 * ZeRO-1's buckets (their gathers come first), a Muon tensor whose
 * group spans pipeline stages, or grad_bucket_mb=0 (the order before). */
void optim_set_prefetch(struct optim *o, int (*fn)(void *ctx, int upto), void *ctx, const int *l0, const int *l1,
			const int *by, int n);

/* The learning rate of step (0-based): warm-up, then cosine decay. */
float optim_lr(const struct optim *o, int64_t step);

/* Updates this device's shards from the summed gradients, each scaled
 * by clip first (1: none): AdamW element-wise, Muon per whole matrix:
 * in a mesh each matrix's Newton-Schulz runs on one device of those that
 * hold it (split or copied) and the results are handed back (collective,
 * host/optim/muon.c). Then the router bias from the step's expert
 * counts, and ZeRO-1's all-gather of the updated parts: with buckets
 * each bucket's is started as its update is done and left in flight
 * (optim_hook_weights, optim_wait_params); with grad_bucket_mb=0 the
 * whole segs' at the end. 0 or -errno. */
int optim_update(struct optim *o, int64_t step, float lr, float clip);
void optim_get_stats(const struct optim *o, struct optim_stats *st);

/* An update that may have to be taken back (the trainer's update ahead,
 * pipeline_update_ahead): optim_keep makes the next optim_update keep
 * what it overwrites, at little cost (AdamW writes m and v to a second
 * pair of buffers, swapped in after it, and copies the old parameters
 * and gradients on its way: kernels' adamw_update_keep); optim_restore,
 * before the next update, waits for ZeRO-1's gathers in flight and
 * puts all four back, so an update redone from the same gradients gives
 * the same bits. AdamW without ZeRO-1 only: it reads the gradients at
 * their own layout and writes nothing else (no router bias, no Muon).
 * 0, -ENOMEM (the buffers' first allocation) or a gather's -errno. */
int optim_keep(struct optim *o);
int optim_restore(struct optim *o);

/* Checkpoints: m (which 0) or v (1). On one device the state is in the
 * parameters' layout: optim_state returns it. */
float *optim_state(struct optim *o, int which);
/* loc (the layout's floats) = the state; ZeRO-1 parts are gathered over
 * `data` (collective over every device). 0 or -errno. */
int optim_state_to_layout(struct optim *o, const struct optim_comm *oc, int which, float *loc);
/* The state = this device's part of loc. */
void optim_layout_to_state(struct optim *o, int which, const float *loc);
/* Resume in place: the floats [lo, hi) of the parameter layout this
 * device's state holds (a ZeRO-1 seg: its part), range i of
 * optim_state_nranges, in layout order; empty ranges are 0, 0. */
int optim_state_nranges(const struct optim *o);
void optim_state_range(const struct optim *o, int i, size_t *lo, size_t *hi);

#endif
