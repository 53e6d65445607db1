/* The step-time model of host/perf/perf.h. A step is: the schedule's
 * table on every stage (compute from the measured or analytic figures,
 * each action's tensor-parallel all-reduces and FSDP gathers inside it,
 * each transfer a message on the link between its two stages' hosts),
 * simulated with the devices of one machine sharing its cores; then the
 * gradient sums the trainer does after it (over `stage` for the tensors
 * every stage holds, over the data axes for everything) and the
 * optimizer. */
#include "host/perf/perf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/optim/optim.h"
#include "host/pipeline/pipe_config.h"
#include "host/pipeline/schedule.h"
#include "kernels/kernels.h"

/* ---- collectives on a ring of p members ---- */

static double t_msg(const struct perf_link *l, double bytes)
{
	return l->lat + bytes / l->bw;
}

/* all-reduce of `bytes` on every member */
static double t_all_reduce(const struct perf_link *l, double bytes, int p)
{
	return p <= 1 ? 0 : 2.0 * (p - 1) * t_msg(l, bytes / p);
}

/* all-gather into `bytes` (each member holds bytes / p), or the
 * reduce-scatter of `bytes` */
static double t_gather(const struct perf_link *l, double bytes, int p)
{
	return p <= 1 ? 0 : (p - 1) * t_msg(l, bytes / p);
}

/* ---- compute ---- */

/* Matmul and attention FLOPs of one layer's forward on rows sequences
 * (moe: an MoE layer); *weights: the part that multiplies by weights
 * (what the weight-gradient backward W repeats once; attention's QK^T
 * and AV are the input-gradient backward's alone). */
static double layer_flops(const struct model_dims *d, int rows, bool moe, double *weights)
{
	double N = (double)rows * d->T, C = d->C, QD = (double)d->Hq * d->D, KD = (double)d->Hkv * d->D;
	double f = 2 * N * (C * QD * 2 + C * KD * 2);       /* q, o, k, v */
	if (moe)
		f += 2 * N * (3 * C * d->Fe * (d->K + d->S) + C * d->E);
	else
		f += 2 * N * 3 * C * d->F;
	*weights = f;
	return f + 4 * N * d->T * QD / 2;                    /* causal QK^T and AV */
}

void perf_analytic(const struct model_dims *d, int rows, double flops, struct perf_compute *pc)
{
	double N = (double)rows * d->T;
	memset(pc, 0, sizeof(*pc));
	for (int k = 0; k < 2; k++) {
		double w;
		pc->f_layer[k] = layer_flops(d, rows, k, &w) / flops;
		pc->b_layer[k] = 2 * pc->f_layer[k];
		pc->w_layer[k] = w / flops;  /* dW = dY^T X: the weights' matmuls once */
		pc->i_layer[k] = pc->b_layer[k] - pc->w_layer[k];
	}
	pc->head = 3 * 2 * N * d->C * d->V / flops;
	pc->embed_f = pc->embed_b = 0;
	/* AdamW reads 4 floats and writes 3 a parameter: 28 bytes at 20 GB/s */
	pc->opt_per_float = 28 / 20e9;
	pc->ns_per_flop = 1 / flops;
	pc->rows = rows;
}

/* The compute figures for mb rows on a device of tensor split tp and
 * expert split ep (measured ones scaled from the rows they were for). */
static struct perf_compute scaled(const struct perf_compute *pc, int mb, int tp, int ep)
{
	struct perf_compute s = *pc;
	double r = (double)mb / pc->rows;
	for (int k = 0; k < 2; k++) {
		double split = k ? tp * ep : tp;
		s.f_layer[k] *= r / split;
		s.b_layer[k] *= r / split;
		s.i_layer[k] *= r / split;
		s.w_layer[k] *= r / split;
	}
	s.head *= r / tp;
	s.embed_f *= r;
	s.embed_b *= r;
	s.rows = mb;
	return s;
}

/* ---- the mesh ---- */

struct shape {
	struct model_dims d;
	struct mesh m;
	struct shard_rules rules;
	struct pipe_config pc;
	uint32_t rows_axes;
	int B, mb, tp, ep, fsdp, data;
};

static int axis(const struct mesh *m, int a)
{
	return m->size[a];
}

/* Whether the devices that differ on axes span hosts. */
static bool over_dcn(const struct mesh *m, uint32_t axes)
{
	for (int a = 0; a < AX_COUNT; a++)
		if ((axes >> a & 1) && m->dcn[a] > 1)
			return true;
	return false;
}

