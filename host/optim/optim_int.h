/* Private to host/optim: the optimizer's state and the calls between its
 * files. They go one way: optim.c calls buckets.c, zero.c and muon.c;
 * buckets.c calls zero.c for ZeRO-1's buckets; all three call range.c
 * (a range's update, a bucket's name), which calls only muon.c.
 *
 * Words: a seg is one gradient bucket of the model's layout (a range of
 * whole tensors summed over the same axes, model_buckets). A unit is one
 * seg's slices of one weight group: a decoder layer's, the head's (final
 * norm and output projection) or the embedding's; in a pipeline, the
 * slices of tensors every stage stores whole form units of their own. A
 * piece is one tensor's slice in a unit. A bucket is a run of units of
 * one seg that is summed over the mesh by one collective, packed
 * layer-major into a buffer of its own (docs/training-step.md). */
#ifndef MESHRUN_OPTIM_INT_H
#define MESHRUN_OPTIM_INT_H

#include "host/optim/optim.h"

#include "host/mesh/plan.h"

#define KEY_HEAD (-1)
#define KEY_EMBED (-2)

struct seg {
	size_t p0, n;        /* floats [p0, p0 + n) of the parameter layout */
	uint32_t axes;       /* its gradients are summed over these */
	bool zero;           /* ZeRO-1: the state is split over `data` */
	bool bucketed;       /* zero: its gradients are reduce-scattered and
			      * its parameters all-gathered in buckets
			      * (zero.c); else the whole seg after the table
			      * and after the update (grad_bucket_mb=0) */
	size_t padded;       /* n and the zeros after it: shard_n * ndata */
	size_t shard_n;      /* zero: floats per data rank */
	size_t s0, len;      /* zero: this device's part [p0 + s0, + len) */
	size_t o0;           /* where its state starts in m and v */
};

struct piece {
	int param;           /* index in the model's table */
	size_t off, n;       /* layout floats [off, off + n) */
	size_t at;           /* where it sits in its bucket's buffer */
};

struct unit {
	int seg, key;        /* key: a decoder layer, KEY_HEAD or KEY_EMBED */
	bool repl;           /* a pipeline's tensors stored whole on every stage */
	int bucket;          /* -1: nothing to sum (its seg has no axes) */
	int p0, p1;          /* its pieces */
	bool plain, gathered; /* has pieces final after their compute / after
			       * the FSDP window's reduce-scatter landed */
	bool early;          /* read by the step's first gathers (prefetch) */
	/* this step */
	bool computed, landed, done;
};

struct bucket {
	int seg;
	uint32_t axes;       /* summed over (the seg's) */
	bool deferred;       /* summed after the table, in bucket order */
	int u0, u1;          /* its units: ubk[u0 .. u1) */
	size_t n;            /* its floats */
	float *buf;          /* zero only: see below */
	int r0, r1;          /* not zero: summed in place in the gradients,
			      * one collective per run o->run[r0 .. r1) */
	/* ZeRO-1 (zero.c): buf holds ndata chunks of c floats, chunk r the
	 * bucket's floats inside data rank r's part of the seg (layout
	 * order, zeros after); reduce-scattered over `data` into out (c
	 * floats), and after the update all-gathered back into buf */
	bool zero;
	size_t c;
	float *out;
	/* this step */
	int left;            /* units not done yet */
	bool issued;         /* its all-reduce (reduce-scatter) started */
	void *h, *h2;        /* in flight (background), or NULL; h2: zero's
			      * all-reduce over the seg's other axes */
	void *gh;            /* zero: its parameters' all-gather in flight
			      * (started by the update, waited for by the
			      * next use of its weights), or NULL */
	bool gsync;          /* zero: gh ran synchronously (no background) */
};

#define MAX_TGROUPS 8

struct optim {
	struct cfg cfg;
	struct model *model;
	const struct mesh *mesh;     /* NULL on one device */
	int device, coord[AX_COUNT];
	int ndata, rdata;            /* ZeRO-1: data ranks and this one */
	bool muon;
	int L;
	struct seg seg[MODEL_MAX_PARAMS];
	int nseg;
	/* units, buckets (a mesh only) */
	struct piece *pc;
	int npc;
	struct unit *u;              /* in the order they complete */
	int nu;
	int *ubk;                    /* units in bucket order */
	struct piece *run;           /* buckets' runs: their pieces in layout
				      * order, adjacent ones merged (at unused) */
	void **rh;                   /* each run's sum in flight, or NULL */
	int nrun;
	int *by_key;                 /* [(L + 2) * nseg * 2] unit of (key, seg,
				      * repl), or -1 */
	struct bucket *b;
	int nb;
	float *bufmem;
	size_t opt_n;
	float *m, *v, *scratch;
	float *gshard;               /* reduced gradient parts of zero segs not
				      * in buckets (zero_part) */
	struct mesh_members tg[MAX_TGROUPS];
	int ntg;
	/* the step */
	struct optim_comm oc;        /* copied at optim_step_begin */
	bool have_oc;
	bool armed;                  /* between optim_step_begin and the end of the sums */
	struct optim_stats stats;
	struct muon_plan mp;         /* Muon's owners (a mesh with Muon) */
	int gpending;                /* ZeRO-1 buckets whose gather is not unpacked */
	/* the next step's first gathers, started once their units are
	 * updated (optim_set_prefetch) */
	int (*prefetch)(void *ctx);
	void *prefetch_ctx;
};

