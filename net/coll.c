/* Collectives: the per-device state (sequence numbers, scratch, the
 * communication thread that runs async collectives in issue order),
 * argument checks, and the dispatch to the algorithms in coll_ring.c and
 * coll_a2a.c (which post and wait with the helpers of coll_step.c). */
#include "net/coll.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/coll_int.h"
#include "proto/meshrun.pb-c.h"

#define OP(x) MESHRUN__COLL_OP__COLL_##x

struct seq_entry {
	uint32_t id;
	uint64_t next;
};

struct coll_handle {
	struct coll_dev *d;
	struct coll_args a;
	int *devs;                /* owned copies of the caller's arrays */
	size_t *sizes;
	struct coll_iov *iov;
	struct coll_move *own;
	struct coll_handle *next;
	int rc;
	bool done, abandoned;
	uint64_t t_run, t_done;   /* when the communication thread ran it */
	char err[512];
};

struct coll_dev {
	struct xport *x;
	int me;
	size_t seg;
	uint64_t timeout_ns;
	uint64_t step;
	size_t direct_max;
	bool two_level;
	struct seq_entry *seqs;   /* touched by the device thread only */
	int nseqs, capseqs;
	struct coll_scratch scr_caller, scr_comm;

	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* the communication thread: queue non-empty, stop */
	pthread_cond_t cv_done;   /* coll_wait: a handle done */
	bool waiting;             /* a thread sleeps in coll_wait */
	struct coll_handle *head, *tail;
	bool stop;
};

/* ---- dispatch ---- */

static int dispatch(struct coll_run *R);

/* The own block's moves (coll_move): a list all-gather's ring fills
 * them a segment ahead of its sends (coll_ring.c), the two-level one
 * here first; a reduce-scatter's sums are added out after it. */
int coll_exec(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	bool gather = a->op == OP(ALL_GATHER);
	if (a->nown && gather && coll_hier_applies(R))
		coll_moves_run(a->own, a->nown, false);
	int rc = dispatch(R);
	if (a->nown && !gather && !rc)
		coll_moves_run(a->own, a->nown, true);
	return rc;
}

static int dispatch(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	if (coll_hier_applies(R))
		return coll_hier_exec(R);
	switch (a->op) {
	case OP(ALL_GATHER): return a->runs ? coll_ring_all_gather_v(R) : coll_ring_all_gather(R);
	case OP(REDUCE_SCATTER):
		return a->runs ? coll_ring_reduce_scatter_v(R) : coll_ring_reduce_scatter(R);
	case OP(ALL_REDUCE): return a->runs ? coll_ring_all_reduce_v(R) : coll_ring_all_reduce(R);
	case OP(ALL_TO_ALL): return coll_pair_all_to_all(R);
	case OP(PERMUTE): return coll_pair_permute(R);
	case OP(BROADCAST): return coll_chain_broadcast(R);
	case OP(BARRIER): return coll_dissemination_barrier(R);
	}
	snprintf(R->err, R->errlen, "unknown collective op %u", a->op);
	return -EINVAL;
}

/* ---- device ---- */

static void *comm_main(void *arg);

struct coll_dev *coll_dev_new(struct xport *x, int device_id, size_t segment_bytes,
			      double timeout_s)
{
	struct coll_dev *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->x = x;
	d->me = device_id;
	d->seg = segment_bytes & ~(size_t)3;
	if (d->seg < 4)
		d->seg = 4;
	d->timeout_ns = timeout_s > 0 ? (uint64_t)(timeout_s * 1e9) : 600000000000ull;
	d->direct_max = COLL_DIRECT_MAX_DEFAULT;
	pthread_mutex_init(&d->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cv, &ca);
	pthread_cond_init(&d->cv_done, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&d->thread, NULL, comm_main, d)) {
		pthread_cond_destroy(&d->cv);
		pthread_cond_destroy(&d->cv_done);
		pthread_mutex_destroy(&d->mu);
		free(d);
		return NULL;
	}
	return d;
}