static int resolve(struct shape *sh, const struct cfg *c, char *err, size_t errlen)
{
	int rc;
	memset(sh, 0, sizeof(*sh));
	if ((rc = model_dims_from_cfg(&sh->d, c, err, errlen)) || (rc = shard_rules_from_cfg(&sh->rules, c, err, errlen)))
		return rc;
	mesh_init(&sh->m, c);
	struct model_mesh mm = { .mesh = &sh->m, .rules = &sh->rules, .device = 0 };
	if ((rc = model_plan_rows(&mm, sh->d.C, &sh->rows_axes, err, errlen)))
		return rc;
	int split = 1;
	for (int a = 0; a < AX_COUNT; a++)
		if (sh->rows_axes >> a & 1)
			split *= axis(&sh->m, a);
	sh->B = (int)(c->per_device_batch_size * sh->m.num_devices / split);
	if (axis(&sh->m, AX_STAGE) > 1)
		rc = pipe_config_resolve(&sh->pc, c, &sh->d, err, errlen);
	else
		pipe_config_one_device(&sh->pc, &sh->d, sh->B);
	if (rc)
		return rc;
	if (sh->B % sh->pc.shape.microbatches) {
		snprintf(err, errlen, "config: a stage group's %d rows do not split into num_pipeline_microbatches=%d",
			 sh->B, sh->pc.shape.microbatches);
		return -EINVAL;
	}
	sh->mb = sh->B / sh->pc.shape.microbatches;
	sh->tp = axis(&sh->m, AX_TENSOR) * axis(&sh->m, AX_TENSOR_T);
	sh->ep = axis(&sh->m, AX_EXPERT);
	sh->fsdp = axis(&sh->m, AX_FSDP) * axis(&sh->m, AX_FSDP_T);
	sh->data = axis(&sh->m, AX_DATA);
	return 0;
}

int perf_mb_rows(const struct cfg *c, const struct model_dims *d, char *err, size_t errlen)
{
	struct shape *sh = malloc(sizeof(*sh));
	(void)d;
	if (!sh)
		return -ENOMEM;
	int rc = resolve(sh, c, err, errlen), mb = sh->mb;
	free(sh);
	return rc ? rc : mb;
}

/* ---- the table, timed with shared cores ---- */

struct fluid {
	const struct pipe_table *t;
	double gather[3];  /* seconds of a gather (or reduce-scatter) of: a chunk, the
			    * non-layer tensors, the layers outside the pipeline */
	int **match;       /* [S][n] a receive's send (its index in the peer's list), else -1 */
	double **dur;      /* [S][n] compute work, or a wait (negative: -seconds) */
	double *hop;       /* [S * S] a transfer's seconds */
	double cores;
	int threads, groups;  /* groups: stage groups computing beside this one (sharing the cores) */
	/* results */
	double end, busy_max, run_of_busiest, idle_worst, busy_sum;
	double stage_busy[PERF_STAGES], stage_end[PERF_STAGES];
};

static bool cpu_op(int op)
{
	return op == PA_F || op == PA_B || op == PA_I || op == PA_W || op == PA_FC || op == PA_EMBED ||
	       op == PA_HEAD || op == PA_EMBED_BACK;
}

/* The time stage s's receive at k can complete, or -1 if its send has
 * not been issued yet. */
static double arrival(const struct fluid *f, double **issued, int s, int k)
{
	const struct pipe_action *a = &f->t->a[s][k];
	int j = f->match[s][k];
	if (j < 0 || issued[a->peer][j] < 0)
		return -1;
	return issued[a->peer][j] + f->hop[a->peer * f->t->shape.stages + s];
}

/* A send or receive, keyed by what moves where. */
struct xfer_key {
	uint32_t kind, idx;
	int from, to, s, k;
};

static int cmp_key(const void *a, const void *b)
{
	const struct xfer_key *x = a, *y = b;
	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	if (x->idx != y->idx)
		return x->idx < y->idx ? -1 : 1;
	if (x->from != y->from)
		return x->from < y->from ? -1 : 1;
	return x->to < y->to ? -1 : x->to > y->to;
}

/* f->match: each receive's send, by sorting both by (message, from, to). */
static int match_sends(struct fluid *f)
{
	const struct pipe_table *t = f->t;
	int S = t->shape.stages, m = 0;
	size_t n = 0;
	for (int s = 0; s < S; s++)
		n += (size_t)t->n[s];
	struct xfer_key *x = malloc(sizeof(*x) * (n ? n : 1));
	f->match = calloc((size_t)S, sizeof(*f->match));
	if (!x || !f->match) {
		free(x);
		return -ENOMEM;
	}
	for (int s = 0; s < S; s++) {
		f->match[s] = malloc(sizeof(int) * (size_t)(t->n[s] + 1));
		if (!f->match[s]) {
			free(x);
			return -ENOMEM;
		}
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			f->match[s][k] = -1;
			if (a->op != PA_SEND && a->op != PA_RECV)
				continue;
			struct xfer_key *q = &x[m++];
			pipe_val_msg(t, &a->val, &q->kind, &q->idx);
			q->from = a->op == PA_SEND ? s : a->peer;
			q->to = a->op == PA_SEND ? a->peer : s;
			q->s = s;
			q->k = k;
		}
	}
	qsort(x, (size_t)m, sizeof(*x), cmp_key);
	for (int i = 0; i + 1 < m; i++)
		if (!cmp_key(&x[i], &x[i + 1])) {  /* the send (on `from`) and its receive */
			const struct xfer_key *snd = x[i].s == x[i].from ? &x[i] : &x[i + 1];
			const struct xfer_key *rcv = snd == &x[i] ? &x[i + 1] : &x[i];
			f->match[rcv->s][rcv->k] = snd->k;
		}
	free(x);
	return 0;
}

struct dev_state {
	int ptr;
	bool running, waiting, at_sum;
	double left, until, first, last, busy, run;
	double link;       /* when its FSDP gathers and reduce-scatters are done */
	double ready[67];  /* each window slot's gather lands */
};

