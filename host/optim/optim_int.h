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
 * one seg that is summed over the mesh by one collective, in place over
 * its list of runs of layout floats (docs/training-step.md). */
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
	size_t at;           /* merge_runs: its seg (a run holds one seg's) */
};

struct unit {
	int seg, key;        /* key: a decoder layer, KEY_HEAD or KEY_EMBED */
	bool repl;           /* a pipeline's tensors stored whole on every stage */
	int bucket;          /* -1: nothing to sum (its seg has no axes) */
	int p0, p1;          /* its pieces */
	bool plain, gathered; /* has pieces final after their compute / after
			       * the FSDP window's reduce-scatter landed */
	int early;           /* read by the step's first gathers (prefetch):
			      * 1 + the first of them that reads it, else 0 */
	/* this step */
	bool computed, landed, done;
};

struct bucket {
	int seg;
	uint32_t axes;       /* summed over (the seg's) */
	bool deferred;       /* summed after the table, in bucket order */
	int u0, u1;          /* its units: ubk[u0 .. u1) */
	size_t n;            /* its floats */
	int r0, r1;          /* its runs o->run[r0 .. r1): summed in place
			      * in the gradients by one collective */
	/* ZeRO-1 (zero.c): the runs are the bucket's floats inside data
	 * rank 0's part of the seg, then rank 1's, ... (count[r] floats,
	 * in the order of its units), so a reduce-scatter over `data` in
	 * place leaves this rank's part of the sum where it lies, runs
	 * [own0, own1); after the update they are all-gathered in place
	 * in the parameters */
	bool zero;
	size_t *count;       /* [ndata] */
	int own0, own1;
	/* this step */
	int left;            /* units not done yet */
	bool issued;         /* its all-reduce (reduce-scatter) started */
	void *h, *h2;        /* in flight (background), or NULL; h2: zero's
			      * all-reduce over the seg's other axes */
	void *gh;            /* zero: its parameters' all-gather in flight
			      * (started by the update, waited for by the
			      * next use of its weights), or NULL */
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
	struct optim_run *run;       /* buckets' runs (struct bucket) */
	int nrun;
	size_t *zcount;              /* zero buckets' count[] */
	int *by_key;                 /* [(L + 2) * nseg * 2] unit of (key, seg,
				      * repl), or -1 */
	struct bucket *b;
	int nb;
	size_t opt_n;
	float *m, *v, *scratch;
	/* optim_keep: the next update writes m and v into these (swapped
	 * in after it), and the old parameters and gradients into pk, gk
	 * (layout-sized) */
	float *malt, *valt, *pk, *gk;
	bool keeping;                /* the next (or running) update keeps */
	float *gshard;               /* reduced gradient parts of zero segs not
				      * in buckets (zero_part) */
	struct mesh_members tg[MAX_TGROUPS];
	int ntg;
	/* the step */
	struct optim_comm oc;        /* copied at optim_step_begin */
	bool have_oc;
	bool armed;                  /* between optim_step_begin and the end of the sums */
	int stages;                  /* the table's (struct optim_place) */
	bool summing;                /* this step's stage sums started */
	void **sh;                   /* [params] a stage sum in flight, or NULL */
	struct optim_stats stats;
	struct muon_plan mp;         /* Muon's owners (a mesh with Muon) */
	struct muon_job *mq;         /* muon_dist's calls in flight, oldest first */
	struct muon_job *mfree;      /* and their buffers, kept for the next calls */
	int gpending;                /* ZeRO-1 buckets whose gather is in flight */
	/* the next step's first gathers, started once their units are
	 * updated (optim_set_prefetch) */
	int (*prefetch)(void *ctx, int upto);
	void *prefetch_ctx;
	int nfirst;                  /* those gathers (the largest early) */
};

/* ---- buckets.c ---- */

/* Units and buckets from the table's order of completion; 0 or -ENOMEM. */
int buckets_make(struct optim *o, const struct optim_place *pl);
void buckets_free(struct optim *o);
/* The unit of (key, seg, repl), or -1. */
int unit_of(const struct optim *o, int key, int seg, bool repl);
/* Starts a bucket's sum in the background: in place, one collective over
 * its runs (ZeRO-1's: a reduce-scatter). 0 or -errno. */
int bucket_issue(struct optim *o, struct bucket *b);
/* Waits for bucket b's sums in flight. 0 or -errno. */
int bucket_wait(struct optim *o, struct bucket *b);

/* The update of the early units' pieces (of segs not split by ZeRO-1)
 * whose early is `first` (0: every early unit), in layout order with
 * adjacent pieces as one range (one Muon exchange per tensor), and of
 * the rest of seg s. 0 or -errno. */
int units_update_early(struct optim *o, int64_t step, float lr, int first);
int seg_update_rest(struct optim *o, int s, int64_t step, float lr);

/* ---- zero.c ---- */

/* This rank's reduced gradients of zero seg s (s->len floats, its part
 * [p0 + s0, + len) of the layout): in buckets, the gradients' own floats
 * there (each bucket's are not written again in the step, and its
 * reduce-scatter works in place); else gshard. In range.c. */
float *zero_part(struct optim *o, const struct seg *s);

/* Every zero bucket's runs, count[] and own runs, from o->run[o->nrun]
 * on (o->run has room for each piece cut at every rank's part). */
void zero_lay_out(struct optim *o);
/* Starts a zero bucket's reduce-scatter over `data` (and the all-reduce
 * of its part over the seg's other axes), in place. 0 or -errno. */
int zero_issue(struct optim *o, struct bucket *b);
/* Waits for it: this rank's part is then in zero_part. 0 or -errno. */
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
 * window gathers), which land in the parameters. */
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
 * matrices in pieces (the first layers' first, optim_update). With
 * background exchanges (mc->start_all_to_all) the call returns with its
 * blocks on their way to the owners: the next call's leave before this
 * one's owned matrices are orthogonalised, and this one's results travel
 * while the next one's are; P is updated by a later call or muon_flush.
 * Without them, every step before it returns. The momentum (buf) is
 * updated at once; g is not read after the return.
 * 0 or the failing collective's -errno (-ENOMEM). */
int muon_dist(struct optim *o, int i, int j0, int j1, float *P, const float *g, float *buf, float lr,
	      float wd);
/* Finishes every muon_dist call in flight: their parameters are updated
 * (before anything reads them: a gather, the end of the update). 0 or
 * -errno. */
int muon_flush(struct optim *o);
/* After a failure and at the end: waits for the exchanges in flight and
 * frees them and the buffers kept for later calls. */
void muon_drop(struct optim *o);

#endif