void coll_dev_free(struct coll_dev *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->mu);
	d->stop = true;
	pthread_mutex_unlock(&d->mu);
	pthread_cond_signal(&d->cv);
	pthread_join(d->thread, NULL);
	pthread_cond_destroy(&d->cv);
	pthread_cond_destroy(&d->cv_done);
	pthread_mutex_destroy(&d->mu);
	free(d->scr_caller.p);
	free(d->scr_comm.p);
	free(d->seqs);
	free(d);
}

void coll_set_step(struct coll_dev *d, uint64_t step)
{
	d->step = step;
}

void coll_set_direct_max(struct coll_dev *d, size_t bytes)
{
	d->direct_max = bytes;
}

void coll_set_two_level(struct coll_dev *d, bool on)
{
	d->two_level = on;
}

/* Next sequence number of group id on this device; -1 on no memory. */
static int take_seq(struct coll_dev *d, uint32_t id, uint64_t *seq)
{
	for (int i = 0; i < d->nseqs; i++) {
		if (d->seqs[i].id == id) {
			*seq = d->seqs[i].next++;
			return 0;
		}
	}
	if (d->nseqs == d->capseqs) {
		int cap = d->capseqs ? 2 * d->capseqs : 16;
		struct seq_entry *s = realloc(d->seqs, sizeof(*s) * (size_t)cap);
		if (!s)
			return -1;
		d->seqs = s;
		d->capseqs = cap;
	}
	d->seqs[d->nseqs].id = id;
	d->seqs[d->nseqs].next = 1;
	d->nseqs++;
	*seq = 0;
	return 0;
}

static bool mul_ok(size_t a, size_t b, size_t *out)
{
	if (b && a > SIZE_MAX / b)
		return false;
	*out = a * b;
	return true;
}

/* The coll_*_v forms: the runs, and the blocks' counts adding up to them. */
static int check_runs(const struct coll_group *g, struct coll_args *a, char *err, size_t errlen)
{
	const char *name = coll_op_name(a->op);
	size_t total = 0, blocks = 0;
	if (a->niov < 0 || (a->niov && !a->iov))
		goto bad_buf;
	for (int i = 0; i < a->niov; i++) {
		if ((a->iov[i].count && !a->iov[i].buf) || a->iov[i].count > SIZE_MAX / sizeof(float) - total)
			goto bad_buf;
		total += a->iov[i].count;
	}
	a->count = total;
	if (a->nown < 0 || (a->nown && (!a->own || a->op == OP(ALL_REDUCE))))
		goto bad_buf;
	size_t moved = 0;
	for (int i = 0; i < a->nown; i++) {
		if (a->own[i].count && (!a->own[i].dst || !a->own[i].src))
			goto bad_buf;
		moved += a->own[i].count;
	}
	if (a->op == OP(ALL_REDUCE))
		return 0;
	if (!a->counts)
		goto bad_buf;
	if (a->nown && a->op == OP(ALL_GATHER) && moved != a->counts[g->rank]) {
		snprintf(err, errlen, "%s (group %u): the moves fill %zu floats of the own block's %zu",
			 name, g->id, moved, a->counts[g->rank]);
		return -EINVAL;
	}
	for (int b = 0; b < g->n && blocks <= total; b++)
		blocks = a->counts[b] > total - blocks ? total + 1 : blocks + a->counts[b];
	if (blocks != total) {
		snprintf(err, errlen, "%s (group %u): the blocks' counts do not add up to the runs' %zu floats",
			 name, g->id, total);
		return -EINVAL;
	}
	return 0;

bad_buf:
	snprintf(err, errlen, "%s (group %u): invalid run or size", name, g->id);
	return -EINVAL;
}