/* The window slot of a weight action or of what a compute action reads
 * (64 chunk slots at most, then the non-layer and outside ones). */
static int wslot(const struct pipe_action *a)
{
	switch (a->op) {
	case PA_GATHER:
	case PA_RELEASE:
	case PA_REDUCE_SCATTER:
		return a->chunk == PIPE_G_NONLAYER ? 64 : a->chunk == PIPE_G_OUTSIDE ? 65 : a->slot & 63;
	case PA_F:
	case PA_FC:
	case PA_B:
	case PA_I:
	case PA_W:
		return a->slot & 63;
	case PA_EMBED:
	case PA_HEAD:
	case PA_EMBED_BACK:
		return 64;
	default:
		return 66;
	}
}

static double gather_time(const struct fluid *f, const struct pipe_action *a)
{
	return f->gather[a->chunk >= 0 ? 0 : a->chunk == PIPE_G_NONLAYER ? 1 : 2];
}

/* Starts whatever device d can at time now; true if anything moved. */
static bool start(struct fluid *f, struct dev_state *ds, double **issued, int d, double now, int *at_sum)
{
	const struct pipe_table *t = f->t;
	struct dev_state *x = &ds[d];
	bool moved = false;
	while (!x->running && !x->waiting && x->ptr < t->n[d]) {
		const struct pipe_action *a = &t->a[d][x->ptr];
		double w = f->dur[d][x->ptr];
		if (a->op == PA_RECV) {
			double at = arrival(f, issued, d, x->ptr);
			if (at < 0)
				break;
			if (at > now) {
				x->waiting = true;
				x->until = at;
				break;
			}
			if (w > 0) {  /* it reads and decrypts the message */
				x->running = true;
				x->left = w;
				break;
			}
		} else if (a->op == PA_SEND) {
			if (w > 0) {  /* it encrypts and writes the message, then it is issued */
				x->running = true;
				x->left = w;
				break;
			}
			issued[d][x->ptr] = now;
		} else if (a->op == PA_GATHER || a->op == PA_REDUCE_SCATTER) {
			/* one collective at a time on the device's link, in table order */
			x->link = fmax(x->link, now) + gather_time(f, a);
			if (a->op == PA_GATHER)
				x->ready[wslot(a)] = x->link;
		} else if (cpu_op(a->op) && x->ready[wslot(a)] > now) {
			x->waiting = true;  /* for its weights */
			x->until = x->ready[wslot(a)];
			break;
		} else if (a->op == PA_COUNT_SUM) {
			if (!x->at_sum) {
				x->at_sum = true;
				++*at_sum;
			}
			if (*at_sum < t->shape.stages)
				break;
		} else if (cpu_op(a->op) && w > 0) {
			x->running = true;
			x->left = w;
			x->first = x->first < 0 ? now : x->first;
			break;
		}
		x->ptr++;
		moved = true;
	}
	return moved;
}

static int fluid_run(struct fluid *f)
{
	const struct pipe_table *t = f->t;
	int S = t->shape.stages, at_sum = 0, rc = 0;
	size_t nS = (unsigned)S;
	struct dev_state *ds = calloc(nS, sizeof(*ds));
	double **issued = calloc(nS, sizeof(*issued)), now = 0;
	for (int s = 0; ds && issued && s < S; s++) {
		ds[s].first = -1;
		issued[s] = malloc(sizeof(double) * (size_t)(t->n[s] + 1));
		for (int k = 0; issued[s] && k < t->n[s]; k++)
			issued[s][k] = -1;
		if (!issued[s])
			rc = -ENOMEM;
	}
	if (!ds || !issued)
		rc = -ENOMEM;
	while (!rc) {
		for (bool moved = true; moved;) {
			moved = false;
			for (int s = 0; s < S; s++)
				moved |= start(f, ds, issued, s, now, &at_sum);
			if (at_sum == S)
				for (int s = 0; s < S; s++)
					if (ds[s].at_sum && ds[s].ptr < t->n[s] && t->a[s][ds[s].ptr].op == PA_COUNT_SUM) {
						ds[s].ptr++;
						ds[s].at_sum = false;
						moved = true;
					}
		}
		int active = 0, done = 0;
		double dt = 1e300;
		for (int s = 0; s < S; s++) {
			active += ds[s].running;
			done += ds[s].ptr >= t->n[s] && !ds[s].running && !ds[s].waiting;
		}
		if (done == S) {
			for (int s = 0; s < S; s++)  /* the last reduce-scatters land */
				now = fmax(now, ds[s].link);
			break;
		}
		double rate = f->cores <= 0 ? 1 : fmin(1.0, f->cores / (active * f->groups * (f->threads > 0 ? f->threads : 1)));
		for (int s = 0; s < S; s++) {
			if (ds[s].running)
				dt = fmin(dt, ds[s].left / rate);
			if (ds[s].waiting)
				dt = fmin(dt, ds[s].until - now);
		}
		if (dt >= 1e299) {
			rc = -EDEADLK;
			break;
		}
		now += dt;
		for (int s = 0; s < S; s++) {
			struct dev_state *x = &ds[s];
			x->run += x->running ? dt : 0;
			if (x->running && (x->left -= rate * dt) <= 1e-12) {
				x->running = false;
				x->busy += f->dur[s][x->ptr];
				if (t->a[s][x->ptr].op == PA_SEND)
					issued[s][x->ptr] = now;
				x->last = now;
				x->ptr++;
			}
			if (x->waiting && x->until <= now + 1e-15)
				x->waiting = false;
		}
	}
	f->end = now;
	for (int s = 0; ds && s < S; s++)
		if (ds[s].busy > f->busy_max) {
			f->busy_max = ds[s].busy;
			f->run_of_busiest = ds[s].run;
		}
	for (int s = 0; ds && s < S && s < PERF_STAGES; s++) {
		f->stage_busy[s] = ds[s].busy;
		f->stage_end[s] = ds[s].last;
	}
	for (int s = 0; ds && s < S; s++) {
		double span = ds[s].last - ds[s].first;
		f->busy_sum += ds[s].busy;
		if (ds[s].first >= 0 && span > 0 && 1 - ds[s].run / span > f->idle_worst)
			f->idle_worst = 1 - ds[s].run / span;
	}
	for (int s = 0; issued && s < S; s++)
		free(issued[s]);
	free(issued);
	free(ds);
	return rc;
}

