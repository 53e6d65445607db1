/* Private to host/optim: the optimizer's state and the calls between its
 * files. They go one way: optim.c calls buckets.c and muon.c, which call
 * nothing of optim.c or of each other.
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
	bool zero;           /* ZeRO-1: the state is split over `data`, the
			      * gradients reduce-scattered after the table
			      * (no buckets of its own) */
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
	/* this step */
	bool computed, landed, done;
};

struct bucket {
	int seg;
	uint32_t axes;       /* summed over (the seg's) */
	bool deferred;       /* summed after the table, in bucket order */
	int u0, u1;          /* its units: ubk[u0 .. u1) */
	size_t n;            /* packed floats */
	float *buf;
	/* this step */
	int left;            /* units not done yet */
	bool issued;         /* its all-reduce started */
	void *h;             /* in flight (background), or NULL */
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
	int *by_key;                 /* [(L + 2) * nseg * 2] unit of (key, seg,
				      * repl), or -1 */
	struct bucket *b;
	int nb;
	float *bufmem;
	size_t opt_n;
	float *m, *v, *scratch;
	float *gshard;               /* zero segs' reduced gradient parts */
	struct mesh_members tg[MAX_TGROUPS];
	int ntg;
	/* the step */
	struct optim_comm oc;        /* copied at optim_step_begin */
	bool have_oc;
	bool armed;                  /* between optim_step_begin and the end of the sums */
	struct optim_stats stats;
	struct muon_plan mp;         /* Muon's owners (a mesh with Muon) */
};

/* ---- buckets.c ---- */

/* Units and buckets from the table's order of completion; 0 or -ENOMEM. */
int buckets_make(struct optim *o, const struct optim_place *pl);
void buckets_free(struct optim *o);
/* The unit of (key, seg, repl), or -1. */
int unit_of(const struct optim *o, int key, int seg, bool repl);
/* Starts a bucket's sum (its units packed first; in the background
 * when the step has background collectives). 0 or -errno. */
int bucket_issue(struct optim *o, struct bucket *b);
/* Waits for bucket b's sum in flight and unpacks it into the gradients.
 * 0 or -errno. */
int bucket_wait(struct optim *o, struct bucket *b);

/* ---- muon.c ---- */

/* Muon on parameter i's matrices (at P, gradients g, momentum buf, all
 * this device's blocks) with each matrix's Newton-Schulz run by the
 * member of muon_group_axes that o->mp names (collective over the group:
 * two all_to_alls).
 * 0 or the failing collective's -errno (-ENOMEM). */
int muon_dist(struct optim *o, int i, float *P, const float *g, float *buf, float lr, float wd);

#endif