/* Checks everything that can be checked locally; fills a's group fields. */
static int check_args(struct coll_dev *d, const struct coll_group *g, struct coll_args *a,
		      char *err, size_t errlen)
{
	const char *name = coll_op_name(a->op);
	size_t total;

	if (!d || !g || !g->devs || g->n < 1 || g->rank < 0 || g->rank >= g->n) {
		snprintf(err, errlen, "%s: invalid group", name);
		return -EINVAL;
	}
	if (g->id >= 65536) {
		snprintf(err, errlen, "%s: group id %u too large (max 65535)", name, g->id);
		return -EINVAL;
	}
	if (g->devs[g->rank] != d->me) {
		snprintf(err, errlen, "%s (group %u): rank %d is device %d, not the caller %d",
			 name, g->id, g->rank, g->devs[g->rank], d->me);
		return -EINVAL;
	}
	for (int i = 0; i < g->n; i++) {
		if (g->devs[i] < 0 || g->devs[i] >= xport_num_devices(d->x)) {
			snprintf(err, errlen, "%s (group %u): member %d is device %d, out of range",
				 name, g->id, i, g->devs[i]);
			return -EINVAL;
		}
	}
	a->group = g->id;
	a->n = g->n;
	a->rank = g->rank;
	a->devs = g->devs;
	a->step = d->step;
	a->seg = d->seg;
	a->direct_max = d->direct_max;
	a->two_level = d->two_level;
	if (a->runs)
		return check_runs(g, a, err, errlen);

	switch (a->op) {
	case OP(ALL_GATHER):
		if (!mul_ok(a->bytes, (size_t)g->n, &total) ||
		    (total && (!a->out || !a->in)))
			goto bad_buf;
		break;
	case OP(REDUCE_SCATTER):
		if (!mul_ok(a->count, (size_t)g->n * sizeof(float), &total) ||
		    (total && (!a->out || !a->in)))
			goto bad_buf;
		break;
	case OP(ALL_REDUCE):
		if (!mul_ok(a->count, sizeof(float), &total) || (total && !a->out))
			goto bad_buf;
		break;
	case OP(PERMUTE):
		if (a->bytes && (!a->out || !a->in))
			goto bad_buf;
		break;
	case OP(BROADCAST):
		if (a->root < 0 || a->root >= g->n) {
			snprintf(err, errlen, "%s (group %u): root %d out of range", name, g->id, a->root);
			return -EINVAL;
		}
		if (a->bytes && !a->out)
			goto bad_buf;
		break;
	case OP(ALL_TO_ALL): {
		if (!a->send_bytes || !a->recv_bytes)
			goto bad_buf;
		size_t st = 0, rt = 0;
		for (int i = 0; i < g->n; i++) {
			if (st + a->send_bytes[i] < st || rt + a->recv_bytes[i] < rt)
				goto bad_buf;
			st += a->send_bytes[i];
			rt += a->recv_bytes[i];
		}
		if ((st && !a->in) || (rt && !a->out))
			goto bad_buf;
		if (a->send_bytes[g->rank] != a->recv_bytes[g->rank]) {
			snprintf(err, errlen, "%s (group %u): sends %zu bytes to itself but expects %zu",
				 name, g->id, a->send_bytes[g->rank], a->recv_bytes[g->rank]);
			return -EINVAL;
		}
		break;
	}
	case OP(BARRIER):
		break;
	default:
		snprintf(err, errlen, "unknown collective op %u", a->op);
		return -EINVAL;
	}
	return 0;

bad_buf:
	snprintf(err, errlen, "%s (group %u): invalid buffer or size", name, g->id);
	return -EINVAL;
}

static int run_sync(struct coll_dev *d, const struct coll_group *g, struct coll_args *a,
		    char *err, size_t errlen)
{
	int rc = check_args(d, g, a, err, errlen);
	if (rc)
		return rc;
	if (take_seq(d, g->id, &a->seq)) {
		snprintf(err, errlen, "%s: out of memory", coll_op_name(a->op));
		return -ENOMEM;
	}
	struct coll_run R = {
		.x = d->x, .me = d->me, .a = a,
		.deadline = xport_now_ns() + d->timeout_ns,
		.scr = &d->scr_caller, .err = err, .errlen = errlen,
	};
	return coll_exec(&R);
}