/* ---- the step ---- */

/* Each action's compute or wait, from the figures. */
static int durations(struct fluid *f, const struct shape *sh, const struct perf_compute *pc,
		     const struct perf_machine *mc, const double *run, double *const *each)
{
	const struct pipe_table *t = f->t;
	const struct pipe_shape *p = &t->shape;
	int lps = p->layers_per_stage, kind = p->moe;
	double act = (double)sh->mb * sh->d.T * sh->d.C * sizeof(float), msg = act / sh->tp;
	const struct perf_link *tl = over_dcn(&sh->m, 1u << AX_TENSOR | 1u << AX_TENSOR_T) ? &mc->dcn : &mc->ici;
	double tp_ar = 2 * t_all_reduce(tl, act, sh->tp);  /* attention and MLP outputs (or their gradients) */
	double ff = lps * (pc->f_layer[kind] + tp_ar), bb = lps * (pc->b_layer[kind] + tp_ar);
	/* the split backward: I carries the input gradients' all-reduces, W none */
	double il = pc->b_layer[kind] / 2, wl = il;
	if (mc->i_frac > 0 && mc->w_frac > 0) {
		il = mc->i_frac * pc->b_layer[kind];
		wl = mc->w_frac * pc->b_layer[kind];
	} else if (pc->i_layer[kind] > 0 && pc->w_layer[kind] > 0) {
		il = pc->i_layer[kind];
		wl = pc->w_layer[kind];
	}
	double ii = lps * (il + tp_ar), ww = lps * wl;
	double before = sh->pc.layers_before, after = sh->pc.layers_after;
	f->dur = calloc((size_t)p->stages, sizeof(*f->dur));
	if (!f->dur)
		return -ENOMEM;
	for (int s = 0; s < p->stages; s++) {
		f->dur[s] = calloc((size_t)t->n[s] + 1, sizeof(double));
		if (!f->dur[s])
			return -ENOMEM;
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			double *d = &f->dur[s][k];
			if (run) {  /* the run's own: its kind's mean on this stage, or its
				     * own mean; a transfer's as run_costs charged it */
				*d = a->op == PA_SEND || a->op == PA_RECV ? run[s * PA_COUNT + a->op] : !cpu_op(a->op) ? 0 :
				     each ? each[s][k] : run[s * PA_COUNT + a->op];
				continue;
			}
			switch (a->op) {
			case PA_F:
			case PA_FC:
				*d = ff;
				break;
			case PA_B:
				*d = bb + (p->recompute ? ff : 0);
				break;
			case PA_I:
				*d = ii + (p->recompute ? ff : 0);
				break;
			case PA_W:
				*d = ww;
				break;
			case PA_EMBED:
				*d = pc->embed_f + before * (pc->f_layer[0] + tp_ar);
				break;
			case PA_HEAD:
				*d = pc->head + after * (pc->f_layer[0] + pc->b_layer[0] + 2 * tp_ar);
				break;
			case PA_EMBED_BACK:
				*d = pc->embed_b + before * (2 * pc->f_layer[0] + pc->b_layer[0] + 3 * tp_ar);
				break;
			case PA_SEND:
				*d = msg * pc->xfer_send;
				break;
			case PA_RECV:
				*d = msg * pc->xfer_recv;
				break;
			default:
				break;
			}
		}
	}
	return 0;
}

/* A transfer's seconds between its send and its receive: the link's
 * latency and bytes over its bandwidth, less the CPU its two ends spend
 * on it (charged to them as compute: on loopback TLS, which `meshrun
 * bench link` measures, that CPU is what limits the bandwidth). */
