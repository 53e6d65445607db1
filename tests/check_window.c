/* The FSDP weight window (host/model/window.h) on its own: two devices of
 * an fsdp=2 mesh in one process (a thread each, collectives through a
 * barrier), the window of the model each holds. A gathered group holds
 * the whole tensors (the one-device model's weights, element for
 * element); gathers go out one at a time in the order they were started
 * and the first wait lands them; a reduce-scatter adds every device's
 * gradient of a shard into its owner's storage; zeroing, counting,
 * poisoning and a failed collective behave as the header says. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/model/model.h"
#include "host/model/linear.h"
#include "host/model/model_int.h"
#include "host/model/window.h"

static char err[1024];

/* ---- two devices, collectives over fsdp through a barrier ---- */

struct pair {
	pthread_barrier_t bar;
	const void *part[2];
	int calls[2];          /* collectives started by each device */
	int fail_at;           /* the call that fails, on both (0: none) */
	char order[64];        /* 'g' gather, 's' scatter, in start order (device 0) */
};

struct dev {
	struct pair *p;
	int me;
	struct model *m;
	struct model_comm comm;
};

static int note(struct dev *d, char what)
{
	int n = (int)strlen(d->p->order);
	if (d->me == 0 && n < 63)
		d->p->order[n] = what;
	return ++d->p->calls[d->me] == d->p->fail_at ? -EPIPE : 0;
}

/* A wait for a started reduce-scatter: 'x' in the order (device 0),
 * when the test notes waits. */
static bool note_waits;

static void note_wait(struct dev *d)
{
	int n = (int)strlen(d->p->order);
	if (note_waits && d->me == 0 && n < 63)
		d->p->order[n] = 'x';
}

static int all_gather(void *ctx, uint32_t axes, void *out, const void *in, size_t bytes)
{
	struct dev *d = ctx;
	ck_assert_uint_eq(axes, 1u << AX_FSDP);
	int rc = note(d, 'g');
	d->p->part[d->me] = in;
	pthread_barrier_wait(&d->p->bar);
	for (int r = 0; r < 2; r++)
		memcpy((char *)out + (size_t)r * bytes, d->p->part[r], bytes);
	pthread_barrier_wait(&d->p->bar);
	return rc;
}

static int reduce_scatter(void *ctx, uint32_t axes, float *out, const float *in, size_t n)
{
	struct dev *d = ctx;
	ck_assert_uint_eq(axes, 1u << AX_FSDP);
	int rc = note(d, 's');
	d->p->part[d->me] = in;
	pthread_barrier_wait(&d->p->bar);
	const float *a = d->p->part[0], *b = d->p->part[1];
	for (size_t i = 0; i < n; i++)
		out[i] = a[(size_t)d->me * n + i] + b[(size_t)d->me * n + i];
	pthread_barrier_wait(&d->p->bar);
	return rc;
}

/* The list form, in place: each device's runs are the members' blocks
 * in rank order; a device copies block b from device b's list. */
struct runs {
	const struct model_run *run;
	int nrun;
	size_t count;
};

/* The float at position pos of a list's concatenation. */
static float *run_at(const struct runs *x, size_t pos)
{
	for (int i = 0; i < x->nrun; i++) {
		if (pos < x->run[i].n)
			return x->run[i].buf + pos;
		pos -= x->run[i].n;
	}
	ck_abort_msg("position past the runs");
	return NULL;
}

static struct runs lists[2];

/* The own block's moves the comm did (floats, each device), and of
 * them the gather's whose destination held NaN before (poisoned: the
 * window had not filled it itself). */
static size_t comm_moved[2], comm_filled_nan[2];

static void run_moves(struct dev *d, const struct model_move *own, int nown, bool add)
{
	for (int m = 0; m < nown; m++) {
		for (size_t e = 0; e < own[m].n; e++) {
			comm_filled_nan[d->me] += !add && isnan(own[m].dst[e]);
			own[m].dst[e] = add ? own[m].dst[e] + own[m].src[e] : own[m].src[e];
		}
		comm_moved[d->me] += own[m].n;
	}
}

static int start_all_gather_v(void *ctx, uint32_t axes, const struct model_run *run, int nrun,
			      const size_t *counts, const struct model_move *own, int nown, void **h)
{
	struct dev *d = ctx;
	ck_assert_uint_eq(axes, 1u << AX_FSDP);
	ck_assert_uint_eq(counts[0], counts[1]);
	int rc = note(d, 'v');
	/* the own block first, as the collective does before it sends */
	run_moves(d, own, nown, false);
	lists[d->me] = (struct runs){ run, nrun, counts[0] };
	pthread_barrier_wait(&d->p->bar);
	int o = 1 - d->me;  /* the other's block: from its list */
	for (size_t e = 0; e < counts[o]; e++)
		*run_at(&lists[d->me], (size_t)o * counts[0] + e) = *run_at(&lists[o], (size_t)o * counts[0] + e);
	pthread_barrier_wait(&d->p->bar);
	*h = d;
	return rc;
}

/* The list reduce-scatter, in place: started, it keeps a copy of the
 * runs; the wait sums (so whatever the window does with the gradient
 * window in between shows): each device's own block += the other's. Four
 * may be in flight (WIN_SCATTERS): the j-th a device starts is
 * [me][j mod 4], the same collective on both. */