static struct coll_handle *run_async(struct coll_dev *d, const struct coll_group *g,
				     struct coll_args *a, char *err, size_t errlen)
{
	if (check_args(d, g, a, err, errlen))
		return NULL;
	struct coll_handle *h = calloc(1, sizeof(*h));
	int n = g->n;
	if (!h)
		goto out_nomem;
	h->devs = malloc(sizeof(int) * (size_t)n);
	if (!h->devs)
		goto out_free_h;
	memcpy(h->devs, g->devs, sizeof(int) * (size_t)n);
	if (a->op == OP(ALL_TO_ALL)) {
		h->sizes = malloc(sizeof(size_t) * 2 * (size_t)n);
		if (!h->sizes)
			goto out_free_devs;
		memcpy(h->sizes, a->send_bytes, sizeof(size_t) * (size_t)n);
		memcpy(h->sizes + n, a->recv_bytes, sizeof(size_t) * (size_t)n);
		a->send_bytes = h->sizes;
		a->recv_bytes = h->sizes + n;
	}
	if (a->runs) {
		size_t nc = a->counts ? (size_t)n : 0;
		h->iov = malloc(sizeof(struct coll_iov) * (size_t)a->niov + sizeof(size_t) * nc + 1);
		if (!h->iov)
			goto out_free_sizes;
		if (a->niov)
			memcpy(h->iov, a->iov, sizeof(struct coll_iov) * (size_t)a->niov);
		if (nc)
			a->counts = memcpy(h->iov + a->niov, a->counts, sizeof(size_t) * nc);
		a->iov = h->iov;
	}
	if (a->nown) {
		h->own = malloc(sizeof(struct coll_move) * (size_t)a->nown);
		if (!h->own)
			goto out_free_iov;
		a->own = memcpy(h->own, a->own, sizeof(struct coll_move) * (size_t)a->nown);
	}
	if (take_seq(d, g->id, &a->seq))
		goto out_free_own;
	a->devs = h->devs;
	h->a = *a;
	h->d = d;
	pthread_mutex_lock(&d->mu);
	bool idle = !d->head;
	if (d->tail)
		d->tail->next = h;
	else
		d->head = h;
	d->tail = h;
	pthread_mutex_unlock(&d->mu);
	/* the communication thread sleeps only on an empty queue */
	if (idle)
		pthread_cond_signal(&d->cv);
	return h;

out_free_own:
	free(h->own);
out_free_iov:
	free(h->iov);
out_free_sizes:
	free(h->sizes);
out_free_devs:
	free(h->devs);
out_free_h:
	free(h);
out_nomem:
	snprintf(err, errlen, "%s: out of memory", coll_op_name(a->op));
	return NULL;
}

static void handle_free(struct coll_handle *h)
{
	free(h->devs);
	free(h->sizes);
	free(h->iov);
	free(h->own);
	free(h);
}