static void hops(struct fluid *f, const struct shape *sh, const struct perf_machine *mc,
		 const struct perf_compute *pc)
{
	int S = f->t->shape.stages, coord[AX_COUNT] = { 0 };
	double act = (double)sh->mb * sh->d.T * sh->d.C * sizeof(float) / sh->tp;
	double ends = act * (pc->xfer_send + pc->xfer_recv);
	for (int a = 0; a < S; a++)
		for (int b = 0; b < S; b++) {
			coord[AX_STAGE] = a;
			int da = mesh_device(&sh->m, coord);
			coord[AX_STAGE] = b;
			int db = mesh_device(&sh->m, coord);
			bool same = mesh_host_of(&sh->m, da) == mesh_host_of(&sh->m, db);
			const struct perf_link *l = same ? &mc->ici : &mc->dcn;
			f->hop[a * S + b] = l->lat + fmax(0, act / l->bw - ends);
		}
}

/* Muon (opt_type=muon) on this device: the Newton-Schulz FLOPs it runs
 * and the seconds of its two all_to_alls. Each matrix is orthogonalised
 * once across its group (the devices that differ on its matrix split or
 * on the axes it is not split on; host/optim/muon.c), by one owner the
 * trainer picks by size; the model shares the group's matrices out evenly
 * (nmat / G a device; the real plan is within one matrix of it); five
 * iterations of X X^T, A A and B X, 4 a^2 b + 2 a^3 FLOPs each for an
 * a x b matrix (a <= b). The exchanges: each member sends (G-1)/G of its
 * blocks to the owners and gets the results back. */
static void muon_work(const struct shape *sh, const struct model *pl, const struct perf_machine *mc,
		      double *ns_flops, double *xchg_s)
{
	*ns_flops = *xchg_s = 0;
	for (int i = 0; i < model_num_params(pl); i++) {
		const struct param_info *p = model_param(pl, i);
		if (p->opt != OPT_MUON || p->mat_rows <= 0 || p->mat_cols <= 0)
			continue;
		uint32_t axes = muon_group_axes(&sh->m, p);  /* the devices that share the matrix */
		int blocks = 1, G = mesh_axes_size(&sh->m, axes);
		for (int a = 0; a < AX_COUNT; a++)
			if (p->mat_split & 1u << a)
				blocks *= sh->m.size[a];
		double nmat = (double)p->numel * blocks / ((double)p->mat_rows * p->mat_cols);
		*ns_flops += nmat / G * newton_schulz5_flops(p->mat_rows, p->mat_cols);
		if (G > 1) {
			const struct perf_link *l = over_dcn(&sh->m, axes) ? &mc->dcn : &mc->ici;
			*xchg_s += 2 * (G - 1) * t_msg(l, (double)p->numel * sizeof(float) / G);
		}
	}
}

/* Memory per device: the model's storage, gradients and AdamW state (the
 * plan of this device's shards), the FSDP window, the table's
 * activation buffers and sets of saved layer activations. */
static int memory(struct perf_parts *o, const struct shape *sh, const struct pipe_table *t, const struct cfg *c,
		  const struct perf_machine *mc, double *layer_bytes, double *nonstage_bytes, double *muon_flops,
		  double *muon_xchg, char *err, size_t errlen)
{
	struct model_mesh mm = { .mesh = &sh->m, .rules = &sh->rules, .device = 0 };
	if (sh->pc.shape.stages > 1)
		pipe_config_model_mesh(&sh->pc, &mm);
	struct model *pl = model_plan_new(&sh->d, &mm, err, errlen);
	if (!pl)
		return -EINVAL;
	double params = 0, ns = 0;
	for (int i = 0; i < model_num_params(pl); i++) {
		const struct param_info *p = model_param(pl, i);
		params += (double)p->numel * sizeof(float);
		if (!(p->split & 1u << AX_STAGE))
			ns += (double)p->numel * sizeof(float);
	}
	o->mem_params = o->mem_grads = params;
	o->mem_opt = (c->shard_optimizer_over_data && sh->data > 1 ? 2.0 / sh->data : 2.0) * params;
	o->mem_window = (double)model_window_numel(pl) * sizeof(float);
	*layer_bytes = (params - ns) / (sh->pc.layers / sh->pc.shape.stages > 0 ? sh->pc.layers / sh->pc.shape.stages : 1);
	*nonstage_bytes = ns;
	*muon_flops = *muon_xchg = 0;
	if (!strcmp(c->opt_type, "muon"))
		muon_work(sh, pl, mc, muon_flops, muon_xchg);
	model_free(pl);
	/* the microbatch buffers, with the landing buffers (pipe_landing_bufs,
	 * as the executor allocates them) */
	double act = (double)sh->mb * sh->d.T * sh->d.C * sizeof(float);
	int worst = 0;
	for (int s = 0; s < t->shape.stages; s++) {
		int nb = t->bufs[s] + t->scratch[s] + pipe_landing_bufs(t, s, (size_t)act);
		worst = nb > worst ? nb : worst;
	}
	int call = sh->pc.shape.one_device ? sh->d.L : t->shape.layers_per_stage;
	bool moe = sh->d.L_moe > 0;
	double sets = 0, per_set = (double)call * model_layer_act_bytes(&sh->d, sh->mb, moe);
	double per_stash = (double)call * model_layer_w_stash_bytes(&sh->d, sh->mb, moe, !t->shape.recompute);
	for (int s = 0; s < t->shape.stages; s++) {  /* the stage that holds most */
		double x = t->act_sets[s] * per_set + t->w_stashes[s] * per_stash;
		sets = x > sets ? x : sets;
	}
	o->mem_act = worst * act + sets / sh->tp + 3.0 * sh->mb * sh->d.T * sh->d.V * sizeof(float) / sh->tp;
	o->mem_total = o->mem_params + o->mem_grads + o->mem_opt + o->mem_window + o->mem_act;
	return 0;
}

