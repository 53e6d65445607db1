/* The matching engine behind net/xport.h: one hash table of posted receives,
 * waiting sends, early RecvReady records, eager sends awaiting their
 * RecvReady and staged eager data, keyed by (src, dst, tag). Copies and
 * network I/O happen outside the lock.
 *
 * Completion is per request, without the lock: xreq.wait goes from
 * XW_PENDING to XW_DONE in one atomic exchange by whoever completes it. A
 * waiter polls (remote requests, xport_set_poll_spin) and then parks: it
 * puts its parker (on its own stack) into wait and sleeps on the parker's
 * futex word, so a completion wakes that one thread, and only when it
 * sleeps; a completion nobody sleeps on costs no system call. */
#include "net/xport.h"
#include "net/fsum.h"
#include "net/rec_log.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum {
	ST_RECV_LOCAL = 1,   /* recv from a device on this host, waiting for its send */
	ST_RECV_REMOTE,      /* recv from a remote device, RecvReady sent */
	ST_SEND_LOCAL,       /* send to a device on this host, waiting for its recv */
	ST_SEND_WAIT_READY,  /* send to a remote device, waiting for RecvReady */
	ST_READY,            /* RecvReady arrived before the send was posted */
	ST_NET,              /* handed to the net layer */
	ST_DONE,
	/* internal records, never a caller's request */
	ST_EAGER_SENT,       /* sent eagerly; its RecvReady returns the credit */
	ST_STAGING,          /* eager data arriving with no receive posted */
	ST_STAGED,           /* eager data in, waiting for its receive */
};

#define NBUCKETS 4096

/* the times of the request this thread's last xport_wait completed */
static _Thread_local struct xtimes last_times;

/* A sched_yield that takes longer than this ran another thread: if the
 * cores are all taken (cores_taken), a waiter stops polling (xport_wait). */
#define YIELD_BUSY_NS (30ull * 1000)

/* xreq.wait: a request's completion word (any other value: a parker) */
enum { XW_PENDING = 0, XW_DONE = 1, XW_ORPHAN = 2 };

/* A thread asleep on a request. word: PK_DONE once the completer will not
 * touch the parker again, PK_FAIL when xport_fail woke it. */
struct parker {
	_Atomic uint32_t word;
	struct parker *next, *prev;   /* x->sleepers, under x->mu */
};
enum { PK_DONE = 1, PK_FAIL = 2 };

/* xport_hold_wakes: this thread's completions of sleepers' requests, woken
 * at xport_release_wakes (a stream thread's turn, after the link's lock
 * is let go) */
#define HELD_MAX 16
static _Thread_local int hold_depth, nheld;
static _Thread_local struct parker *held[HELD_MAX];

struct xport {
	pthread_mutex_t mu;
	struct parker sleepers;  /* list head: threads asleep in xport_wait */
	uint64_t spin_ns;        /* xport_set_poll_spin */
	int ncores;              /* xport_set_cores */
	int loadavg_fd;          /* /proc/loadavg, or -1: its runnable count */
	atomic_bool stamps;      /* xport_set_stamps */
	int host_id;
	int ndev;
	int *dev_host;
	struct xport_remote_ops ops;
	void *ops_ctx;
	struct xreq *bucket[NBUCKETS];
	_Atomic int fail_rc;     /* written under mu, read anywhere */
	char fail_msg[512];
	uint64_t local_bytes;    /* memcpy'd between devices of this host */
	uint64_t messages;       /* sends posted by this host's devices */
	_Atomic uint64_t wakes_held;   /* wake-ups xport_hold_wakes put off */
	uint64_t *remote_bytes;  /* per device: payload of its sends to other hosts */
	/* eager sends (xport_set_eager): bytes sent to each host whose
	 * RecvReady has not come back, and bytes staged from each host */
	size_t eager_max, eager_credit;
	size_t *eager_out, *staged_in;
};

uint64_t xport_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* a request's trace time: 0 (no clock read) unless a trace asked */
static uint64_t stamp(const struct xport *x)
{
	return atomic_load_explicit(&x->stamps, memory_order_relaxed) ? xport_now_ns() : 0;
}

static unsigned hash_key(int src, int dst, uint64_t tag)
{
	uint64_t h = tag * 0x9E3779B97F4A7C15ull;
	h ^= (uint64_t)src * 0xC2B2AE3D27D4EB4Full + (uint64_t)dst * 0x165667B19E3779F9ull;
	h ^= h >> 29;
	return (unsigned)(h % NBUCKETS);
}