static void *comm_main(void *arg)
{
	struct coll_dev *d = arg;
	char name[16];
	snprintf(name, sizeof(name), "mr-comm%d", d->me % 100000);
	pthread_setname_np(pthread_self(), name);
	pthread_mutex_lock(&d->mu);
	for (;;) {
		while (!d->head && !d->stop)
			pthread_cond_wait(&d->cv, &d->mu);
		struct coll_handle *h = d->head;
		if (!h)
			break;                   /* stop with an empty queue */
		d->head = h->next;
		if (!d->head)
			d->tail = NULL;
		pthread_mutex_unlock(&d->mu);

		uint64_t t_run = xport_now_ns();
		struct coll_run R = {
			.x = d->x, .me = d->me, .a = &h->a,
			.deadline = t_run + d->timeout_ns,
			.scr = &d->scr_comm, .err = h->err, .errlen = sizeof(h->err),
		};
		int rc = coll_exec(&R);
		uint64_t t_done = xport_now_ns();

		pthread_mutex_lock(&d->mu);
		h->rc = rc;
		h->t_run = t_run;
		h->t_done = t_done;
		h->done = true;
		bool wake = d->waiting;
		if (h->abandoned)
			handle_free(h);
		if (wake) {
			/* after unlock, so the waiter does not block on mu */
			pthread_mutex_unlock(&d->mu);
			pthread_cond_broadcast(&d->cv_done);
			pthread_mutex_lock(&d->mu);
		}
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

int coll_wait(struct coll_handle *h, uint64_t deadline_ns, char *err, size_t errlen)
{
	return coll_wait_times(h, deadline_ns, NULL, NULL, err, errlen);
}

int coll_wait_times(struct coll_handle *h, uint64_t deadline_ns, uint64_t *run_ns, uint64_t *done_ns,
		    char *err, size_t errlen)
{
	struct coll_dev *d = h->d;
	if (run_ns)
		*run_ns = 0;
	if (done_ns)
		*done_ns = 0;
	pthread_mutex_lock(&d->mu);
	while (!h->done) {
		if (deadline_ns == 0) {
			pthread_mutex_unlock(&d->mu);
			return -EAGAIN;
		}
		if (xport_now_ns() >= deadline_ns) {
			h->abandoned = true;
			pthread_mutex_unlock(&d->mu);
			snprintf(err, errlen, "%s (group %u, seq %llu, step %llu) on device %d: "
				 "wait timed out", coll_op_name(h->a.op), h->a.group,
				 (unsigned long long)h->a.seq, (unsigned long long)h->a.step, d->me);
			xport_fail(d->x, -ETIMEDOUT, err);
			return -ETIMEDOUT;
		}
		struct timespec ts = {
			.tv_sec = (time_t)(deadline_ns / 1000000000ull),
			.tv_nsec = (long)(deadline_ns % 1000000000ull),
		};
		d->waiting = true;
		pthread_cond_timedwait(&d->cv_done, &d->mu, &ts);
		d->waiting = false;
	}
	pthread_mutex_unlock(&d->mu);
	int rc = h->rc;
	if (rc)
		snprintf(err, errlen, "%s", h->err);
	if (run_ns)
		*run_ns = h->t_run;
	if (done_ns)
		*done_ns = h->t_done;
	handle_free(h);
	return rc;
}

/* ---- public entry points ---- */

int coll_all_gather(struct coll_dev *d, const struct coll_group *g, void *out,
		    const void *in, size_t bytes_per_rank, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_GATHER), .out = out, .in = in, .bytes = bytes_per_rank };
	return run_sync(d, g, &a, err, errlen);
}

int coll_reduce_scatter(struct coll_dev *d, const struct coll_group *g, float *out,
			const float *in, size_t count_per_rank, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(REDUCE_SCATTER), .out = out, .in = in, .count = count_per_rank };
	return run_sync(d, g, &a, err, errlen);
}

int coll_all_reduce(struct coll_dev *d, const struct coll_group *g, float *buf,
		    size_t count, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_REDUCE), .out = buf, .in = buf, .count = count };
	return run_sync(d, g, &a, err, errlen);
}

int coll_all_to_all(struct coll_dev *d, const struct coll_group *g, void *out,
		    const size_t *recv_bytes, const void *in, const size_t *send_bytes,
		    char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_TO_ALL), .out = out, .in = in,
			       .send_bytes = send_bytes, .recv_bytes = recv_bytes };
	return run_sync(d, g, &a, err, errlen);
}

int coll_permute(struct coll_dev *d, const struct coll_group *g, void *out,
		 const void *in, size_t bytes, int shift, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(PERMUTE), .out = out, .in = in, .bytes = bytes, .shift = shift };
	return run_sync(d, g, &a, err, errlen);
}

int coll_broadcast(struct coll_dev *d, const struct coll_group *g, void *buf,
		   size_t bytes, int root, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(BROADCAST), .out = buf, .in = buf, .bytes = bytes, .root = root };
	return run_sync(d, g, &a, err, errlen);
}