/* o->run_*: each stage's compute and its last end in the run (its first
 * device; means over the steps read). */
static void run_stages(struct perf_parts *o, const struct shape *sh, const struct perf_trace *tr)
{
	int coord[AX_COUNT], nst = tr->step1 - tr->step0 + 1, first[PERF_STAGES];
	for (int s = 0; s < PERF_STAGES; s++)
		first[s] = -1;
	for (int d = tr->ndev - 1; d >= 0; d--) {
		mesh_coords(&sh->m, d, coord);
		if (coord[AX_STAGE] < PERF_STAGES)
			first[coord[AX_STAGE]] = d;
	}
	for (int st = tr->step0; st <= tr->step1; st++) {
		double t0 = 1e300;
		for (int d = 0; d < tr->ndev; d++)
			for (int i = 0; i < tr->n[d]; i++)
				if (tr->sp[d][i].step == st)
					t0 = fmin(t0, tr->sp[d][i].ts);
		for (int s = 0; s < PERF_STAGES; s++) {
			double end = t0;
			for (int i = 0, d = first[s]; d >= 0 && i < tr->n[d]; i++) {
				const struct perf_tspan *x = &tr->sp[d][i];
				if (x->step != st)
					continue;
				o->run_cpu[s] += x->cpu / nst;
				o->run_wall[s] += x->dur / nst;
				end = fmax(end, x->ts + x->dur);
			}
			o->run_end[s] += first[s] >= 0 ? (end - t0) / nst : 0;
		}
	}
}

/* ---- a run's own costs (--costs-from) ---- */

/* An action of the table as the trace names it (host/train/train_job.c). */
static void traced_name(const struct pipe_action *a, char *out, size_t len)
{
	if (a->op == PA_EMBED || a->op == PA_HEAD || a->op == PA_EMBED_BACK)
		snprintf(out, len, "%s mb%d", pipe_act_name(a->op), a->mb);
	else
		snprintf(out, len, "%s mb%d c%d", pipe_act_name(a->op), a->mb, a->chunk);
}

/* cost[s * PA_COUNT + op]: the mean CPU seconds of op's actions on
 * stage s in the run tr (a counting forward without its own spans costs
 * a forward). The trace must be of t on sh's mesh: as many devices, and
 * each device, in each step read, ran its stage's compute actions in the
 * table's order (W's may move: pipeline_fill_waits runs owed ones in
 * receive waits; their count must match). */