struct xport *xport_new(int host_id, int ndev_total, const int *dev_host,
			const struct xport_remote_ops *ops, void *ops_ctx)
{
	struct xport *x = calloc(1, sizeof(*x));
	if (!x)
		return NULL;
	x->dev_host = malloc(sizeof(int) * (size_t)(ndev_total > 0 ? ndev_total : 1));
	if (!x->dev_host) {
		free(x);
		return NULL;
	}
	memcpy(x->dev_host, dev_host, sizeof(int) * (size_t)ndev_total);
	int nhosts = host_id + 1;
	for (int d = 0; d < ndev_total; d++)
		if (dev_host[d] + 1 > nhosts)
			nhosts = dev_host[d] + 1;
	x->eager_out = calloc((size_t)nhosts, sizeof(size_t));
	x->staged_in = calloc((size_t)nhosts, sizeof(size_t));
	x->remote_bytes = calloc((size_t)(ndev_total > 0 ? ndev_total : 1), sizeof(uint64_t));
	if (!x->eager_out || !x->staged_in || !x->remote_bytes) {
		free(x->eager_out);
		free(x->staged_in);
		free(x->remote_bytes);
		free(x->dev_host);
		free(x);
		return NULL;
	}
	x->host_id = host_id;
	x->ndev = ndev_total;
	if (ops)
		x->ops = *ops;
	x->ops_ctx = ops_ctx;
	x->sleepers.next = x->sleepers.prev = &x->sleepers;
	cpu_set_t cpus;
	x->ncores = sched_getaffinity(0, sizeof(cpus), &cpus) ? 1 : CPU_COUNT(&cpus);
	x->loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
	pthread_mutex_init(&x->mu, NULL);
	return x;
}

void xport_set_cores(struct xport *x, int ncores)
{
	x->ncores = ncores;
}

/* Whether the machine's runnable threads (the fourth field of /proc/loadavg,
 * this one among them) outnumber the cores: a yield that ran another thread
 * then says a waiter's spin keeps a core from work, not only that a thread
 * it shares a core with ran (on a free machine that is most often the peer
 * host's device thread, sending what the waiter wants). Unknown: taken. */
static bool cores_taken(const struct xport *x)
{
	char b[128];
	ssize_t k = x->loadavg_fd >= 0 ? pread(x->loadavg_fd, b, sizeof(b) - 1, 0) : -1;
	if (k <= 0)
		return true;
	b[k] = 0;
	const char *p = b;
	for (int f = 0; f < 3 && p; f++)
		if ((p = strchr(p, ' ')))
			p++;
	if (!p)
		return true;
	char *end;
	long running = strtol(p, &end, 10);
	return end == p || *end != '/' || running > x->ncores;
}

void xport_set_stamps(struct xport *x, bool on)
{
	atomic_store_explicit(&x->stamps, on, memory_order_relaxed);
}

void xport_set_poll_spin(struct xport *x, uint64_t spin_ns)
{
	x->spin_ns = spin_ns;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t val, uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull),
			       .tv_nsec = (long)(ns % 1000000000ull) };
	syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void req_free(struct xreq *r)
{
	if (r->state == ST_STAGING || r->state == ST_STAGED)
		free(r->buf);
	free(r);
}

/* Records of the engine itself (not a caller's request): freed, never
 * completed, when the transport fails or is freed. */
static bool internal(const struct xreq *r)
{
	return r->state == ST_READY || r->state >= ST_EAGER_SENT;
}

/* Staged eager data meets its receive (both out of the table): lands it,
 * frees the staging and completes the receive. */
static void land_staged(struct xreq *recv, struct xreq *staged)
{
	int rc = recv->len == staged->len ? 0 : -EMSGSIZE;
	if (!rc && staged->len)
		xport_land(recv, 0, staged->buf, staged->len);
	req_free(staged);
	xport_complete(recv, rc);
}

void xport_set_eager(struct xport *x, size_t max_bytes, size_t credit_bytes)
{
	pthread_mutex_lock(&x->mu);
	x->eager_max = credit_bytes >= max_bytes ? max_bytes : 0;
	x->eager_credit = x->eager_max ? credit_bytes : 0;
	pthread_mutex_unlock(&x->mu);
}

void xport_free(struct xport *x)
{
	if (!x)
		return;
	for (int b = 0; b < NBUCKETS; b++) {
		struct xreq *r = x->bucket[b], *n;
		for (; r; r = n) {
			n = r->next;
			if (internal(r) || atomic_load(&r->wait) == XW_ORPHAN)
				req_free(r);
		}
	}
	if (x->loadavg_fd >= 0)
		close(x->loadavg_fd);
	pthread_mutex_destroy(&x->mu);
	free(x->eager_out);
	free(x->staged_in);
	free(x->remote_bytes);
	free(x->dev_host);
	free(x);
}

int xport_host_of(const struct xport *x, int dev)
{
	return (dev >= 0 && dev < x->ndev) ? x->dev_host[dev] : -1;
}


uint64_t xport_messages(struct xport *x)
{
	return __atomic_load_n(&x->messages, __ATOMIC_RELAXED);
}

uint64_t xport_remote_bytes(struct xport *x, int dev)
{
	if (dev < 0 || dev >= x->ndev)
		return 0;
	return __atomic_load_n(&x->remote_bytes[dev], __ATOMIC_RELAXED);
}