int coll_barrier(struct coll_dev *d, const struct coll_group *g, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(BARRIER) };
	return run_sync(d, g, &a, err, errlen);
}

struct coll_handle *coll_all_gather_async(struct coll_dev *d, const struct coll_group *g,
					  void *out, const void *in, size_t bytes_per_rank,
					  char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_GATHER), .out = out, .in = in, .bytes = bytes_per_rank };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_reduce_scatter_async(struct coll_dev *d, const struct coll_group *g,
					      float *out, const float *in,
					      size_t count_per_rank, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(REDUCE_SCATTER), .out = out, .in = in, .count = count_per_rank };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_all_reduce_async(struct coll_dev *d, const struct coll_group *g,
					  float *buf, size_t count, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_REDUCE), .out = buf, .in = buf, .count = count };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_all_to_all_async(struct coll_dev *d, const struct coll_group *g,
					  void *out, const size_t *recv_bytes, const void *in,
					  const size_t *send_bytes, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_TO_ALL), .out = out, .in = in,
			       .send_bytes = send_bytes, .recv_bytes = recv_bytes };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_permute_async(struct coll_dev *d, const struct coll_group *g,
				       void *out, const void *in, size_t bytes, int shift,
				       char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(PERMUTE), .out = out, .in = in, .bytes = bytes, .shift = shift };
	return run_async(d, g, &a, err, errlen);
}

/* ---- lists of runs ---- */

int coll_all_reduce_v(struct coll_dev *d, const struct coll_group *g, const struct coll_iov *iov,
		      int niov, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_REDUCE), .runs = true, .iov = iov, .niov = niov };
	return run_sync(d, g, &a, err, errlen);
}

int coll_reduce_scatter_v(struct coll_dev *d, const struct coll_group *g, const struct coll_iov *iov,
			  int niov, const size_t *counts, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(REDUCE_SCATTER), .runs = true, .iov = iov, .niov = niov,
			       .counts = counts };
	return run_sync(d, g, &a, err, errlen);
}

int coll_all_gather_v(struct coll_dev *d, const struct coll_group *g, const struct coll_iov *iov,
		      int niov, const size_t *counts, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_GATHER), .runs = true, .iov = iov, .niov = niov,
			       .counts = counts };
	return run_sync(d, g, &a, err, errlen);
}

struct coll_handle *coll_all_reduce_v_async(struct coll_dev *d, const struct coll_group *g,
					    const struct coll_iov *iov, int niov, char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_REDUCE), .runs = true, .iov = iov, .niov = niov };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_reduce_scatter_v_async(struct coll_dev *d, const struct coll_group *g,
						const struct coll_iov *iov, int niov, const size_t *counts,
						char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(REDUCE_SCATTER), .runs = true, .iov = iov, .niov = niov,
			       .counts = counts };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_all_gather_v_async(struct coll_dev *d, const struct coll_group *g,
					    const struct coll_iov *iov, int niov, const size_t *counts,
					    char *err, size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_GATHER), .runs = true, .iov = iov, .niov = niov,
			       .counts = counts };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_all_gather_v_fill_async(struct coll_dev *d, const struct coll_group *g,
						 const struct coll_iov *iov, int niov, const size_t *counts,
						 const struct coll_move *own, int nown, char *err,
						 size_t errlen)
{
	struct coll_args a = { .op = OP(ALL_GATHER), .runs = true, .iov = iov, .niov = niov,
			       .counts = counts, .own = own, .nown = nown };
	return run_async(d, g, &a, err, errlen);
}

struct coll_handle *coll_reduce_scatter_v_add_async(struct coll_dev *d, const struct coll_group *g,
						    const struct coll_iov *iov, int niov, const size_t *counts,
						    const struct coll_move *own, int nown, char *err,
						    size_t errlen)
{
	struct coll_args a = { .op = OP(REDUCE_SCATTER), .runs = true, .iov = iov, .niov = niov,
			       .counts = counts, .own = own, .nown = nown };
	return run_async(d, g, &a, err, errlen);
}