static int run_costs(const struct pipe_table *t, const struct shape *sh, const struct perf_trace *tr,
		     bool wall, double *cost, double **each, char *err, size_t errlen)
{
	int S = t->shape.stages, coord[AX_COUNT];
	double *n = calloc((size_t)S * PA_COUNT, sizeof(double));
	char want[32], cfgtxt[160];
	snprintf(cfgtxt, sizeof(cfgtxt), "pipeline_schedule=%s num_pipeline_microbatches=%d on %d stages",
		 pipe_sched_name(t->shape.sched), t->shape.microbatches, S);
	if (!n)
		return -ENOMEM;
	int rc = 0;
	if (tr->ndev != sh->m.num_devices) {
		snprintf(err, errlen, "--costs-from '%s': the trace has %d devices, the config's mesh %d (%s)", tr->path,
			 tr->ndev, sh->m.num_devices, cfgtxt);
		rc = -EINVAL;
	}
	int mbs = 0;  /* the run's microbatches: the most mb named, plus one */
	for (int d = 0; d < tr->ndev; d++)
		for (int i = 0; i < tr->n[d]; i++) {
			const char *m = strstr(tr->sp[d][i].name, " mb");
			int mb = m ? atoi(m + 3) : 0;
			mbs = mb + 1 > mbs ? mb + 1 : mbs;
		}
	if (!rc && mbs != t->shape.microbatches) {
		snprintf(err, errlen, "--costs-from '%s': the trace's steps have %d microbatches, the config %d (%s)",
			 tr->path, mbs, t->shape.microbatches, cfgtxt);
		rc = -EINVAL;
	}
	/* each action's own mean: over the steps and the stage's devices */
	double per = (double)S / ((tr->step1 - tr->step0 + 1) * sh->m.num_devices);
	for (int d = 0; !rc && d < tr->ndev; d++) {
		mesh_coords(&sh->m, d, coord);
		int s = coord[AX_STAGE], i = 0;
		for (int st = tr->step0; !rc && st <= tr->step1; st++) {
			int k = 0, w_table = 0, w_run = 0;
			for (;; i++) {
				const struct perf_tspan *x = i < tr->n[d] && tr->sp[d][i].step == st ? &tr->sp[d][i] : NULL;
				double v = !x ? 0 : wall ? x->dur : x->cpu;
				while (k < t->n[s] && (!cpu_op(t->a[s][k].op) || t->a[s][k].op == PA_W))
					w_table += t->a[s][k++].op == PA_W;
				if (x && x->op == PA_W) {
					w_run++;
					n[s * PA_COUNT + PA_W]++;
					cost[s * PA_COUNT + PA_W] += v;
					for (int j = 0; each && j < t->n[s]; j++)  /* its own W, wherever it ran */
						if (t->a[s][j].op == PA_W) {
							traced_name(&t->a[s][j], want, sizeof(want));
							if (!strcmp(x->name, want)) {
								each[s][j] += v * per;
								break;
							}
						}
					continue;
				}
				if (!x && k == t->n[s])
					break;
				if (k < t->n[s])
					traced_name(&t->a[s][k], want, sizeof(want));
				if (!x || k == t->n[s] || strcmp(x->name, want)) {
					char got[40], has[40];
					snprintf(got, sizeof(got), x ? "'%s'" : "nothing more", x ? x->name : "");
					snprintf(has, sizeof(has), k < t->n[s] ? "'%s'" : "nothing more", k < t->n[s] ? want : "");
					snprintf(err, errlen, "--costs-from '%s': device %d (stage %d) in step %d ran %s where the "
						 "table of %s has %s (a trace of another schedule, M or mesh?)", tr->path, d, s, st, got,
						 cfgtxt, has);
					rc = -EINVAL;
					break;
				}
				n[s * PA_COUNT + x->op]++;
				cost[s * PA_COUNT + x->op] += v;
				if (each)
					each[s][k] += v * per;
				k++;
			}
			if (!rc && w_run != w_table) {
				snprintf(err, errlen, "--costs-from '%s': device %d (stage %d) in step %d ran %d W actions, the "
					 "table of %s has %d", tr->path, d, s, st, w_run, cfgtxt, w_table);
				rc = -EINVAL;
			}
		}
	}
	for (int j = 0; !rc && j < S * PA_COUNT; j++)
		cost[j] = n[j] > 0 ? cost[j] / n[j] : 0;
	/* the transfers: each send and receive its traced CPU (the mean of
	 * the stage's over the steps read), with every --costs-by; from an
	 * older trace without it, at walls, a send its device's untraced
	 * time over its sends (the stage's devices' mean) */
	for (int s = 0; tr->xfer_traced && !rc && s < S; s++) {
		double sc = 0, rcpu = 0;
		int ns = 0, nr = 0;
		for (int d = 0; d < tr->ndev; d++) {
			mesh_coords(&sh->m, d, coord);
			if (coord[AX_STAGE] != s)
				continue;
			sc += tr->send_cpu[d];
			ns += tr->nsend[d];
			rcpu += tr->recv_cpu[d];
			nr += tr->nrecv[d];
		}
		cost[s * PA_COUNT + PA_SEND] = ns ? sc / ns : 0;
		cost[s * PA_COUNT + PA_RECV] = nr ? rcpu / nr : 0;
	}
	for (int d = 0; wall && !tr->xfer_traced && !rc && d < tr->ndev; d++) {
		mesh_coords(&sh->m, d, coord);
		int s = coord[AX_STAGE], sends = 0;
		for (int k = 0; k < t->n[s]; k++)
			sends += t->a[s][k].op == PA_SEND;
		if (sends)
			cost[s * PA_COUNT + PA_SEND] += tr->untraced[d] / sends / sh->m.num_devices * S;
	}
	for (int s = 0; !rc && s < S; s++)
		if (n[s * PA_COUNT + PA_FC] == 0)
			cost[s * PA_COUNT + PA_FC] = cost[s * PA_COUNT + PA_F];
	free(n);
	return rc;
}