uint64_t xport_local_bytes(struct xport *x)
{
	return __atomic_load_n(&x->local_bytes, __ATOMIC_RELAXED);
}
int xport_num_devices(const struct xport *x) { return x->ndev; }

/* Removes and returns the first entry with key and a state in [s1, s2]. */
static struct xreq *take(struct xport *x, int src, int dst, uint64_t tag, int s1, int s2)
{
	struct xreq **pp = &x->bucket[hash_key(src, dst, tag)];
	for (; *pp; pp = &(*pp)->next) {
		struct xreq *r = *pp;
		if (r->src == src && r->dst == dst && r->tag == tag &&
		    r->state >= s1 && r->state <= s2) {
			*pp = r->next;
			r->next = NULL;
			return r;
		}
	}
	return NULL;
}

static bool present(struct xport *x, int src, int dst, uint64_t tag, int s1, int s2)
{
	for (struct xreq *r = x->bucket[hash_key(src, dst, tag)]; r; r = r->next)
		if (r->src == src && r->dst == dst && r->tag == tag &&
		    r->state >= s1 && r->state <= s2)
			return true;
	return false;
}

static void insert(struct xport *x, struct xreq *r)
{
	unsigned h = hash_key(r->src, r->dst, r->tag);
	r->next = x->bucket[h];
	x->bucket[h] = r;
}

/* Completes r, which is out of the table (or about to be dropped from
 * it): one atomic exchange; the waiter is woken only if it sleeps, and an
 * abandoned request is freed. After this r is not touched (its waiter
 * may free it). With or without x->mu held. */
static void finish(struct xreq *r, int rc)
{
	r->rc = rc;
	r->state = ST_DONE;
	r->t_done_ns = stamp(r->x);
	uintptr_t old = atomic_exchange_explicit(&r->wait, XW_DONE, memory_order_acq_rel);
	if (old == XW_ORPHAN) {
		req_free(r);
	} else if (old != XW_PENDING) {
		struct parker *p = (struct parker *)old;
		/* receives only: a send's wake-up (an ack ended it) is
		 * not held, as the turn goes on past it */
		if (hold_depth && nheld < HELD_MAX && r->kind == XREQ_RECV) {
			/* p stays on its waiter's stack until PK_DONE is set */
			held[nheld++] = p;
			atomic_fetch_add_explicit(&r->x->wakes_held, 1, memory_order_relaxed);
			return;
		}
		/* the parker lives on its waiter's stack until it sees this bit */
		atomic_fetch_or_explicit(&p->word, PK_DONE, memory_order_release);
		futex_wake(&p->word);
	}
}

void xport_hold_wakes(void)
{
	hold_depth++;
}

int xport_wakes_held(void)
{
	return nheld;
}

void xport_wake_held(void)
{
	for (int i = 0; i < nheld; i++) {
		atomic_fetch_or_explicit(&held[i]->word, PK_DONE, memory_order_release);
		futex_wake(&held[i]->word);
	}
	nheld = 0;
}

void xport_release_wakes(void)
{
	if (--hold_depth > 0)
		return;
	xport_wake_held();
}

uint64_t xport_wakes_deferred(struct xport *x)
{
	return atomic_load_explicit(&x->wakes_held, memory_order_relaxed);
}

static struct xreq *req_new(struct xport *x, enum xreq_kind kind, int src, int dst,
			    const struct xmeta *m, void *buf, size_t len)
{
	struct xreq *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->kind = kind;
	r->src = src;
	r->dst = dst;
	if (m) {
		r->meta = *m;
		r->tag = xmeta_tag(m);
	}
	r->buf = buf;
	r->len = len;
	r->x = x;
	r->t_issued_ns = stamp(x);
	return r;
}

static int check_ids(struct xport *x, int local, int peer)
{
	if (local < 0 || local >= x->ndev || peer < 0 || peer >= x->ndev)
		return -EINVAL;
	if (x->dev_host[local] != x->host_id)
		return -EINVAL;
	if (x->dev_host[peer] != x->host_id && !x->ops.send_ready)
		return -EINVAL;
	return 0;
}

/* Sets r's message over runs (buf NULL). */
static void set_runs(struct xreq *r, const struct xrun *runs, int nruns, size_t base)
{
	r->buf = NULL;
	r->runs = runs;
	r->nruns = nruns;
	r->runs_base = base;
}

