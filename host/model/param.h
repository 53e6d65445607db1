/* The types the model shares with the rooms beside it: a parameter
 * tensor's description (its shard, axes, optimizer) and the collectives
 * the model calls (struct model_comm). Types only, so that the FSDP window
 * (window.c) and the model (model.c) both stand on it and neither on the
 * other's header. */
#ifndef MESHRUN_PARAM_H
#define MESHRUN_PARAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum param_opt { OPT_ADAMW, OPT_MUON, OPT_NONE };

#define MODEL_MAX_DIMS 5
#define MODEL_MAX_PARAMS 32

/* One named parameter tensor (stacked over `layers` when stacked). */
struct param_info {
	char name[48];
	int ndim;
	int shape[MODEL_MAX_DIMS];        /* this device's storage shard */
	int global_shape[MODEL_MAX_DIMS]; /* the whole tensor */
	int goff[MODEL_MAX_DIMS];         /* where the shard starts in it */
	const char *axes[MODEL_MAX_DIMS]; /* logical axis names */
	int head_dim;                     /* a heads dimension splits into whole heads of this */
	size_t offset, numel;             /* into the one allocation, in floats */
	enum param_opt opt;               /* AdamW, Muon (per 2-D matrix), none */
	bool decay;                       /* weight decay applies */
	bool stacked;                     /* dimension 0 is `layers` */
	int mat_rows, mat_cols;           /* Muon: each whole [rows, cols] matrix */
	uint32_t split;                   /* mesh axes the storage is sharded over */
	uint32_t mat_split;               /* those of them on the matrix dimensions */
	uint32_t gsum;                    /* axes the local gradient is summed over */
};

/* floats of one layer's slice of a stacked tensor (or the whole tensor) */
static inline size_t param_slice_numel(const struct param_info *p)
{
	return p->stacked ? p->numel / (size_t)p->shape[0] : p->numel;
}

/* One run of floats a list collective works on where it lies. */
struct model_run {
	float *buf;
	size_t n;
};

/* count floats from src to dst: the own block's copies a list
 * collective does itself (start_all_gather_v, start_reduce_scatter_v). */
struct model_move {
	float *dst;
	const float *src;
	size_t n;
};

/* Collectives over the devices that differ from this one only on `axes`
 * (a mask of 1 << AX_*), ordered as mesh_group orders them. Each returns
 * 0 or a negative errno and keeps its message for the caller; the model
 * passes that value through unchanged. */
struct model_comm {
	int (*all_reduce)(void *ctx, uint32_t axes, float *buf, size_t n);
	int (*all_gather)(void *ctx, uint32_t axes, void *out, const void *in, size_t bytes);
	/* out (n floats) = sum over members of their in[rank n, rank n + n) */
	int (*reduce_scatter)(void *ctx, uint32_t axes, float *out, const float *in, size_t n);
	int (*all_to_all)(void *ctx, uint32_t axes, void *out, const size_t *recv_bytes,
			  const void *in, const size_t *send_bytes);
	/* Optional (NULL: the model runs these synchronously): start an
	 * all_gather or reduce_scatter in the background and set *h; wait(h)
	 * returns its result. Buffers stay untouched until then. FSDP uses
	 * them to fetch the next layer's weights while one computes and to
	 * return gradients while the next layer's backward runs. */
	int (*start_all_gather)(void *ctx, uint32_t axes, void *out, const void *in, size_t bytes, void **h);
	int (*start_reduce_scatter)(void *ctx, uint32_t axes, float *out, const float *in, size_t n, void **h);
	/* Optional too (NULL: the window packs): start_all_gather over a list
	 * of runs, in place. The concatenation of run[0 .. nrun) is the
	 * members' blocks in rank order, block b counts[b] floats; the
	 * collective fills the caller's own block, dst = src for each of
	 * own[0 .. nown) (their dsts one after another are the own block's
	 * floats in the list's order; in the background: the srcs stay
	 * unwritten until wait), and on wait(h) every block holds its
	 * member's. run, counts and own may be reused on return. */
	int (*start_all_gather_v)(void *ctx, uint32_t axes, const struct model_run *run, int nrun,
				  const size_t *counts, const struct model_move *own, int nown, void **h);
	/* Optional too (NULL: the window packs): start_reduce_scatter over
	 * such a list, in place: the caller's own block gets the sum over
	 * members of theirs (the others partial sums), which the collective
	 * then adds out, dst += src for each of own[0 .. nown) in order,
	 * before wait(h) returns 0 (not on a failure). */
	int (*start_reduce_scatter_v)(void *ctx, uint32_t axes, const struct model_run *run, int nrun,
				      const size_t *counts, const struct model_move *own, int nown, void **h);
	/* Optional too (NULL: the batch split exchanges synchronously): an
	 * all_to_all in the background, waited with wait(h); the byte
	 * arrays may be reused on return. name says what it carries ("disp
	 * h0 L3": the dispatch of half 0 of layer 3), for the trace. */
	int (*start_all_to_all)(void *ctx, uint32_t axes, void *out, const size_t *recv_bytes,
				const void *in, const size_t *send_bytes, const char *name, void **h);
	int (*wait)(void *ctx, void *h);
	/* Optional (NULL: not recorded): a span of the model's own work,
	 * [t0, t1) in util_now_s() seconds, for the trace ("attn h1 L3",
	 * "layer 3 fwd"). */
	void (*span)(void *ctx, const char *name, double t0, double t1);
	void *ctx;
	/* Optional (NULL): where a hook-less failure (the FSDP window out of
	 * memory) writes its one-line message. */
	char *err;
	size_t errlen;
};

/* The FSDP weight window's (host/model/window.h) shapes: what it moves
 * and how it is cut. */
struct plan_param;

#define WIN_NONLAYER (-1)
#define WIN_MAX_PARTS 8  /* win_set_parts: parts a layer group may be cut in */

/* One tensor of the model as the window sees it (p NULL: absent). Only
 * tensors whose plan gathers them (pp->gather) are in the window. */
struct win_tensor {
	const struct param_info *p;     /* storage shard: shape, offset */
	const struct plan_param *pp;    /* gathered axes, compute shape */
};

/* How the window is cut. */
struct win_layout {
	int lcap;     /* layers a layer group may hold (>= 1) */
	int windows;  /* layer groups READY at once (>= 1): 1 for a model
		       * run layer by layer, a pipeline schedule's weight
		       * slots for a stage */
	/* The slice of stacked tensor i (an index of t) that holds layer l in
	 * this device's storage, or -1 (or >= its shape[0]) when this device
	 * does not store layer l of it. Called often: keep it cheap. */
	int (*slice)(const void *ctx, int i, int l);
	const void *ctx;
};

#endif