int perf_predict(const struct cfg *c, const struct perf_machine *mc, const struct perf_compute *given,
		 struct perf_parts *o, char *err, size_t errlen)
{
	struct shape *sh = malloc(sizeof(*sh));
	struct pipe_table t = { 0 };
	struct fluid f = { 0 };
	struct perf_compute pc;
	double layer_bytes = 0, ns_bytes = 0, muon_flops = 0, muon_xchg = 0, *run = NULL, **each = NULL;
	int rc = sh ? resolve(sh, c, err, errlen) : -ENOMEM;
	memset(o, 0, sizeof(*o));
	if (!rc)
		rc = pipe_table_build(&t, &sh->pc.shape, err, errlen);
	if (!rc && (rc = memory(o, sh, &t, c, mc, &layer_bytes, &ns_bytes, &muon_flops, &muon_xchg, err, errlen)) == 0) {
		struct perf_compute an = { .rows = sh->mb };
		if (!given && !mc->run)
			perf_analytic(&sh->d, sh->mb, mc->flops, &an);
		pc = scaled(given ? given : &an, sh->mb, sh->tp, sh->ep);
		int S = t.shape.stages;
		if (mc->run && !(run = calloc((size_t)S * PA_COUNT, sizeof(double))))
			rc = -ENOMEM;
		if (run && mc->run_by != PERF_RUN_KIND && !(each = calloc((size_t)S, sizeof(*each))))
			rc = -ENOMEM;
		for (int s = 0; each && !rc && s < S; s++)
			if (!(each[s] = calloc((size_t)t.n[s] + 1, sizeof(double))))
				rc = -ENOMEM;
		if (run && !rc && (rc = run_costs(&t, sh, mc->run, mc->run_by == PERF_RUN_WALL, run, each, err, errlen)))
			goto out;
		if (run)
			o->xfer_by = mc->run->xfer_traced ? PERF_XFER_TRACED :
				     mc->run_by == PERF_RUN_WALL ? PERF_XFER_UNTRACED : PERF_XFER_NONE;
		uint32_t fsdp_axes = 1u << AX_FSDP | 1u << AX_FSDP_T;
		const struct perf_link *fl = over_dcn(&sh->m, fsdp_axes) ? &mc->dcn : &mc->ici;
		double outside = sh->pc.layers_before + sh->pc.layers_after;
		f.gather[0] = t_gather(fl, layer_bytes * sh->fsdp * t.shape.layers_per_stage, sh->fsdp);
		f.gather[1] = t_gather(fl, (ns_bytes - outside * layer_bytes) * sh->fsdp, sh->fsdp);
		f.gather[2] = t_gather(fl, outside * layer_bytes * sh->fsdp, sh->fsdp);
		f.t = &t;
		f.cores = mc->run && mc->cores <= 0 && mc->run_by != PERF_RUN_WALL ? mc->run->cores : mc->cores;
		f.groups = sh->m.num_devices / S;  /* every stage group runs the same lists at once */
		f.threads = given && given->threads > 0 ? given->threads : 1;
		f.hop = calloc((size_t)S * S, sizeof(double));
		rc = rc ? rc : !f.hop ? -ENOMEM : durations(&f, sh, &pc, mc, run, each);
		if (!rc)
			rc = match_sends(&f);
		if (!rc) {
			hops(&f, sh, mc, &pc);
			rc = fluid_run(&f);
			if (rc == -EDEADLK)
				snprintf(err, errlen, "the table does not run to its end (a deadlock)");
		}
		if (!rc) {
			uint32_t st = 1u << AX_STAGE;
			const struct perf_link *sl = over_dcn(&sh->m, st) ? &mc->dcn : &mc->ici;
			const struct perf_link *dl = over_dcn(&sh->m, 1u << AX_DATA) ? &mc->dcn : &mc->ici;
			o->table = f.end;
			o->compute = f.busy_max;
			o->running = f.run_of_busiest;
			o->bubble = f.idle_worst;
			o->tail = t_all_reduce(sl, ns_bytes, S) + t_all_reduce(dl, o->mem_grads, sh->data) +
				  (S > 1 || sh->data > 1 ? 2 * 2 * sl->lat : 0);
			o->optimizer = pc.opt_per_float * o->mem_params / sizeof(float) /
				       (c->shard_optimizer_over_data && sh->data > 1 ? sh->data : 1);
			/* Muon: Newton-Schulz at --flops, else at the rate measured on
			 * Newton-Schulz itself, else at the measured layer forward's;
			 * and its exchanges */
			double wflops, spf = 0;
			if (muon_flops > 0)
				spf = mc->flops > 0 ? 1 / mc->flops : pc.ns_per_flop > 0 ? pc.ns_per_flop :
				      pc.f_layer[0] * sh->tp / layer_flops(&sh->d, pc.rows, false, &wflops);
			/* every device runs its optimizer at once: on shared cores,
			 * at their share */
			double opt_cpu = o->optimizer + muon_flops * spf;
			double share = f.cores > 0 ? fmax(1, sh->m.num_devices * f.threads / f.cores) : 1;
			if (mc->run) {  /* the run's optimizer span, every device at once */
				opt_cpu = mc->run->opt_s / share;
				muon_flops = muon_xchg = 0;
			}
			o->muon_ns = muon_flops * spf * share;
			o->optimizer = opt_cpu * share + muon_xchg;
			o->step = o->table + o->tail + o->optimizer;
			o->work = f.busy_sum * f.groups + opt_cpu * sh->m.num_devices;
			for (int s = 0; s < S; s++)
				for (int k = 0; k < t.n[s]; k++) {
					int op = t.a[s][k].op;
					int kind = op == PA_F || op == PA_FC ? PERF_F : op == PA_B ? PERF_B :
						   op == PA_I ? PERF_I : op == PA_W ? PERF_W :
						   op == PA_SEND || op == PA_RECV ? PERF_XFER : PERF_OWN;
					if (cpu_op(op) || kind == PERF_XFER)
						o->work_kind[kind] += f.dur[s][k] * f.groups;
				}
			if (mc->run)
				run_stages(o, sh, mc->run);
			for (int s = 0; s < S && s < PERF_STAGES; s++) {
				o->stage_busy[s] = f.stage_busy[s];
				o->stage_end[s] = f.stage_end[s];
			}
			o->stages = S;
			o->microbatches = t.shape.microbatches;
			o->chunks = t.nchunks / S;
			o->mb_rows = sh->mb;
		}
	}
out:
	for (int s = 0; s < t.shape.stages; s++) {
		if (f.dur)
			free(f.dur[s]);
		if (f.match)
			free(f.match[s]);
	}
	free(f.dur);
	free(f.match);
	free(f.hop);
	free(run);
	for (int s = 0; each && s < t.shape.stages; s++)
		free(each[s]);
	free(each);
	pipe_table_free(&t);
	free(sh);
	return rc;
}