int xruns_find(const struct xrun *run, int nrun, int hint, size_t p)
{
	int lo = 0, hi = nrun - 1;
	for (int k = hint; k >= 0 && k <= hint + 1 && k < hi; k++)
		if (run[k].off <= p && run[k + 1].off > p)
			return k;
	while (lo < hi) {
		int mid = lo + (hi - lo + 1) / 2;
		if (run[mid].off <= p)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

uint8_t *xreq_at(const struct xreq *r, size_t off, size_t *avail)
{
	if (!r->runs) {
		*avail = r->len - off;
		return (uint8_t *)r->buf + off;
	}
	size_t p = r->runs_base + off;
	/* most walks go in order (one holder at a time: the link's lock, or
	 * the one thread landing a local match) */
	int lo = xruns_find(r->runs, r->nruns, r->run_hint, p);
	((struct xreq *)r)->run_hint = lo;
	size_t end = lo + 1 < r->nruns ? r->runs[lo + 1].off : r->runs_base + r->len;
	*avail = end - p;
	return r->runs[lo].at + (p - r->runs[lo].off);
}

void xreq_copy_out(const struct xreq *r, size_t off, void *dst, size_t len)
{
	uint8_t *d = dst;
	while (len) {
		size_t k;
		const uint8_t *src = xreq_at(r, off, &k);
		if (k > len)
			k = len;
		memcpy(d, src, k);
		d += k;
		off += k;
		len -= k;
	}
}

/* A local match: lands the send's whole message in the receive, a run of
 * the sender's at a time (xport_land splits the receive's). */
static void land_from(struct xreq *recv, const struct xreq *send)
{
	for (size_t off = 0, k; off < send->len; off += k) {
		const uint8_t *src = xreq_at(send, off, &k);
		xport_land(recv, off, src, k);
	}
}

static int isend(struct xport *x, int src, int dst, const struct xmeta *m, const void *buf,
		 const struct xrun *runs, int nruns, size_t base, size_t len, struct xreq **out)
{
	int rc = check_ids(x, src, dst);
	if (rc)
		return rc;
	struct xreq *r = req_new(x, XREQ_SEND, src, dst, m, (void *)buf, len);
	if (!r)
		return -ENOMEM;
	if (runs)
		set_runs(r, runs, nruns, base);
	__atomic_add_fetch(&x->messages, 1, __ATOMIC_RELAXED);
	bool remote = x->dev_host[dst] != x->host_id;
	struct xreq *peer = NULL;
	if (remote)
		__atomic_add_fetch(&x->remote_bytes[src], len, __ATOMIC_RELAXED);

	pthread_mutex_lock(&x->mu);
	if ((rc = atomic_load(&x->fail_rc)))
		goto out_unlock_free;
	if (present(x, src, dst, r->tag, ST_SEND_LOCAL, ST_SEND_WAIT_READY)) {
		rc = -EEXIST;
		goto out_unlock_free;
	}
	if (remote) {
		peer = take(x, src, dst, r->tag, ST_READY, ST_READY);
		if (peer && peer->len != len) {
			/* the receiver posted a different size: a programming error
			 * on one side; fail this send loudly */
			req_free(peer);
			pthread_mutex_unlock(&x->mu);
			*out = r;
			finish(r, -EMSGSIZE);
			return 0;
		}
		if (!peer && len <= x->eager_max &&
		    x->eager_out[x->dev_host[dst]] + len <= x->eager_credit) {
			/* eager: out now; a record waits for the RecvReady the
			 * receiver sends anyway, which gives the credit back */
			struct xreq *rec = req_new(x, XREQ_SEND, src, dst, NULL, NULL, len);
			if (rec) {
				rec->tag = r->tag;
				rec->state = ST_EAGER_SENT;
				insert(x, rec);
				x->eager_out[x->dev_host[dst]] += len;
				r->eager = true;
			}
		}
		r->state = peer || r->eager ? ST_NET : ST_SEND_WAIT_READY;
		r->t_net_ns = r->state == ST_NET ? stamp(x) : 0;
		if (r->state == ST_SEND_WAIT_READY)
			insert(x, r);
	} else {
		peer = take(x, src, dst, r->tag, ST_RECV_LOCAL, ST_RECV_LOCAL);
		if (peer) {
			r->state = ST_NET;
			peer->state = ST_NET;
		} else {
			r->state = ST_SEND_LOCAL;
			insert(x, r);
		}
	}
	pthread_mutex_unlock(&x->mu);
	*out = r;

	if (remote) {
		if (peer)
			req_free(peer);
		if (peer || r->eager)
			x->ops.send_ready(x->ops_ctx, r);
	} else if (peer) {
		int mrc = peer->len == len ? 0 : -EMSGSIZE;
		if (!mrc && len) {
			land_from(peer, r);
			__atomic_add_fetch(&x->local_bytes, len, __ATOMIC_RELAXED);
		}
		finish(peer, mrc);
		finish(r, mrc);
	}
	return 0;

out_unlock_free:
	pthread_mutex_unlock(&x->mu);
	req_free(r);
	return rc;
}

int xport_isend(struct xport *x, int src, int dst, const struct xmeta *m,
		const void *buf, size_t len, struct xreq **out)
{
	uint64_t t0 = rec_log_on() ? rec_log_now() : 0;
	int rc = isend(x, src, dst, m, buf, NULL, 0, 0, len, out);
	if (t0)
		rec_mark(REC_ISEND, m->seq, len, t0);
	return rc;
}

int xport_isendv(struct xport *x, int src, int dst, const struct xmeta *m,
		 const struct xrun *runs, int nruns, size_t base, size_t len, struct xreq **out)
{
	if (nruns < 1 || !runs || runs[0].off > base)
		return -EINVAL;
	return isend(x, src, dst, m, NULL, runs, nruns, base, len, out);
}

/* runs: a message over runs (buf NULL); with an addend, it sums in place
 * (addend then only marks the sum) */
static int irecv(struct xport *x, int src, int dst, const struct xmeta *m, void *buf,
		 const struct xrun *runs, int nruns, size_t base, const float *addend,
		 size_t len, struct xreq **out)
{
	int rc = check_ids(x, dst, src);
	if (rc)
		return rc;
	struct xreq *r = req_new(x, XREQ_RECV, src, dst, m, buf, len);
	if (!r)
		return -ENOMEM;
	if (runs)
		set_runs(r, runs, nruns, base);
	r->addend = addend;
	bool remote = x->dev_host[src] != x->host_id;
	struct xreq *peer = NULL;

	pthread_mutex_lock(&x->mu);
	if ((rc = atomic_load(&x->fail_rc)))
		goto out_unlock_free;
	if (present(x, src, dst, r->tag, ST_RECV_LOCAL, ST_RECV_REMOTE)) {
		rc = -EEXIST;
		goto out_unlock_free;
	}
	if (!remote)
		peer = take(x, src, dst, r->tag, ST_SEND_LOCAL, ST_SEND_LOCAL);
	else if ((peer = take(x, src, dst, r->tag, ST_STAGED, ST_STAGED)))
		x->staged_in[x->dev_host[src]] -= peer->len;
	if (peer) {
		r->state = ST_NET;
		r->t_net_ns = stamp(x);
		if (!remote)
			peer->state = ST_NET;
	} else {
		r->state = remote ? ST_RECV_REMOTE : ST_RECV_LOCAL;
		insert(x, r);
	}
	/* what the RecvReady says, read before eager data may complete r */
	struct xreq posted = *r;
	pthread_mutex_unlock(&x->mu);
	*out = r;

	if (remote) {
		/* always, even when the data is in: the sender waits for it
		 * (or, after an eager send, takes its credit back) */
		x->ops.recv_posted(x->ops_ctx, &posted);
	}
	if (remote && peer) {
		land_staged(r, peer);     /* its eager data is already here */
	} else if (peer) {
		int mrc = peer->len == len ? 0 : -EMSGSIZE;
		if (!mrc && len) {
			land_from(r, peer);
			__atomic_add_fetch(&x->local_bytes, len, __ATOMIC_RELAXED);
		}
		finish(peer, mrc);
		finish(r, mrc);
	}
	return 0;

out_unlock_free:
	pthread_mutex_unlock(&x->mu);
	req_free(r);
	return rc;
}

int xport_irecv(struct xport *x, int src, int dst, const struct xmeta *m,
		void *buf, size_t len, struct xreq **out)
{
	uint64_t t0 = rec_log_on() ? rec_log_now() : 0;
	int rc = irecv(x, src, dst, m, buf, NULL, 0, 0, NULL, len, out);
	if (t0)
		rec_mark(REC_IRECV, m->seq, len, t0);
	return rc;
}

int xport_irecvv(struct xport *x, int src, int dst, const struct xmeta *m,
		 const struct xrun *runs, int nruns, size_t base, size_t len, bool sum,
		 struct xreq **out)
{
	if (nruns < 1 || !runs || runs[0].off > base || (sum && len % sizeof(float)))
		return -EINVAL;
	return irecv(x, src, dst, m, NULL, runs, nruns, base, sum ? (const float *)runs : NULL,
		     len, out);
}

int xport_irecv_add(struct xport *x, int src, int dst, const struct xmeta *m,
		    float *buf, const float *addend, size_t len, struct xreq **out)
{
	if (len % sizeof(float) || (len && !addend))
		return -EINVAL;
	return irecv(x, src, dst, m, buf, NULL, 0, 0, addend, len, out);
}

static void land_sum(float *dst, const float *add, const uint8_t *src, size_t n);

void xport_land(struct xreq *r, size_t off, const void *data, size_t len)
{
	if (r->runs) {
		/* run by run; a sum adds in place */
		const uint8_t *src = data;
		while (len) {
			size_t k;
			uint8_t *dst = xreq_at(r, off, &k);
			if (k > len)
				k = len;
			if (r->addend)
				land_sum((float *)dst, (const float *)dst, src, k / sizeof(float));
			else
				memcpy(dst, src, k);
			src += k;
			off += k;
			len -= k;
		}
		return;
	}
	if (!r->addend) {
		memcpy((uint8_t *)r->buf + off, data, len);
		return;
	}
	land_sum((float *)((uint8_t *)r->buf + off),
		 (const float *)((const uint8_t *)r->addend + off), data, len / sizeof(float));
}

/* dst = data (n floats at src, any alignment) + add; add may be dst. */
static void land_sum(float *dst, const float *add, const uint8_t *src, size_t n)
{
	const void *data = src;
	if ((uintptr_t)src % _Alignof(float) == 0) {
		if (add == dst)
			fsum_acc(dst, data, n);
		else
			fsum_add(dst, data, add, n);
		return;
	}
	/* unaligned bytes: through aligned storage a block at a time */
	while (n) {
		float tmp[1024];
		size_t k = n < 1024 ? n : 1024;
		memcpy(tmp, src, k * sizeof(float));
		if (add == dst)
			fsum_acc(dst, tmp, k);
		else
			fsum_add(dst, tmp, add, k);
		dst += k;
		add += k;
		src += k * sizeof(float);
		n -= k;
	}
}

void xport_land_stream(struct xreq *r, struct xland *s, const void *data, size_t len)
{
	const uint8_t *p = data;
	if (s->ncarry) {
		size_t k = sizeof(float) - s->ncarry;
		if (k > len)
			k = len;
		memcpy(s->carry + s->ncarry, p, k);
		s->ncarry += k;
		p += k;
		len -= k;
		if (s->ncarry < sizeof(float))
			return;
		xport_land(r, s->off, s->carry, sizeof(float));
		s->off += sizeof(float);
		s->ncarry = 0;
	}
	size_t whole = len - len % sizeof(float);
	xport_land(r, s->off, p, whole);
	s->off += whole;
	s->ncarry = len - whole;
	memcpy(s->carry, p + whole, s->ncarry);
}

static void describe(const struct xreq *r, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s %s device %d -> device %d (group %u seq %llu chunk %u step %llu)",
		 r->kind == XREQ_SEND ? "send" : "recv", what, r->src, r->dst, r->meta.group,
		 (unsigned long long)r->meta.seq, r->meta.chunk, (unsigned long long)r->meta.step);
}

static bool is_remote(const struct xreq *r)
{
	const struct xport *x = r->x;
	int peer = r->kind == XREQ_SEND ? r->dst : r->src;
	return x->dev_host[peer] != x->host_id;
}

/* Sleeps on r until it completes, a failure or the deadline (or a spurious
 * wake-up: the caller loops). */
static void park(struct xreq *r, uint64_t deadline_ns)
{
	struct xport *x = r->x;
	struct parker p = { .word = 0 };
	pthread_mutex_lock(&x->mu);
	p.next = x->sleepers.next;
	p.prev = &x->sleepers;
	p.next->prev = &p;
	x->sleepers.next = &p;
	pthread_mutex_unlock(&x->mu);
	uintptr_t exp = XW_PENDING;
	if (atomic_compare_exchange_strong(&r->wait, &exp, (uintptr_t)&p)) {
		uint64_t now = xport_now_ns();
		if (!atomic_load(&x->fail_rc) && now < deadline_ns) {
			uint64_t t0 = rec_log_on() ? rec_log_now() : 0;
			futex_wait(&p.word, 0, deadline_ns - now);
			if (t0)
				rec_mark(REC_PARK, r->meta.seq, r->len, t0);
		}
		exp = (uintptr_t)&p;
		if (!atomic_compare_exchange_strong(&r->wait, &exp, XW_PENDING)) {
			/* completed meanwhile: the completer is about to set
			 * PK_DONE, and p must outlive that */
			while (!(atomic_load_explicit(&p.word, memory_order_acquire) & PK_DONE))
				sched_yield();
		}
	}
	pthread_mutex_lock(&x->mu);
	p.prev->next = p.next;
	p.next->prev = p.prev;
	pthread_mutex_unlock(&x->mu);
}

static int wait_req(struct xreq *r, uint64_t deadline_ns, char *err, size_t errlen);

/* MESHRUN_YIELD_RULE=old: a busy yield gives the spin up without the
 * look below (the rule before float20), for A/B */
static int yield_old = -1;

static bool yield_rule_old(void)
{
	if (yield_old < 0) {
		const char *e = getenv("MESHRUN_YIELD_RULE");
		yield_old = e && !strcmp(e, "old");
	}
	return yield_old;
}

int xport_wait(struct xreq *r, uint64_t deadline_ns, char *err, size_t errlen)
{
	if (!deadline_ns || !rec_log_on())
		return wait_req(r, deadline_ns, err, errlen);
	uint64_t t0 = rec_log_now(), seq = r->meta.seq, len = r->len;
	int rc = wait_req(r, deadline_ns, err, errlen);
	rec_mark(REC_WAIT, seq, len, t0);
	return rc;
}

static int wait_req(struct xreq *r, uint64_t deadline_ns, char *err, size_t errlen)
{
	struct xport *x = r->x;
	int rc;
	bool poll = deadline_ns && x->spin_ns && x->ops.poll && is_remote(r);
	bool polling = false;
	bool look = false;   /* one poll before giving the spin up */
	uint64_t spin_end = 0;

	if (deadline_ns && x->ops.flush)
		x->ops.flush(x->ops_ctx);

	for (;;) {
		if (atomic_load_explicit(&r->wait, memory_order_acquire) == XW_DONE)
			goto out_done;
		if ((rc = atomic_load(&x->fail_rc))) {
			pthread_mutex_lock(&x->mu);
			snprintf(err, errlen, "%s", x->fail_msg);
			pthread_mutex_unlock(&x->mu);
			break;
		}
		if (deadline_ns == 0)
			return -EAGAIN;
		uint64_t now = xport_now_ns();
		if (now >= deadline_ns) {
			rc = -ETIMEDOUT;
			describe(r, err, errlen, "timed out");
			break;
		}
		if (poll) {
			if (!polling)
				spin_end = now + x->spin_ns;
			if (now < spin_end || look) {
				bool first = !polling;
				polling = true;
				/* bounded by spin_ns without progress: while bytes
				 * move, the waiter keeps reading them itself */
				uint64_t t0 = rec_log_on() ? rec_log_now() : 0;
				if (x->ops.poll(x->ops_ctx, r, first)) {
					if (t0)
						rec_mark(REC_POLL, r->meta.seq, r->len, t0);
					spin_end = xport_now_ns() + x->spin_ns;
					continue;
				}
				if (look && !yield_rule_old()) {
					/* nothing came while others ran: sleep */
					look = false;
					spin_end = 0;
					continue;
				}
				/* a large message: wait on the link's socket in
				 * the kernel for the rest of the spin (no CPU
				 * spent, still no hand-off to another thread) */
				if (x->ops.idle && r->len >= XPORT_IDLE_MIN_BYTES &&
				    x->ops.idle(x->ops_ctx, r, spin_end - now))
					continue;
				/* a yield that gave the core away (another thread
				 * ran) while the machine has more runnable threads
				 * than cores: spinning on would only keep them from
				 * the threads that make progress, so sleep instead,
				 * after a look (float20): what the threads that ran
				 * sent is most often in the socket by now, and a
				 * sleep there only woke the stream thread to read it
				 * and wake us. While the look's polls move bytes the
				 * waiter polls on, without another yield.
				 * With cores to spare the thread that ran shares
				 * ours, most often the peer host's device thread
				 * sending what we wait for: two hosts' device
				 * threads on one core yield to each other, and
				 * sleeping there handed every message to a stream
				 * thread and a wake-up (the 64 KiB ops' slow mode,
				 * docs/collectives.md, "The life of a message") */
				uint64_t y0 = xport_now_ns();
				sched_yield();
				uint64_t y1 = xport_now_ns();
				if (y1 - y0 > YIELD_BUSY_NS && cores_taken(x)) {
					if (yield_rule_old())
						spin_end = 0;
					else
						look = true;
				} else if (y1 >= spin_end && !yield_rule_old()) {
					/* the spin ran out while others ran: one look */
					look = true;
				}
				continue;
			}
			poll = false;
			if (x->ops.poll_end)
				x->ops.poll_end(x->ops_ctx, r, false);
			polling = false;
			continue;   /* one last look before sleeping */
		}
		park(r, deadline_ns);
	}
	if (polling && x->ops.poll_end)
		x->ops.poll_end(x->ops_ctx, r, false);
	/* abandoned: whoever holds it frees it on completion, unless it
	 * completed just now */
	uintptr_t exp = XW_PENDING;
	if (atomic_compare_exchange_strong(&r->wait, &exp, XW_ORPHAN))
		return rc;
	polling = false;
out_done:
	if (polling && x->ops.poll_end)
		x->ops.poll_end(x->ops_ctx, r, true);
	rc = r->rc;
	if (rc)
		describe(r, err, errlen, rc == -EMSGSIZE ? "size mismatch" : "failed");
	last_times = (struct xtimes){ .issued_ns = r->t_issued_ns, .net_ns = r->t_net_ns,
				      .done_ns = r->t_done_ns };
	req_free(r);
	return rc;
}

struct xtimes xport_last_times(void)
{
	return last_times;
}

int xport_test(struct xreq *r, char *err, size_t errlen)
{
	xport_flush(r->x);
	return xport_wait(r, 0, err, errlen);
}

int xport_peek(struct xreq *r, char *err, size_t errlen)
{
	return xport_wait(r, 0, err, errlen);
}

void xport_flush(struct xport *x)
{
	if (x->ops.flush)
		x->ops.flush(x->ops_ctx);
}

void xport_flush_later(struct xport *x)
{
	if (x->ops.flush_later)
		x->ops.flush_later(x->ops_ctx);
	else
		xport_flush(x);
}

void xport_fail(struct xport *x, int rc, const char *msg)
{
	pthread_mutex_lock(&x->mu);
	if (!atomic_load(&x->fail_rc)) {
		snprintf(x->fail_msg, sizeof(x->fail_msg), "%s", msg);
		atomic_store(&x->fail_rc, rc ? rc : -EIO);
		/* complete everything still in the table; what the net layer holds
		 * it completes itself */
		for (int b = 0; b < NBUCKETS; b++) {
			struct xreq *r = x->bucket[b], *n;
			x->bucket[b] = NULL;
			for (; r; r = n) {
				n = r->next;
				r->next = NULL;
				if (internal(r))
					req_free(r);
				else
					finish(r, atomic_load(&x->fail_rc));
			}
		}
		/* waiters on requests the net layer holds see fail_rc */
		for (struct parker *p = x->sleepers.next; p != &x->sleepers; p = p->next) {
			atomic_fetch_or(&p->word, PK_FAIL);
			futex_wake(&p->word);
		}
	}
	pthread_mutex_unlock(&x->mu);
}

int xport_failed(struct xport *x, char *err, size_t errlen)
{
	pthread_mutex_lock(&x->mu);
	int rc = atomic_load(&x->fail_rc);
	if (rc && err)
		snprintf(err, errlen, "%s", x->fail_msg);
	pthread_mutex_unlock(&x->mu);
	return rc;
}

struct xreq *xport_remote_ready(struct xport *x, int src, int dst, uint64_t tag, size_t len)
{
	struct xreq *r = NULL;
	pthread_mutex_lock(&x->mu);
	if (atomic_load(&x->fail_rc))
		goto out;
	r = take(x, src, dst, tag, ST_SEND_WAIT_READY, ST_SEND_WAIT_READY);
	if (r) {
		if (r->len != len) {
			finish(r, -EMSGSIZE);
			r = NULL;
		} else {
			r->state = ST_NET;
			r->t_net_ns = stamp(x);
		}
		goto out;
	}
	struct xreq *rec = take(x, src, dst, tag, ST_EAGER_SENT, ST_EAGER_SENT);
	if (rec) {
		/* the send went out eagerly: its credit comes back */
		x->eager_out[x->dev_host[dst]] -= rec->len;
		req_free(rec);
		goto out;
	}
	rec = req_new(x, XREQ_SEND, src, dst, NULL, NULL, len);
	if (rec) {
		rec->tag = tag;
		rec->state = ST_READY;
		insert(x, rec);
	}
out:
	pthread_mutex_unlock(&x->mu);
	return r;
}

struct xreq *xport_remote_data(struct xport *x, int src, int dst, uint64_t tag, size_t len,
			       bool eager, const char **why)
{
	struct xreq *r;
	*why = "matches no posted receive";
	pthread_mutex_lock(&x->mu);
	r = take(x, src, dst, tag, ST_RECV_REMOTE, ST_RECV_REMOTE);
	if (r && r->len != len) {
		finish(r, -EMSGSIZE);
		r = NULL;
		*why = "differs in size from its posted receive";
	} else if (r) {
		r->state = ST_NET;
		r->t_net_ns = stamp(x);
	} else if (eager) {
		/* no receive yet: stage it, within the credit the sender keeps */
		int h = x->dev_host[src];
		if (len > x->eager_max || x->staged_in[h] + len > x->eager_credit) {
			*why = "is eager data beyond the credit (eager_max_bytes)";
		} else if (present(x, src, dst, tag, ST_STAGED, ST_STAGED)) {
			*why = "repeats a message that is still staged";
		} else if ((r = req_new(x, XREQ_RECV, src, dst, NULL, NULL, len)) &&
			   (r->buf = malloc(len ? len : 1))) {
			r->tag = tag;
			r->state = ST_STAGING;
			r->t_net_ns = stamp(x);
			x->staged_in[h] += len;
		} else {
			free(r);
			r = NULL;
			*why = "has no memory to stage it";
		}
	}
	pthread_mutex_unlock(&x->mu);
	return r;
}

void xport_complete(struct xreq *r, int rc)
{
	struct xport *x = r->x;
	/* a caller's request the net layer held: nobody else touches it */
	if (r->state != ST_STAGING) {
		finish(r, rc);
		return;
	}
	pthread_mutex_lock(&x->mu);
	/* staged eager data is in: to its receive if one was posted meanwhile,
	 * else into the table for the receive to find */
	struct xreq *want = NULL;
	if (rc || atomic_load(&x->fail_rc)) {
		x->staged_in[x->dev_host[r->src]] -= r->len;
	} else if ((want = take(x, r->src, r->dst, r->tag, ST_RECV_REMOTE, ST_RECV_REMOTE))) {
		x->staged_in[x->dev_host[r->src]] -= r->len;
		want->state = ST_NET;
		want->t_net_ns = r->t_net_ns;  /* its data started arriving then */
	} else {
		r->state = ST_STAGED;
		insert(x, r);
		r = NULL;
	}
	pthread_mutex_unlock(&x->mu);
	if (want)
		land_staged(want, r);
	else if (r)
		req_free(r);
}