#define FAKE_RS 4
static struct model_run *slist[2][FAKE_RS];
static struct model_move *smoves[2][FAKE_RS];
static int snmoves[2][FAKE_RS];
static struct runs slists[2][FAKE_RS];
static int stoken[2][FAKE_RS];
static int sstarted[2];

static int start_reduce_scatter_v(void *ctx, uint32_t axes, const struct model_run *run, int nrun,
				  const size_t *counts, const struct model_move *own, int nown, void **h)
{
	struct dev *d = ctx;
	ck_assert_uint_eq(axes, 1u << AX_FSDP);
	ck_assert_uint_eq(counts[0], counts[1]);
	int rc = note(d, 'w'), j = sstarted[d->me]++ % FAKE_RS;
	slist[d->me][j] = malloc(sizeof(*run) * (size_t)nrun);
	memcpy(slist[d->me][j], run, sizeof(*run) * (size_t)nrun);
	smoves[d->me][j] = malloc(sizeof(*own) * (size_t)(nown + 1));
	memcpy(smoves[d->me][j], own, sizeof(*own) * (size_t)nown);
	snmoves[d->me][j] = nown;
	slists[d->me][j] = (struct runs){ slist[d->me][j], nrun, counts[0] };
	*h = &stoken[d->me][j];
	return rc;
}

/* The packed reduce-scatter, started: the wait sums (out = own block
 * of both devices' in); each wait of a started reduce-scatter is 'x' in
 * the order. */
static struct { float *out; const float *in; size_t n; } pk_rs[2];
static int ptoken[2];

static int start_reduce_scatter(void *ctx, uint32_t axes, float *out, const float *in, size_t n, void **h)
{
	struct dev *d = ctx;
	ck_assert_uint_eq(axes, 1u << AX_FSDP);
	int rc = note(d, 'p');
	pk_rs[d->me].out = out;
	pk_rs[d->me].in = in;
	pk_rs[d->me].n = n;
	*h = &ptoken[d->me];
	return rc;
}

static int wait_h(void *ctx, void *h)
{
	struct dev *d = ctx;
	int j = 0;
	while (j + 1 < FAKE_RS && h != &stoken[d->me][j])
		j++;
	if (h == &ptoken[d->me] || h == &stoken[d->me][j])
		note_wait(d);
	if (h == &ptoken[d->me]) {
		size_t n = pk_rs[d->me].n;
		pthread_barrier_wait(&d->p->bar);
		for (size_t i = 0; i < n; i++)
			pk_rs[d->me].out[i] = pk_rs[0].in[(size_t)d->me * n + i] + pk_rs[1].in[(size_t)d->me * n + i];
		pthread_barrier_wait(&d->p->bar);
		return 0;
	}
	if (h != &stoken[d->me][j])
		return 0;
	struct runs *me = &slists[d->me][j], *o = &slists[1 - d->me][j];
	size_t c = me->count, b = (size_t)d->me * c;
	float *sum = malloc(sizeof(float) * (c + 1));
	pthread_barrier_wait(&d->p->bar);
	for (size_t e = 0; e < c; e++)
		sum[e] = *run_at(me, b + e) + *run_at(o, b + e);
	pthread_barrier_wait(&d->p->bar);
	for (size_t e = 0; e < c; e++)
		*run_at(me, b + e) = sum[e];
	/* then the own sums added out, as the collective does */
	run_moves(d, smoves[d->me][j], snmoves[d->me][j], true);
	free(smoves[d->me][j]);
	free(sum);
	free(slist[d->me][j]);
	return 0;
}

/* The test's config: 3 layers, fsdp=2 on one host. */
static void fsdp_cfg(struct cfg *c, int fsdp)
{
	const char *kv[] = { "vocab_size=32", "base_emb_dim=128", "base_num_query_heads=2", "base_num_kv_heads=2",
			     "base_mlp_dim=24", "max_target_length=4", "base_num_decoder_layers=3", NULL };
	cfg_defaults(c);
	for (const char *const *k = kv; *k; k++)
		ck_assert_msg(cfg_override(c, *k, err, sizeof(err)) == 0, "%s", err);
	if (fsdp > 1) {
		cfg_override(c, "ici_data_parallelism=1", err, sizeof(err));
		cfg_override(c, "ici_fsdp_parallelism=2", err, sizeof(err));
	}
	ck_assert_msg(cfg_finish(c, 1, fsdp, err, sizeof(err)) == 0, "%s", err);
}

static struct cfg cfg2;
static struct mesh mesh2;
static struct shard_rules rules2;
static struct pair pair;
static struct dev devs[2];
static struct model *whole;  /* one device: every tensor whole */

static void setup(void)
{
	struct model_dims d;
	fsdp_cfg(&cfg2, 2);
	ck_assert(model_dims_from_cfg(&d, &cfg2, err, sizeof(err)) == 0);
	ck_assert_msg(shard_rules_from_cfg(&rules2, &cfg2, err, sizeof(err)) == 0, "%s", err);
	mesh_init(&mesh2, &cfg2);
	memset(&pair, 0, sizeof(pair));
	memset(sstarted, 0, sizeof(sstarted));
	memset(comm_moved, 0, sizeof(comm_moved));
	memset(comm_filled_nan, 0, sizeof(comm_filled_nan));
	pthread_barrier_init(&pair.bar, NULL, 2);
	for (int i = 0; i < 2; i++) {
		struct model_mesh mm = { .mesh = &mesh2, .rules = &rules2, .device = i };
		devs[i] = (struct dev){ .p = &pair, .me = i };
		devs[i].m = model_new(&d, 2, &mm, err, sizeof(err));
		ck_assert_msg(devs[i].m, "%s", err);
		model_init(devs[i].m, 5, 0.5f);
		devs[i].comm = (struct model_comm){ .all_gather = all_gather, .reduce_scatter = reduce_scatter,
						    .ctx = &devs[i] };
	}
	whole = model_new(&d, 2, NULL, err, sizeof(err));
	model_init(whole, 5, 0.5f);
}

