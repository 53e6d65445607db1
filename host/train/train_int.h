/* Private to host/train: the trainer's state, shared by train.c (the
 * trainer and its step) and train_ckpt.c (whole tensors for checkpoints).
 * Calls go one way: train.c calls nothing of train_ckpt.c. */
#ifndef MESHRUN_TRAIN_INT_H
#define MESHRUN_TRAIN_INT_H

#include "host/optim/optim.h"
#include "host/train/train.h"

#define MAX_TGROUPS 8

struct trainer {
	struct cfg cfg;
	struct model *model;
	struct optim *opt;           /* the optimizer state and update (host/optim/) */
	struct data_source *data, *eval;    /* training and held-out data, or NULL */
	int rows, global_rows;
	const struct mesh *mesh;     /* NULL on one device */
	int device, coord[AX_COUNT];
	int32_t *inputs, *targets;
	size_t win_copied;           /* the FSDP window's copies at the last step */
	struct pipe_exec *px;        /* the step's executor (a pipeline over
				      * `stage`, or a table of one stage) */
	const struct model_comm *step_mc;  /* the step's collectives, for the
				      * next step's first gathers (prefetch) */
	/* the update ahead (pipeline_update_ahead; train.c) */
	struct ahead {
		bool all;            /* the key in a pipeline: every device sums the
				      * step's scalars in the background */
		bool on;             /* and this stage ends early: it updates ahead */
		bool pending;        /* the last update went ahead, not checked yet */
		bool clipped;        /* the last step checked was clipped: wait */
		bool redo;           /* the check found the update must be redone */
		const struct train_comm *comm;
		void *h[2];          /* the scalars' sums in flight */
		double x[3];         /* loss sum, aux, squares; then their sums */
		int64_t step;        /* the step whose update is pending or was checked last */
		float lr, clip;
		double denom;
		/* the step checked last (or updated after its sums) */
		int64_t done_step;   /* -1: none */
		double done[3];      /* its loss, aux, grad_norm */
		enum step_ahead how; /* what became of its update */
	} ah;
	/* checkpoints: the whole model's table and buffers, and the groups
	 * that gather split tensors (train_ckpt.c) */
	struct model *gmodel;
	float *gp, *gm, *gv;
	struct mesh_members tg[MAX_TGROUPS];
	int ntg;
};

/* The optimizer's view of comm (NULL: one device). */
static inline const struct optim_comm *trainer_optim_comm(const struct train_comm *comm,
							  struct optim_comm *oc)
{
	if (!comm)
		return NULL;
	*oc = (struct optim_comm){ .mc = &comm->mc, .sum = comm->sum, .bg = comm->bg.all_reduce_v ? &comm->bg : NULL };
	return oc;
}

#endif