/* ---- buckets.c ---- */

/* Units and buckets from the table's order of completion; 0 or -ENOMEM. */
int buckets_make(struct optim *o, const struct optim_place *pl);
void buckets_free(struct optim *o);
/* The unit of (key, seg, repl), or -1. */
int unit_of(const struct optim *o, int key, int seg, bool repl);
/* Starts a bucket's sum: in place, one collective per run of adjacent
 * layout floats (ZeRO-1's: its units packed into chunks first); in the
 * background when the step has background collectives. 0 or -errno. */
int bucket_issue(struct optim *o, struct bucket *b);
/* Waits for bucket b's sums in flight (ZeRO-1's: and moves its part into
 * the gradients). 0 or -errno. */
int bucket_wait(struct optim *o, struct bucket *b);

/* The update of the early units' pieces (of segs not split by ZeRO-1),
 * in layout order with adjacent pieces as one range (one Muon exchange
 * per tensor), and of the rest of seg s. 0 or -errno. */
int units_update_early(struct optim *o, int64_t step, float lr);
int seg_update_rest(struct optim *o, int s, int64_t step, float lr);

/* ---- zero.c ---- */

/* This rank's reduced gradients of zero seg s (s->len floats, its part
 * [p0 + s0, + len) of the layout): in buckets, the gradients' own floats
 * there (each bucket's were packed before its reduce-scatter and are
 * not written again in the step, so its part lands where it was read
 * from); else gshard. In optim.c. */
float *zero_part(struct optim *o, const struct seg *s);

/* The floats of a zero bucket in rank r's part, chunk by chunk: sets
 * b->c for every zero bucket. */
void zero_lay_out(struct optim *o);
/* Starts a zero bucket's reduce-scatter over `data` (and the all-reduce
 * of its part over the seg's other axes), packed first. 0 or -errno. */
int zero_issue(struct optim *o, struct bucket *b);
/* Waits for it and unpacks this rank's part into zero_part. 0 or
 * -errno. */
int zero_wait(struct optim *o, struct bucket *b);
/* The update of this rank's part of every zero bucket, in forward order
 * (embedding first), each bucket's all-gather over `data` started as
 * soon as its update is done. prefetch: the gathers of the buckets the
 * next step's first FSDP gathers read go first, then every bucket is
 * updated, then o->prefetch starts those FSDP gathers (the window waits
 * for these ZeRO-1 gathers through weights_needed), then the other
 * buckets' gathers leave. 0 or -errno. */
int zero_update_gather(struct optim *o, int64_t step, float lr, bool prefetch);
/* Waits for the all-gathers of the zero buckets holding weight group
 * key (all: key ZERO_ALL; gathered: only its units with tensors the FSDP
 * window gathers) and unpacks them into the parameters. */
#define ZERO_ALL (-100)
int zero_wait_params(struct optim *o, int key, bool gathered);
/* The same for bucket b alone. */
int zero_wait_params_of(struct optim *o, struct bucket *b);

/* ---- range.c ---- */

/* The part of parameter p inside layout floats [a, b): [*x, *y), empty
 * when *x >= *y. */
void param_range(const struct param_info *p, size_t a, size_t b, size_t *x, size_t *y);
/* Updates parameters [a, b) of the layout from gradients g, with state
 * m and v, all three indexed from a. 0 or -errno. */
int optim_update_range(struct optim *o, int64_t step, float lr, const float *g, float *mb, float *vb,
		       size_t a, size_t b);
/* What the trace calls bucket b ("what L7-6": its layers, highest
 * first, h and e for the head and the embedding). */
void bucket_name(const struct optim *o, const struct bucket *b, const char *what, char *out, size_t len);

/* ---- muon.c ---- */

/* Muon on parameter i's local matrices [j0, j1) (at P, gradients g,
 * momentum buf, all this device's blocks, from matrix j0 on) with each
 * matrix's Newton-Schulz run by the member of muon_group_axes that o->mp
 * names (collective over the group: two all_to_alls). Every member must
 * make the same calls in the same order: the result of a matrix does not
 * depend on which call carries it, so the update may take a tensor's
 * matrices in pieces (the first layers' first, optim_update).
 * 0 or the failing collective's -errno (-ENOMEM). */
int muon_dist(struct optim *o, int i, int j0, int j1, float *P, const float *g, float *buf, float lr,
	      float wd);

#endif