static void teardown(void)
{
	for (int i = 0; i < 2; i++)
		model_free(devs[i].m);
	model_free(whole);
	pthread_barrier_destroy(&pair.bar);
}

/* Runs fn on both devices at once. */
static void both(void *(*fn)(void *))
{
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, fn, &devs[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
}

/* Device me's gradient of element i: (me + 1) (i mod 7), so the sum
 * over the two devices is 3 (i mod 7) (check_sums). */
static void fill_grads(float *g, size_t n, int me)
{
	for (size_t i = 0; i < n; i++)
		g[i] = (float)(me + 1) * (float)(i % 7);
}

/* The index of parameter name in m. */
static const struct param_info *param(struct model *m, const char *name)
{
	const struct param_info *p = model_param_by_name(m, name);
	ck_assert_msg(p, "no %s", name);
	return p;
}

/* Parameter id in m, or NULL when m has none. */
static const struct param_info *param_id(const struct model *m, int id)
{
	return m->pidx[id] >= 0 ? &m->p[id] : NULL;
}

/* ---- gathers ---- */

static int rc_of[2];

/* both(fn) with every collective start and wait noted in pair.order;
 * each device's rc must be 0 */
static void both_noted(void *(*fn)(void *))
{
	note_waits = true;
	both(fn);
	note_waits = false;
	ck_assert_int_eq(rc_of[0] | rc_of[1], 0);
}

static size_t listed_copies[2];

static void *gather_layers(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	model_step_begin(d->m, &st);
	/* layer 1, then layer 2 and the non-layer group queued behind it:
	 * only the first goes out until it is waited for */
	win_gather_start(w, 1, 1, 2);
	win_gather_start(w, 2, 2, 3);
	win_gather_start(w, 0, WIN_NONLAYER, 0);
	ck_assert_int_eq(d->p->calls[d->me], 1);
	rc_of[d->me] = win_wait(w, 1);
	ck_assert_int_eq(d->p->calls[d->me], 2);  /* landing 1 sent 2 */
	win_release(w, 1);  /* one layer window (no pipeline): 2 lands in it */
	rc_of[d->me] |= win_wait(w, 2);
	ck_assert_int_eq(win_gathers(w), 2);
	if (d->me == 0) {
		/* every element of a gathered layer tensor equals the whole model's */
		const struct param_info *pw = param(whole, "wq");
		const float *want = model_params(whole) + pw->offset + pw->numel / 3 * 2;  /* layer 2 */
		const float *got = win_block(w, false, P_WQ, 2);
		for (size_t i = 0; i < pw->numel / 3; i++)
			ck_assert_msg(got[i] == want[i], "wq layer 2 element %zu: %g vs %g", i, got[i], want[i]);
	}
	win_release(w, 2);
	rc_of[d->me] |= win_wait(w, 0);
	win_release(w, 0);
	rc_of[d->me] |= model_step_end(d->m);
	return NULL;
}

START_TEST(test_gather_whole_in_order)
{
	ck_assert(param(devs[0].m, "wq")->split & (1u << AX_FSDP));  /* the shards are halves */
	both(gather_layers);
	ck_assert_int_eq(rc_of[0] | rc_of[1], 0);
	/* one all-gather a group (one gather axis set), in start order */
	ck_assert_str_eq(pair.order, "ggg");
}
END_TEST

/* The same gathers over the list form: every gathered layer tensor's
 * element equals the whole model's, and this device's shards only were
 * copied (column-split blocks too: a row a run), by the comm (the own
 * block's moves): the window, poisoned before, left them NaN. */
static void *gather_listed(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	d->comm.start_all_gather_v = start_all_gather_v;
	d->comm.wait = wait_h;
	win_poison(w);
	model_step_begin(d->m, &st);
	size_t c0 = win_copied(w);
	rc_of[d->me] = 0;
	int calls = d->p->calls[d->me];
	win_gather_start(w, 1, 1, 2);
	win_gather_start(w, 2, 2, 3);
	/* both went out before either is waited for: in place, into the
	 * two free weight windows (before, the second waited in the queue
	 * until the first was waited for) */
	ck_assert_int_eq(d->p->calls[d->me] - calls, 2);
	for (int l = 1; l < 3; l++) {
		/* layer 2's gather went out before layer 1 is READY: it lands
		 * in the window more */
		rc_of[d->me] |= win_wait(w, l);
		for (int id = 0; id < P_COUNT && d->me == 0; id++) {
			const struct param_info *pw = param_id(whole, id), *pd = param_id(d->m, id);
			if (!pw || !pd || !pw->stacked || !(pd->split & (1u << AX_FSDP)))
				continue;
			const float *want = model_params(whole) + pw->offset + pw->numel / 3 * (size_t)l;
			const float *got = win_block(w, false, id, l);
			for (size_t i = 0; i < pw->numel / 3; i++)
				ck_assert_msg(got[i] == want[i], "%s layer %d element %zu: %g vs %g",
					      pw->name, l, i, got[i], want[i]);
		}
		win_release(w, l);
	}
	listed_copies[d->me] = win_copied(w) - c0;
	rc_of[d->me] |= model_step_end(d->m);
	return NULL;
}

START_TEST(test_gather_listed_in_place)
{
	both(gather_listed);
	ck_assert_int_eq(rc_of[0] | rc_of[1], 0);
	ck_assert_str_eq(pair.order, "vv");
	/* two layers' own shards (half of each layer's gathered floats),
	 * copied into their blocks, the column-split tensors' too (the
	 * packed gather copies every tensor 3 x own) */
	size_t own = 0, cols = 0;
	for (int id = 0; id < P_COUNT; id++) {
		const struct param_info *p = param_id(devs[0].m, id), *pw = param_id(whole, id);
		if (!p || !p->stacked || !(p->split & (1u << AX_FSDP)))
			continue;
		own += p->numel / (size_t)p->shape[0] * 2;
		cols += p->shape[p->ndim - 1] != pw->shape[p->ndim - 1];
	}
	ck_assert_uint_gt(cols, 0);  /* some blocks are many short rows */
	ck_assert_uint_eq(listed_copies[0], own);
	/* the comm filled them (counted by the window when it started them) */
	for (int r = 0; r < 2; r++) {
		ck_assert_uint_eq(comm_moved[r], own);
		ck_assert_uint_eq(comm_filled_nan[r], own);
	}
}
END_TEST

/* ---- reduce-scatter ---- */

static bool scatter_listed;
static size_t scatter_copies[2];

/* Device d's step begun with the list (in-place) gathers and
 * reduce-scatters, its gradients zeroed. */
static void listed_step(struct dev *d, struct model_step *st)
{
	d->comm.start_all_gather_v = start_all_gather_v;
	d->comm.start_reduce_scatter_v = start_reduce_scatter_v;
	d->comm.wait = wait_h;
	memset(model_grads(d->m), 0, model_numel(d->m) * sizeof(float));
	model_step_begin(d->m, st);
}

static void *scatter_layer(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	if (scatter_listed) {
		d->comm.start_all_gather_v = start_all_gather_v;
		d->comm.start_reduce_scatter_v = start_reduce_scatter_v;
		d->comm.wait = wait_h;
	}
	memset(model_grads(d->m), 0, model_numel(d->m) * sizeof(float));
	model_step_begin(d->m, &st);
	win_gather_start(w, 1, 0, 1);
	rc_of[d->me] = win_wait(w, 1);
	win_zero_grads(w, 1);
	/* device r's gradient of every element of layer 0's wq: r + 1 */
	const struct param_info *pw = param(whole, "wq");
	float *g = win_block(w, true, P_WQ, 0);
	fill_grads(g, pw->numel / 3, d->me);
	size_t c0 = win_copied(w);
	rc_of[d->me] |= win_scatter_start(w, 1);
	/* the slot's gradients are free at once: written before the
	 * reduce-scatter in flight lands, they change nothing of it */
	win_zero_grads(w, 1);
	g = win_block(w, true, P_WQ, 0);
	for (size_t i = 0; i < pw->numel / 3; i++)
		g[i] = 1000.0f;
	rc_of[d->me] |= win_scatter_finish(w);
	scatter_copies[d->me] = win_copied(w) - c0;
	win_release(w, 1);
	rc_of[d->me] |= model_step_end(d->m);
	return NULL;
}

/* Both devices scatter layer 0's wq gradients (packed, or in place
 * with scatter_listed); the sums in the shards, the copies. */
static void scatter_check(void)
{
	both(scatter_layer);
	ck_assert_int_eq(rc_of[0] | rc_of[1], 0);
	/* each device's storage holds its half of layer 0's wq gradients,
	 * summed over both: 3 x (i mod 7) for whole-tensor element i */
	const struct param_info *pw = param(whole, "wq");
	int rows = pw->global_shape[1], cols = pw->global_shape[2];
	for (int r = 0; r < 2; r++) {
		const struct param_info *p = param(devs[r].m, "wq");
		const float *g = model_grads(devs[r].m) + p->offset;
		int lr = p->shape[1], lc = p->shape[2], r0 = p->goff[1], c0 = p->goff[2];
		ck_assert_int_eq(lr * lc * 2, rows * cols);
		for (int i = 0; i < lr; i++)
			for (int j = 0; j < lc; j++) {
				size_t whole_i = (size_t)(r0 + i) * cols + (size_t)(c0 + j);
				ck_assert_msg(g[(size_t)i * lc + j] == 3.0f * (float)(whole_i % 7),
					      "device %d element (%d, %d)", r, i, j);
			}
		/* layer 1's gradients were never scattered: still zero */
		for (size_t k = 0; k < (size_t)lr * lc; k++)
			ck_assert(g[(size_t)lr * lc + k] == 0);
	}
	if (!scatter_listed) {
		ck_assert_str_eq(pair.order, "gs");
		return;
	}
	/* in place over the gradient window's rows: the only copy is this
	 * device's block added into its shards (the packed one also packs
	 * every member's blocks: 3 x), by the comm (its moves, after the
	 * sum); the gather's own shards were the comm's too */
	ck_assert_str_eq(pair.order, "vw");
	size_t own = 0;
	for (int id = 0; id < P_COUNT; id++) {
		const struct param_info *p = param_id(devs[0].m, id);
		if (p && p->stacked && (p->split & (1u << AX_FSDP)) && p->opt != OPT_NONE)
			own += p->numel / (size_t)p->shape[0];
	}
	ck_assert_uint_eq(scatter_copies[0], own);
	size_t gathered = 0;
	for (int id = 0; id < P_COUNT; id++) {
		const struct param_info *p = param_id(devs[0].m, id);
		if (p && p->stacked && (p->split & (1u << AX_FSDP)))
			gathered += p->numel / (size_t)p->shape[0];
	}
	ck_assert_uint_eq(comm_moved[0], gathered + own);
}

START_TEST(test_scatter_sums_into_shards)
{
	scatter_listed = false;
	scatter_check();
}
END_TEST

START_TEST(test_scatter_listed_in_place)
{
	scatter_listed = true;
	scatter_check();
}
END_TEST

/* The step's last two reduce-scatters, layer 0's (in place) and the
 * non-layer group's (packed, started): the second goes out beside the
 * first, before anything waits for it, and one finish lands both. */
static void *scatter_beside(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	d->comm.start_reduce_scatter = start_reduce_scatter;
	listed_step(d, &st);
	win_gather_start(w, 0, WIN_NONLAYER, 0);
	win_gather_start(w, 1, 0, 1);
	rc_of[d->me] = win_wait(w, 0) | win_wait(w, 1);
	win_zero_grads(w, 0);
	win_zero_grads(w, 1);
	/* device r's gradient of element i of layer 0's wq and of the
	 * embedding: (r + 1) (i mod 7) */
	const struct param_info *pw = param(whole, "wq"), *pe = param(whole, "embed");
	float *g = win_block(w, true, P_WQ, 0), *ge = win_block(w, true, P_EMBED, 0);
	fill_grads(g, pw->numel / 3, d->me);
	fill_grads(ge, pe->numel, d->me);
	rc_of[d->me] |= win_scatter_start(w, 1);
	ck_assert(win_scatter_beside(w, 0));
	ck_assert(!win_scatter_beside(w, 1));
	rc_of[d->me] |= win_scatter_start(w, 0);
	ck_assert(!win_scatter_beside(w, 0));  /* one beside at most */
	rc_of[d->me] |= win_scatter_finish(w);
	win_release(w, 0);
	win_release(w, 1);
	rc_of[d->me] |= model_step_end(d->m);
	return NULL;
}

/* The sums of tensor name's gradients on device r: its block of the
 * whole tensor (last two dimensions), 3 x (i mod 7) for element i of
 * (the first layer of) the whole tensor. */
static void check_sums(const char *name, int r)
{
	const struct param_info *pw = param(whole, name), *p = param(devs[r].m, name);
	int k = p->ndim - 2, cols = pw->global_shape[k + 1];
	int lr = p->shape[k], lc = p->shape[k + 1], r0 = p->goff[k], c0 = p->goff[k + 1];
	const float *g = model_grads(devs[r].m) + p->offset;
	for (int i = 0; i < lr; i++)
		for (int j = 0; j < lc; j++) {
			size_t whole_i = (size_t)(r0 + i) * cols + (size_t)(c0 + j);
			ck_assert_msg(g[(size_t)i * lc + j] == 3.0f * (float)(whole_i % 7), "device %d %s (%d, %d)",
				      r, name, i, j);
		}
}

START_TEST(test_scatter_nonlayer_beside)
{
	both_noted(scatter_beside);
	/* the non-layer reduce-scatter ('p') right after layer 0's ('w'),
	 * no wait ('x') between them: two waits after both */
	ck_assert_msg(strstr(pair.order, "wpxx") != NULL, "order %s", pair.order);
	for (int r = 0; r < 2; r++) {
		check_sums("wq", r);
		check_sums("embed", r);
	}
}
END_TEST

/* ---- two parts a layer (fsdp_layer_parts) ---- */

/* Layer 0 in two parts: part A's gather waited for alone, then part
 * B's; part B's gradients reduce-scattered first (the slot keeps its
 * gradient window, whose part A rows are written after), part A's at
 * the slot's win_scatter_start. */
static void *parts_layer(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	const struct param_info *pq = param(whole, "wq"), *pg = param(whole, "w_gate");
	listed_step(d, &st);
	rc_of[d->me] = model_set_parts(d->m, true, NULL, NULL);
	win_gather_start(w, 1, 0, 1);
	rc_of[d->me] |= win_wait_first(w, 1);
	/* part A's weights are whole */
	ck_assert(!memcmp(win_block(w, false, P_WQ, 0), model_params(whole) + pq->offset,
			  pq->numel / 3 * sizeof(float)));
	rc_of[d->me] |= win_wait(w, 1);
	ck_assert(!memcmp(win_block(w, false, P_W_GATE, 0), model_params(whole) + pg->offset,
			  pg->numel / 3 * sizeof(float)));
	win_zero_grads(w, 1);
	float *g = win_block(w, true, P_W_GATE, 0);
	fill_grads(g, pg->numel / 3, d->me);
	rc_of[d->me] |= win_scatter_first(w, 1);
	g = win_block(w, true, P_WQ, 0);
	fill_grads(g, pq->numel / 3, d->me);
	rc_of[d->me] |= win_scatter_start(w, 1);
	rc_of[d->me] |= win_scatter_finish(w);
	win_release(w, 1);
	rc_of[d->me] |= model_step_end(d->m);
	return NULL;
}

START_TEST(test_parts)
{
	both_noted(parts_layer);
	/* two gathers (A, B), part B's reduce-scatter, part A's beside it
	 * (win_scatter_follows: the slot's parts alone in flight), both
	 * waits */
	ck_assert_str_eq(pair.order, "vvwwxx");
	for (int r = 0; r < 2; r++) {
		check_sums("wq", r);
		check_sums("w_gate", r);
	}
}
END_TEST

/* Layer 0 in five parts (win_set_parts' part0: wq, wk, wv, wo, the
 * feed-forward block), layer 1 in two: layer 0's gather goes as five
 * collectives, wq's waited for alone and wk's by win_block when asked
 * for; its reduce-scatter as three: the feed-forward block's, then wo's,
 * wq's and wk's as one (win_scatter_parts, the slot keeping its
 * gradient window while wv's rows are written), then wv's at the slot's
 * win_scatter_start; layer 1's gather as two. */
static void *parts5_layer(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	const char *att[] = { "wq", "wk", "wo" };
	const int attid[] = { P_WQ, P_WK, P_WO };
	signed char part[P_COUNT], part0[P_COUNT];
	for (int i = 0; i < P_COUNT; i++)
		part[i] = part0[i] = i >= P_MLP_NORM && i < P_FINAL_NORM ? 4 : 0;
	part0[P_WK] = 1;
	part0[P_WV] = 2;
	part0[P_WO] = 3;
	listed_step(d, &st);
	rc_of[d->me] = win_set_parts(w, part, part0);
	win_gather_start(w, 1, 0, 1);
	rc_of[d->me] |= win_wait_first(w, 1);
	const struct param_info *pk = param(whole, "wk"), *pv = param(whole, "wv"), *pg = param(whole, "w_gate");
	/* wk's part, waited for by win_block */
	ck_assert(!memcmp(win_block(w, false, P_WK, 0), model_params(whole) + pk->offset,
			  pk->numel / 3 * sizeof(float)));
	rc_of[d->me] |= win_wait(w, 1);
	ck_assert(!memcmp(win_block(w, false, P_W_GATE, 0), model_params(whole) + pg->offset,
			  pg->numel / 3 * sizeof(float)));
	win_zero_grads(w, 1);
	fill_grads(win_block(w, true, P_W_GATE, 0), pg->numel / 3, d->me);
	rc_of[d->me] |= win_scatter_parts(w, 1, 1u << 4);
	for (int j = 0; j < 3; j++)
		fill_grads(win_block(w, true, attid[j], 0), param(whole, att[j])->numel / 3, d->me);
	rc_of[d->me] |= win_scatter_parts(w, 1, 1u << 0 | 1u << 1 | 1u << 3);
	fill_grads(win_block(w, true, P_WV, 0), pv->numel / 3, d->me);
	rc_of[d->me] |= win_scatter_start(w, 1);
	rc_of[d->me] |= win_scatter_finish(w);
	win_release(w, 1);
	win_gather_start(w, 1, 1, 2);
	rc_of[d->me] |= win_wait(w, 1);
	win_release(w, 1);
	/* layer 0 again in the step (a backward's): whole, one gather */
	win_gather_start(w, 1, 0, 1);
	rc_of[d->me] |= win_wait(w, 1);
	ck_assert(!memcmp(win_block(w, false, P_WK, 0), model_params(whole) + pk->offset,
			  pk->numel / 3 * sizeof(float)));
	ck_assert(!memcmp(win_block(w, false, P_W_GATE, 0), model_params(whole) + pg->offset,
			  pg->numel / 3 * sizeof(float)));
	win_release(w, 1);
	rc_of[d->me] |= model_step_end(d->m);
	win_set_parts(w, NULL, NULL);
	return NULL;
}

/* Layer 1's feed-forward part goes out beside layer 0's reduce-scatter
 * in flight (win_scatter_parts does not wait for another layer's); its
 * rest waits for both (another group's is in flight), then goes. */
static void *parts_beside(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	const struct param_info *pq = param(whole, "wq"), *pg = param(whole, "w_gate");
	listed_step(d, &st);
	rc_of[d->me] = model_set_parts(d->m, true, NULL, NULL);
	for (int l = 0; l < 2; l++) {
		win_gather_start(w, 1, l, l + 1);
		rc_of[d->me] |= win_wait(w, 1);
		win_zero_grads(w, 1);
		fill_grads(win_block(w, true, P_W_GATE, l), pg->numel / 3, d->me);
		if (l)
			rc_of[d->me] |= win_scatter_first(w, 1);
		fill_grads(win_block(w, true, P_WQ, l), pq->numel / 3, d->me);
		rc_of[d->me] |= win_scatter_start(w, 1);
		win_release(w, 1);
	}
	rc_of[d->me] |= win_scatter_finish(w);
	rc_of[d->me] |= model_step_end(d->m);
	return NULL;
}

START_TEST(test_parts_beside)
{
	both_noted(parts_beside);
	/* layer 0: two gathers, its reduce-scatter; layer 1: two gathers,
	 * its feed-forward part beside layer 0's in flight (no wait before
	 * it), then both waited for before its rest */
	ck_assert_str_eq(pair.order, "vvwvvwxxwx");
	for (int r = 0; r < 2; r++) {
		check_sums("wq", r);
		check_sums("w_gate", r);
	}
}
END_TEST

START_TEST(test_parts_layer0)
{
	both_noted(parts5_layer);
	/* the attention's parts go out beside the feed-forward's in flight
	 * (two reduce-scatters), wv's beside both (three), all waited for
	 * at the finish; layer 1 in two parts, then layer 0's second gather
	 * whole */
	ck_assert_str_eq(pair.order, "vvvvvwwwxxxvvv");
	for (int r = 0; r < 2; r++) {
		check_sums("wq", r);
		check_sums("wk", r);
		check_sums("wv", r);
		check_sums("wo", r);
		check_sums("w_gate", r);
	}
}
END_TEST

/* ---- errors ---- */

static void *fail_second(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	model_step_begin(d->m, &st);
	win_gather_start(w, 1, 0, 1);
	win_gather_start(w, 2, 1, 2);
	win_wait(w, 1);
	win_release(w, 1);
	rc_of[d->me] = win_wait(w, 2);  /* the second gather failed */
	win_release(w, 2);
	/* no collective starts once the step failed: states still move */
	win_gather_start(w, 1, 2, 3);
	win_wait(w, 1);
	win_release(w, 1);
	model_step_end(d->m);
	return NULL;
}

START_TEST(test_failure_stops_collectives)
{
	pair.fail_at = 2;
	both(fail_second);
	ck_assert_int_eq(rc_of[0], -EPIPE);
	ck_assert_int_eq(rc_of[1], -EPIPE);
	ck_assert_str_eq(pair.order, "gg");  /* the third gather never went out on device 0 */
}
END_TEST

/* ---- zeroing, poisoning ---- */

static void *poison_zero(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	win_poison(w);
	model_step_begin(d->m, &st);
	win_gather_start(w, 1, 0, 1);
	win_wait(w, 1);
	const struct param_info *pw = param(whole, "wq");
	const float *wt = win_block(w, false, P_WQ, 0), *g = win_block(w, true, P_WQ, 0);
	/* the gather overwrote the poisoned weights, not the gradients */
	for (size_t i = 0; i < pw->numel / 3; i++) {
		ck_assert(!isnan(wt[i]));
		ck_assert(isnan(g[i]));
	}
	win_zero_grads(w, 1);
	/* zeroed when asked for (its zeroing is deferred: test_deferred_zero) */
	ck_assert(win_block(w, true, P_WQ, 0) == g);
	for (size_t i = 0; i < pw->numel / 3; i++)
		ck_assert(g[i] == 0);
	win_release(w, 1);
	rc_of[d->me] = model_step_end(d->m);
	return NULL;
}

START_TEST(test_poison_and_zero)
{
	both(poison_zero);
	ck_assert_int_eq(rc_of[0] | rc_of[1], 0);
}
END_TEST

/* Deferred zeroing: win_zero_grads marks a layer's blocks; the first
 * write that covers one writes it (poison and all), a reader or a partial
 * writer gets it zeroed, and the reduce-scatter zeroes what nobody
 * touched before it sends. */
static size_t defer_zeroed[2];

static void *defer_zero(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	win_poison(w);
	listed_step(d, &st);
	win_gather_start(w, 1, 0, 1);
	rc_of[d->me] = win_wait(w, 1);
	size_t nq = param(whole, "wq")->numel / 3, nk = param(whole, "wk")->numel / 3, z0 = win_zeroed(w);
	float *gq = win_block(w, true, P_WQ, 0), *gk = win_block(w, true, P_WK, 0);
	float *gv = win_block(w, true, P_WV, 0);
	win_zero_grads(w, 1);
	ck_assert_uint_eq(win_zeroed(w), z0);  /* nothing zeroed yet */
	ck_assert(isnan(gq[0]) && isnan(gk[0]) && isnan(gv[nk - 1]));
	/* wq: its first write covers it: written, not zeroed; once */
	ck_assert(win_grad_write(w, P_WQ, 0, nq));
	ck_assert(!win_grad_write(w, P_WQ, 0, nq));
	fill_grads(gq, nq, d->me);
	/* wk: a write of part of it: zeroed first, added to */
	ck_assert(!win_grad_write(w, P_WK, 0, nk - 1));
	for (size_t i = 0; i < nk; i++)
		ck_assert(gk[i] == 0);
	ck_assert_uint_eq(win_zeroed(w), z0 + nk);
	/* wv: read: zeroed */
	ck_assert(win_block(w, true, P_WV, 0) == gv && gv[nk - 1] == 0);
	/* the rest (wo, the feed-forward's) untouched: the reduce-scatter
	 * zeroes them before it sends */
	rc_of[d->me] |= win_scatter_start(w, 1);
	rc_of[d->me] |= win_scatter_finish(w);
	defer_zeroed[d->me] = win_zeroed(w) - z0;
	win_release(w, 1);
	rc_of[d->me] |= model_step_end(d->m);
	return NULL;
}

/* The model's weight gradient (wgrad.c) on a deferred block: its first
 * write writes the product over the poison without zeroing, bit for bit
 * what adding it into a zeroed block gives; the second adds. */
static void *first_write(void *arg)
{
	struct dev *d = arg;
	struct model_step st = { .comm = &d->comm };
	struct win *w = model_window(d->m);
	int N = 5, C = d->m->l.C, OC = d->m->l.Hq * d->m->l.D;
	size_t nq = (size_t)C * OC;
	float *dout = malloc(sizeof(float) * (size_t)N * OC), *inp = malloc(sizeof(float) * (size_t)N * C);
	float *ref = calloc(nq, sizeof(float));
	for (int i = 0; i < N * OC; i++)
		dout[i] = (float)((i * 37 + d->me) % 19) / 7.0f - 1.0f;
	for (int i = 0; i < N * C; i++)
		inp[i] = (float)((i * 11) % 23) / 5.0f - 2.0f;
	linear_backward(NULL, ref, dout, inp, NULL, N, C, OC);
	win_poison(w);
	listed_step(d, &st);
	win_gather_start(w, 1, 0, 1);
	rc_of[d->me] = win_wait(w, 1);
	ck_assert_uint_eq(nq, param(whole, "wq")->numel / 3);
	win_zero_grads(w, 1);
	size_t z0 = win_zeroed(w);
	wg_linear(d->m, P_WQ, 0, 0, dout, inp, N, C, OC);
	ck_assert_uint_eq(win_zeroed(w), z0);
	const float *g = win_block(w, true, P_WQ, 0);
	ck_assert(!memcmp(g, ref, nq * sizeof(float)));
	wg_linear(d->m, P_WQ, 0, 0, dout, inp, N, C, OC);
	for (size_t i = 0; i < nq; i++)
		ck_assert(g[i] == ref[i] + ref[i]);
	rc_of[d->me] |= win_scatter_start(w, 1);
	rc_of[d->me] |= win_scatter_finish(w);
	win_release(w, 1);
	rc_of[d->me] |= model_step_end(d->m);
	free(dout);
	free(inp);
	free(ref);
	return NULL;
}

START_TEST(test_first_write_model)
{
	both(first_write);
	ck_assert_int_eq(rc_of[0] | rc_of[1], 0);
}
END_TEST

START_TEST(test_deferred_zero)
{
	both(defer_zero);
	ck_assert_int_eq(rc_of[0] | rc_of[1], 0);
	/* every layer 0 gradient block but wq's zeroed, once */
	size_t all = 0, nq = param(whole, "wq")->numel / 3;
	for (int id = 0; id < P_COUNT; id++) {
		const struct param_info *p = param_id(whole, id);
		if (p && p->stacked && p->opt != OPT_NONE && devs[0].m->pp[id].gather)
			all += p->numel / (size_t)p->shape[0];
	}
	ck_assert_uint_eq(defer_zeroed[0], all - nq);
	for (int r = 0; r < 2; r++) {
		const float *g = model_grads(devs[r].m);
		/* the sums: 3 x (i mod 7) in wq's shards, 0 elsewhere (not NaN) */
		const struct param_info *pw = param(whole, "wq"), *p = param(devs[r].m, "wq");
		int cols = pw->global_shape[2], lc = p->shape[2];
		for (int i = 0; i < p->shape[1]; i++)
			for (int j = 0; j < lc; j++) {
				size_t wi = (size_t)(p->goff[1] + i) * cols + (size_t)(p->goff[2] + j);
				ck_assert(g[p->offset + (size_t)i * lc + j] == 3.0f * (float)(wi % 7));
			}
		for (int id = 0; id < P_COUNT; id++) {
			const struct param_info *q = param_id(devs[r].m, id);
			if (!q || !q->stacked || id == P_WQ)
				continue;
			for (size_t k = 0; k < q->numel / (size_t)q->shape[0]; k++)
				ck_assert_msg(g[q->offset + k] == 0, "device %d %s element %zu", r, q->name, k);
		}
	}
}
END_TEST

/* The window's size: a gathered group is the whole layer (twice: weights
 * and gradients), the packed buffers a gather's and a scatter's. */
START_TEST(test_sizes)
{
	const struct param_info *p = param(devs[0].m, "wq");
	ck_assert_uint_gt(model_window_numel(devs[0].m), 2 * (p->numel / 3) * 2);
	ck_assert_int_eq(win_slots(model_window(devs[0].m)), 3);  /* one window: non-layer, two layer slots */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("window");
	TCase *tc = tcase_create("window");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_gather_whole_in_order);
	tcase_add_test(tc, test_gather_listed_in_place);
	tcase_add_test(tc, test_scatter_sums_into_shards);
	tcase_add_test(tc, test_scatter_listed_in_place);
	tcase_add_test(tc, test_scatter_nonlayer_beside);
	tcase_add_test(tc, test_parts);
	tcase_add_test(tc, test_parts_layer0);
	tcase_add_test(tc, test_parts_beside);
	tcase_add_test(tc, test_failure_stops_collectives);
	tcase_add_test(tc, test_poison_and_zero);
	tcase_add_test(tc, test_deferred_zero);
	tcase_add_test(tc, test_first_write_model);
	tcase_add_test(tc, test_sizes);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
