/* The transport under the collectives: receives that sum on arrival
 * (xport_irecv_add, bytes landing from a stream cut anywhere); eager sends
 * within a credit and staged arrivals; a waiter that spins on with cores to
 * spare and sleeps without; a stream thread's held wake-ups. Then two
 * hosts' nets in this process over TLS on loopback: a send's buffer kept
 * by reference across a reset link until acknowledged, a lingering link
 * read again without the net thread's tick, a large exchange that reads
 * before it seals; and idle: a waiting process and two idle agents use
 * under 1% of a CPU. */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/fault.h"
#include "net/net.h"
#include "net/xport.h"
#include "tests/coll_util.h"
#include "tests/proc.h"

/* ---- receives that sum on arrival (xport_irecv_add) ---- */

/* buf[i] is a[i] + b[i], bit for bit */
static void expect_sums(const float *buf, const float *a, const float *b, int n)
{
	for (int i = 0; i < n; i++) {
		float want = a[i] + b[i];
		ck_assert_msg(!memcmp(&buf[i], &want, sizeof(float)), "elem %d: %.9g want %.9g", i,
			      buf[i], want);
	}
}

START_TEST(test_xport_recv_add)
{
	int hosts[2] = { 0, 0 };
	struct xport *x = xport_new(0, 2, hosts, NULL, NULL);
	ck_assert_ptr_nonnull(x);
	enum { N = 1003 };
	float *snd = xmalloc(sizeof(float) * N), *buf = xmalloc(sizeof(float) * N);
	float *add = xmalloc(sizeof(float) * N), *old = xmalloc(sizeof(float) * N);
	for (int i = 0; i < N; i++) {
		snd[i] = 1.0f / (float)(i + 3);
		add[i] = (float)i * 1.1f + 1e-3f;
		buf[i] = old[i] = -0.7f * (float)i;
	}
	struct xmeta m = { .group = 1, .seq = 1 };
	struct xreq *rr, *sr;
	char err[256];
	/* only whole floats */
	ck_assert_int_eq(xport_irecv_add(x, 0, 1, &m, buf, add, 6, &rr), -EINVAL);

	/* receive posted first, separate addend: buf = sent + addend */
	ck_assert_int_eq(xport_irecv_add(x, 0, 1, &m, buf, add, sizeof(float) * N, &rr), 0);
	ck_assert_int_eq(xport_isend(x, 0, 1, &m, snd, sizeof(float) * N, &sr), 0);
	ck_assert_int_eq(xport_wait(rr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	ck_assert_int_eq(xport_wait(sr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	expect_sums(buf, snd, add, N);
	/* send first, in place: buf += sent */
	memcpy(buf, old, sizeof(float) * N);
	m.seq = 2;
	ck_assert_int_eq(xport_isend(x, 0, 1, &m, snd, sizeof(float) * N, &sr), 0);
	ck_assert_int_eq(xport_irecv_add(x, 0, 1, &m, buf, buf, sizeof(float) * N, &rr), 0);
	ck_assert_int_eq(xport_wait(rr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	ck_assert_int_eq(xport_wait(sr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	expect_sums(buf, old, snd, N);
	/* bytes off a stream need no alignment: N - 2 floats land at offset 8 from
	 * an odd address, the rest of buf untouched */
	uint8_t *raw = xmalloc(sizeof(float) * N + 1);
	memcpy(raw + 1, snd, sizeof(float) * N);
	memcpy(buf, old, sizeof(float) * N);
	struct xreq fake = { .kind = XREQ_RECV, .buf = buf, .len = sizeof(float) * N,
			     .addend = add };
	xport_land(&fake, 8, raw + 1, sizeof(float) * (N - 2));
	for (int i = 0; i < N; i++) {
		float want = i < 2 ? old[i] : snd[i - 2] + add[i];
		ck_assert_msg(!memcmp(&buf[i], &want, sizeof(float)), "elem %d: %.9g want %.9g", i,
			      buf[i], want);
	}
	/* a stream cut at odd places (as TLS records may cut a payload): the
	 * bytes of a split float wait for the next piece */
	memcpy(buf, old, sizeof(float) * N);
	fake.addend = buf;
	struct xland st = { 0 };
	static const size_t cuts[] = { 1, 2, 3, 5, 4, 7, 1, 1, 1, 9, 4000 };
	size_t at = 0;
	for (size_t k = 0; at < sizeof(float) * N; k++) {
		size_t len = k < sizeof(cuts) / sizeof(cuts[0]) ? cuts[k] : 13;
		if (len > sizeof(float) * N - at)
			len = sizeof(float) * N - at;
		xport_land_stream(&fake, &st, raw + 1 + at, len);
		at += len;
	}
	ck_assert_uint_eq(st.ncarry, 0);
	ck_assert_uint_eq(st.off, sizeof(float) * N);
	expect_sums(buf, old, snd, N);
	free(raw);
	free(snd);
	free(buf);
	free(add);
	free(old);
	xport_free(x);
}
END_TEST

/* What a host's transport asks of its net layer, recorded instead of sent. */
struct mock_net {
	struct xreq *sent[16];      /* send_ready: data frames to write */
	int nsent;
	uint64_t ready_tag[16];     /* recv_posted: RecvReady frames */
	size_t ready_len[16];
	int nready;
};

static void mock_recv_posted(void *ctx, struct xreq *r)
{
	struct mock_net *m = ctx;
	ck_assert_int_lt(m->nready, 16);
	m->ready_tag[m->nready] = r->tag;
	m->ready_len[m->nready++] = r->len;
}

static void mock_send_ready(void *ctx, struct xreq *r)
{
	struct mock_net *m = ctx;
	ck_assert_int_lt(m->nsent, 16);
	m->sent[m->nsent++] = r;
}

static const struct xport_remote_ops mock_ops = { .recv_posted = mock_recv_posted,
						  .send_ready = mock_send_ready };

/* Eager data from device 0 (host 0) arrives at host 1's transport: the
 * staging request it is read into, or NULL with the reason. */
static struct xreq *eager_arrives(struct xport *x, const struct xmeta *m, const void *data,
				  size_t len, bool complete, const char **why)
{
	struct xreq *r = xport_remote_data(x, 0, 1, xmeta_tag(m), len, true, why);
	if (r && len)
		memcpy(r->buf, data, len);
	if (r && complete)
		xport_complete(r, 0);
	return r;
}

/* A waiter's poll hook that plays the peer: the message "arrives" when the
 * waiter polls after more than 30 us away from its link (YIELD_BUSY_NS,
 * net/xport.c: the thread that ran meanwhile was the peer, sending it);
 * with deliver_on_end, when the waiter stops polling to sleep instead. */
struct yield_peer {
	struct xport *x;
	uint64_t last_ns;
	int polls, by_poll, ends;
	bool deliver_on_end;
	bool land_on_end;    /* on end, land what no poll landed */
	uint8_t data[256];
};

static void yield_peer_land(struct yield_peer *p, const struct xreq *req)
{
	const char *why;
	struct xreq *r = xport_remote_data(p->x, req->src, req->dst, req->tag, req->len, false, &why);
	ck_assert_msg(r != NULL, "%s", why);
	memcpy(r->buf, p->data, r->len);
	xport_complete(r, 0);
}

static bool yield_peer_poll(void *ctx, struct xreq *req, bool first)
{
	struct yield_peer *p = ctx;
	uint64_t now = xport_now_ns();
	bool gap = !first && now - p->last_ns > 30 * 1000;
	p->last_ns = now;
	p->polls++;
	if (!gap || p->deliver_on_end || p->by_poll)
		return false;
	yield_peer_land(p, req);
	p->by_poll++;
	return true;
}

static void yield_peer_end(void *ctx, struct xreq *req, bool done)
{
	struct yield_peer *p = ctx;
	if (done)
		return;
	/* about to sleep: the stream thread would read it now */
	if ((p->deliver_on_end || (p->land_on_end && !p->by_poll)) && !p->ends)
		yield_peer_land(p, req);
	p->ends++;
}

static void yield_peer_posted(void *ctx, struct xreq *r)
{
	(void)ctx;
	(void)r;
}

static atomic_bool hog_stop;

static void *hog_main(void *arg)
{
	(void)arg;
	while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
		;
	return NULL;
}

/* One remote receive waited on with a busy thread on the waiter's one
 * CPU, so its yields give the core away. cores: xport_set_cores. */
static void wait_beside_hog(struct yield_peer *p, int cores, int *rc, char *err, size_t errlen)
{
	static const struct xport_remote_ops ops = { .recv_posted = yield_peer_posted,
						     .send_ready = yield_peer_posted,
						     .poll = yield_peer_poll,
						     .poll_end = yield_peer_end };
	int hosts[2] = { 0, 1 };
	for (size_t i = 0; i < sizeof(p->data); i++)
		p->data[i] = (uint8_t)(i * 7 + 1);
	p->x = xport_new(0, 2, hosts, &ops, p);
	ck_assert_ptr_nonnull(p->x);
	xport_set_poll_spin(p->x, 5ull * 1000 * 1000 * 1000);    /* never the limit here */
	xport_set_cores(p->x, cores);
	cpu_set_t was, one;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(was), &was), 0);
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setaffinity_np(&at, sizeof(one), &one);
	pthread_t hog;
	atomic_store(&hog_stop, false);
	ck_assert_int_eq(pthread_create(&hog, &at, hog_main, NULL), 0);
	pthread_attr_destroy(&at);
	uint8_t got[256] = { 0 };
	struct xmeta m = { .group = 3, .seq = 1 };
	struct xreq *r;
	ck_assert_int_eq(xport_irecv(p->x, 1, 0, &m, got, sizeof(got), &r), 0);
	*rc = xport_wait(r, xport_now_ns() + 3ull * 1000 * 1000 * 1000, err, errlen);
	atomic_store(&hog_stop, true);
	pthread_join(hog, NULL);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(was), &was), 0);
	if (!*rc)
		ck_assert_mem_eq(got, p->data, sizeof(got));
	xport_free(p->x);
}

/* A yield that gave the core away (another thread on the waiter's core ran
 * for over 30 us) ends the spin only when the machine has more runnable
 * threads than cores. With cores to spare (here: a count no machine
 * reaches) the waiter polls on and reads what came meanwhile, from a peer
 * that was the thread that ran: a waiter that slept instead would time
 * out, as nothing else delivers. With the cores taken (0), it stops
 * polling to sleep, and the data comes the sleeper's way. */
START_TEST(test_xport_spin_on_free_cores)
{
	char err[256] = "";
	int rc;
	struct yield_peer p = { 0 };
	wait_beside_hog(&p, 1 << 20, &rc, err, sizeof(err));
	ck_assert_msg(rc == 0, "the waiter stopped polling with cores to spare: %s (%d polls)", err,
		      p.polls);
	ck_assert_int_eq(p.by_poll, 1);
	ck_assert_int_eq(p.ends, 0);

	struct yield_peer q = { .deliver_on_end = true };
	wait_beside_hog(&q, 0, &rc, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	ck_assert_int_eq(q.ends, 1);
	ck_assert_int_eq(q.by_poll, 0);
}
END_TEST

/* With the cores taken, a busy yield still ends in one more poll before
 * the waiter sleeps (float20): the thread that ran may have sent what it
 * waits for, and before, the waiter slept with those bytes in its socket,
 * for the stream thread to read and wake it (two more context switches a
 * message on 4 x 1 floating). Here the poll after the yield finds the
 * data, so the waiter never ends its spin; without the look, it ends it
 * and the data lands on the end instead (ends 1, by_poll 0). */
START_TEST(test_xport_look_after_busy_yield)
{
	char err[256] = "";
	int rc;
	struct yield_peer p = { .land_on_end = true };
	wait_beside_hog(&p, 0, &rc, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	ck_assert_msg(p.by_poll == 1 && p.ends == 0,
		      "the waiter slept without a look after its busy yield (by_poll %d, ends %d)",
		      p.by_poll, p.ends);
}
END_TEST

/* A stream thread's held wake-up (xport_hold_wakes, small15): a request
 * completed while wake-ups are held leaves its sleeping waiter asleep
 * until xport_release_wakes, so the woken device thread does not preempt
 * the completer while it still holds the link's lock. The waiter cannot
 * return before the release (it waits for PK_DONE), so no clock decides. */
struct held_waiter {
	struct xreq *r;
	_Atomic int done;
	int rc;
};

static void *held_wait(void *arg)
{
	struct held_waiter *w = arg;
	char err[256];
	w->rc = xport_wait(w->r, xport_now_ns() + 20000000000ull, err, sizeof(err));
	atomic_store(&w->done, 1);
	return NULL;
}

START_TEST(test_xport_wake_held)
{
	int hosts[2] = { 0, 1 };
	struct mock_net nb = { 0 };
	struct xport *b = xport_new(1, 2, hosts, &mock_ops, &nb);
	ck_assert_ptr_nonnull(b);
	float got[4];
	struct xmeta m = { .group = 3, .seq = 1 };
	struct held_waiter w = { 0 };
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m, got, sizeof(got), &w.r), 0);
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, held_wait, &w), 0);
	/* asleep: its parker is in the request's completion word */
	while (atomic_load(&w.r->wait) <= 2)
		sched_yield();
	xport_hold_wakes();
	xport_complete(w.r, 0);
	ck_assert_int_eq(xport_wakes_held(), 1);
	ck_assert_uint_eq(xport_wakes_deferred(b), 1);
	for (int i = 0; i < 100; i++)
		sched_yield();
	ck_assert_int_eq(atomic_load(&w.done), 0);
	xport_release_wakes();
	ck_assert_int_eq(xport_wakes_held(), 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(w.rc, 0);
	/* outside a hold a completion wakes at once, as before */
	struct held_waiter v = { 0 };
	m.seq = 2;
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m, got, sizeof(got), &v.r), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, held_wait, &v), 0);
	while (atomic_load(&v.r->wait) <= 2)
		sched_yield();
	xport_complete(v.r, 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(v.rc, 0);
	ck_assert_uint_eq(xport_wakes_deferred(b), 1);
	/* a send's wake-up is not held (an ack may end it mid-turn, and
	 * the turn goes on) */
	struct held_waiter u = { 0 };
	m.seq = 3;
	ck_assert_int_eq(xport_isend(b, 1, 0, &m, got, sizeof(got), &u.r), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, held_wait, &u), 0);
	while (atomic_load(&u.r->wait) <= 2)
		sched_yield();
	xport_hold_wakes();
	xport_complete(u.r, 0);
	ck_assert_int_eq(xport_wakes_held(), 0);
	pthread_join(t, NULL);
	xport_release_wakes();
	ck_assert_int_eq(u.rc, 0);
	ck_assert_uint_eq(xport_wakes_deferred(b), 1);
	xport_free(b);
}
END_TEST

/* Small messages go out without waiting for the RecvReady, within a credit
 * per host; the receiver stages what comes before its receive, within the
 * same credit, and still sends every RecvReady, which returns the credit. */
START_TEST(test_xport_eager)
{
	int hosts[2] = { 0, 1 };
	struct mock_net na = { 0 }, nb = { 0 };
	struct xport *a = xport_new(0, 2, hosts, &mock_ops, &na);
	struct xport *b = xport_new(1, 2, hosts, &mock_ops, &nb);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	xport_set_eager(a, 64, 256);
	xport_set_eager(b, 64, 256);
	float data[16], got[16], add[16];
	for (int i = 0; i < 16; i++) {
		data[i] = 0.25f * (float)i - 1.0f;
		add[i] = 3.0f + (float)i;
	}
	struct xmeta m[8];
	for (int k = 0; k < 8; k++)
		m[k] = (struct xmeta){ .group = 2, .seq = (uint64_t)k + 1 };
	struct xreq *s[8], *r;
	char err[256];
	const char *why;
	uint64_t soon = xport_now_ns() + 1000000000ull;

	/* sender: four 64-byte sends use the 256-byte credit and go at once */
	for (int k = 0; k < 4; k++) {
		ck_assert_int_eq(xport_isend(a, 0, 1, &m[k], data, 64, &s[k]), 0);
		ck_assert_int_eq(na.nsent, k + 1);
		ck_assert(na.sent[k] == s[k] && s[k]->eager);
		xport_complete(s[k], 0);   /* the net layer wrote it */
		ck_assert_int_eq(xport_wait(s[k], soon, err, sizeof(err)), 0);
	}
	/* the fifth waits for its RecvReady; a larger one never goes eagerly */
	ck_assert_int_eq(xport_isend(a, 0, 1, &m[4], data, 64, &s[4]), 0);
	uint8_t big[128] = { 0 };
	ck_assert_int_eq(xport_isend(a, 0, 1, &m[5], big, sizeof(big), &s[5]), 0);
	ck_assert_int_eq(na.nsent, 4);
	ck_assert_int_eq(xport_wait(s[4], 0, err, sizeof(err)), -EAGAIN);

	/* receiver: message 1 arrives before its receive and is staged; the
	 * receive completes at once and still sends its RecvReady */
	ck_assert_ptr_nonnull(eager_arrives(b, &m[0], data, 64, true, &why));
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[0], got, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), 0);
	ck_assert(!memcmp(got, data, 64));
	ck_assert_int_eq(nb.nready, 1);
	ck_assert_uint_eq(nb.ready_tag[0], xmeta_tag(&m[0]));
	ck_assert_uint_eq(nb.ready_len[0], 64);
	/* that RecvReady returns 64 bytes of credit: a new send goes eagerly,
	 * the one already waiting keeps waiting for its own */
	ck_assert_ptr_null(xport_remote_ready(a, 0, 1, xmeta_tag(&m[0]), 64));
	ck_assert_int_eq(na.nsent, 4);
	ck_assert_int_eq(xport_isend(a, 0, 1, &m[6], data, 64, &s[6]), 0);
	ck_assert_int_eq(na.nsent, 5);
	ck_assert(s[6]->eager);
	xport_complete(s[6], 0);
	ck_assert_int_eq(xport_wait(s[6], soon, err, sizeof(err)), 0);
	/* ...and the waiting one goes when its RecvReady comes, not eagerly */
	struct xreq *w = xport_remote_ready(a, 0, 1, xmeta_tag(&m[4]), 64);
	ck_assert(w == s[4] && !w->eager);
	xport_complete(w, 0);
	ck_assert_int_eq(xport_wait(s[4], soon, err, sizeof(err)), 0);

	/* receiver: a receive posted while its eager data is still arriving
	 * gets it when the last byte is in, summed with its addend */
	struct xreq *st = eager_arrives(b, &m[1], data, 64, false, &why);
	ck_assert_ptr_nonnull(st);
	ck_assert_int_eq(xport_irecv_add(b, 0, 1, &m[1], got, add, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), -EAGAIN);
	xport_complete(st, 0);
	ck_assert_int_eq(xport_wait(r, soon, err, sizeof(err)), 0);
	for (int i = 0; i < 16; i++)
		ck_assert_float_eq(got[i], data[i] + add[i]);

	/* the staged bytes are bounded by the credit: 3 x 64 staged + 64 fit,
	 * the next is refused with the reason */
	ck_assert_ptr_nonnull(eager_arrives(b, &m[2], data, 64, true, &why));
	ck_assert_ptr_nonnull(eager_arrives(b, &m[3], data, 64, true, &why));
	ck_assert_ptr_nonnull(eager_arrives(b, &m[6], data, 64, true, &why));
	ck_assert_ptr_nonnull(eager_arrives(b, &m[7], data, 64, true, &why));
	ck_assert_ptr_null(eager_arrives(b, &(struct xmeta){ .group = 2, .seq = 99 }, data, 64, true,
					 &why));
	ck_assert_str_eq(why, "is eager data beyond the credit (eager_max_bytes)");
	/* receives free their staged bytes; more than eager_max in one
	 * message is refused however much is free */
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[2], got, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[3], got, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(nb.nready, 4);
	ck_assert_ptr_null(xport_remote_data(b, 0, 1, 77, sizeof(big), true, &why));
	ck_assert_str_eq(why, "is eager data beyond the credit (eager_max_bytes)");
	/* a staged message and a receive of another size: the receive fails */
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[6], got, 32, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), -EMSGSIZE);
	ck_assert_msg(strstr(err, "size mismatch"), "%s", err);
	/* data that is not eager still needs its receive posted */
	ck_assert_ptr_null(xport_remote_data(b, 0, 1, 78, 64, false, &why));
	ck_assert_str_eq(why, "matches no posted receive");
	w = xport_remote_ready(a, 0, 1, xmeta_tag(&m[5]), sizeof(big));
	ck_assert(w == s[5] && !w->eager);
	xport_complete(w, 0);
	ck_assert_int_eq(xport_wait(s[5], soon, err, sizeof(err)), 0);
	/* m[7] stays staged and the RecvReady-less eager sends stay recorded:
	 * freeing the transports frees them (ASan/valgrind see no leak) */
	xport_free(a);
	xport_free(b);
}
END_TEST

/* ---- a send's buffer is the caller's again only when it is safe ---- */

/* Two hosts of one job as struct nets in this process (one device each),
 * over TLS on loopback, with link recovery and the given faults. */
struct duo {
	struct net *n[2];
	struct xport *x[2];
	struct fault_plan faults[2];
	int rc[2];
	char err[2][512];
	uint64_t handoff;      /* net_params.p2p_handoff_bytes of both hosts */
};

struct duo_start {
	struct duo *d;
	int h;
};

static void *duo_start_main(void *arg)
{
	struct duo_start *a = arg;
	a->d->rc[a->h] = net_start(a->d->n[a->h], a->d->err[a->h], sizeof(a->d->err[a->h]));
	return NULL;
}

static void duo_start(struct duo *d)
{
	static const int dev_host[2] = { 0, 1 };
	char certs[300], coord[64];
	snprintf(certs, sizeof(certs), "%s/certs", tmpdir);
	snprintf(coord, sizeof(coord), "127.0.0.1:%d", free_port());
	for (int h = 0; h < 2; h++) {
		struct net_params p = {
			.host_id = h, .num_hosts = 2, .devices_per_host = 1,
			.coordinator = coord, .listen = "127.0.0.1:0", .coord_fd = -1,
			.data_fd = -1, .certs_dir = certs, .heartbeat_interval_s = 0.2,
			.heartbeat_timeout_s = 20, .connect_timeout_s = 10, .done_timeout_s = 10,
			.max_frame_bytes = 64u << 20, .replay_buffer_bytes = 64u << 20,
			.reconnect_timeout_s = 20, .faults = &d->faults[h],
			.p2p_handoff_bytes = d->handoff,
		};
		int status;
		d->n[h] = net_new(&p, &status, d->err[h], sizeof(d->err[h]));
		ck_assert_msg(d->n[h], "host %d: %s", h, d->err[h]);
		d->x[h] = xport_new(h, 2, dev_host, net_xport_ops(), d->n[h]);
		ck_assert_ptr_nonnull(d->x[h]);
		xport_set_eager(d->x[h], 65536, 8 * 65536);
		xport_set_poll_spin(d->x[h], 200 * 1000);
		net_set_xport(d->n[h], d->x[h]);
	}
	pthread_t t[2];
	struct duo_start a[2] = { { d, 0 }, { d, 1 } };
	for (int h = 0; h < 2; h++)
		ck_assert_int_eq(pthread_create(&t[h], NULL, duo_start_main, &a[h]), 0);
	for (int h = 0; h < 2; h++)
		pthread_join(t[h], NULL);
	for (int h = 0; h < 2; h++)
		ck_assert_msg(d->rc[h] == NET_OK, "host %d: start: %s", h, d->err[h]);
}

static void *duo_finish_main(void *arg)
{
	struct duo_start *a = arg;
	a->d->rc[a->h] = net_finish(a->d->n[a->h], a->d->err[a->h], sizeof(a->d->err[a->h]));
	return NULL;
}

/* Both hosts finish (the Done exchange) at once, then go. */
static void duo_free(struct duo *d)
{
	pthread_t t[2];
	struct duo_start a[2] = { { d, 0 }, { d, 1 } };
	for (int h = 0; h < 2; h++)
		ck_assert_int_eq(pthread_create(&t[h], NULL, duo_finish_main, &a[h]), 0);
	for (int h = 0; h < 2; h++)
		pthread_join(t[h], NULL);
	for (int h = 0; h < 2; h++) {
		ck_assert_msg(d->rc[h] == NET_OK, "host %d: finish: %s", h, d->err[h]);
		net_free(d->n[h]);
		xport_free(d->x[h]);
	}
}

/* Resets (ss -K: an RST, unread bytes lost) every established TCP
 * connection this process has: the duo's one data link. The count. */
static int reset_own_connections(void)
{
	char cmd[160], line[1024];
	int n = 0;
	snprintf(cmd, sizeof(cmd), "ss -tnpH state established 2>/dev/null");
	FILE *f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	char pidpat[32];
	snprintf(pidpat, sizeof(pidpat), "pid=%d,", (int)getpid());
	int ports[16][2], np = 0;
	while (fgets(line, sizeof(line), f) && np < 16) {
		char a[128], b[128];
		if (!strstr(line, pidpat) || sscanf(line, "%*s %*s %127s %127s", a, b) != 2)
			continue;
		char *pa = strrchr(a, ':'), *pb = strrchr(b, ':');
		if (pa && pb) {
			ports[np][0] = atoi(pa + 1);
			ports[np][1] = atoi(pb + 1);
			np++;
		}
	}
	pclose(f);
	for (int i = 0; i < np; i++) {
		snprintf(cmd, sizeof(cmd), "ss -K -tnH state established '( sport = :%d and dport = :%d )'",
			 ports[i][0], ports[i][1]);
		f = popen(cmd, "r");
		ck_assert_ptr_nonnull(f);
		while (fgets(line, sizeof(line), f))
			n++;
		pclose(f);
	}
	return n;
}

/* Host 0 sends 256 KiB (four data frames) that host 1 does not read for
 * 3 s (a black hole on its side of the link); meanwhile the connection is
 * reset, so what was written but not read is lost and must be resent from
 * host 0's replay list, which keeps the caller's buffer by reference. The
 * send must not complete before host 1 acknowledged it: a send that
 * completed when its bytes were written would let the caller overwrite
 * the buffer (which this test does the moment the send completes) and the
 * resend would carry the new bytes. Host 1 must get the original ones.
 * Twice: the sending thread writes the big message itself (_i = 0), and
 * it hands it to the link's stream thread (_i = 1, p2p_handoff_bytes). */
START_TEST(test_send_buffer_across_reset)
{
	enum { BIG = 256 << 10, SMALL = 1024 };
	struct duo d = { .handoff = _i ? 64u << 10 : 0 };
	char err[512];
	/* host 1 holds reads and writes for 3 s from its second data frame */
	ck_assert_int_eq(fault_parse(&d.faults[1], "blackhole:link=1-0:frame=2:s=3", 2, err,
				     sizeof(err)), 0);
	duo_start(&d);
	uint8_t *big = malloc(BIG), *got = calloc(1, BIG), small[2][SMALL], in[2][SMALL];
	ck_assert(big && got);
	for (size_t i = 0; i < BIG; i++)
		big[i] = (uint8_t)(i * 131 + 7);
	memset(small, 0x5a, sizeof(small));
	struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = 3 };
	struct xreq *r_big, *s_big, *s_small[2], *r_small[2];
	uint64_t long_ = xport_now_ns() + 30ull * 1000 * 1000 * 1000;

	/* host 1: the receive (its RecvReady rides on the first small send),
	 * then the second small send, at which its link goes silent */
	m.chunk = 0;
	ck_assert_int_eq(xport_irecv(d.x[1], 0, 1, &m, got, BIG, &r_big), 0);
	for (int k = 0; k < 2; k++) {
		m.chunk = 1 + (uint32_t)k;
		ck_assert_int_eq(xport_irecv(d.x[0], 1, 0, &m, in[k], SMALL, &r_small[k]), 0);
		ck_assert_int_eq(xport_isend(d.x[1], 1, 0, &m, small[k], SMALL, &s_small[k]), 0);
	}
	/* host 0: the first small message brings the RecvReady; the big send
	 * then goes out into the socket, which host 1 does not read */
	ck_assert_msg(xport_wait(r_small[0], long_, err, sizeof(err)) == 0, "%s", err);
	m.chunk = 0;
	ck_assert_int_eq(xport_isend(d.x[0], 0, 1, &m, big, BIG, &s_big), 0);
	bool done = false;
	for (double end = now_s() + 1.0; now_s() < end && !done;) {
		int rc = xport_wait(s_big, 0, err, sizeof(err));
		if (rc != -EAGAIN) {
			ck_assert_msg(rc == 0, "%s", err);
			done = true;
			memset(big, 0xee, BIG);       /* the caller's buffer again */
		}
		usleep(1000);
	}
	ck_assert_msg(reset_own_connections() >= 1, "no connection to reset");
	/* the hole ends, host 0 redials, the link resumes and resends */
	ck_assert_msg(xport_wait(r_big, long_, err, sizeof(err)) == 0, "%s", err);
	if (!done) {
		ck_assert_msg(xport_wait(s_big, long_, err, sizeof(err)) == 0, "%s", err);
		memset(big, 0xee, BIG);
	}
	for (size_t i = 0; i < BIG; i++)
		ck_assert_msg(got[i] == (uint8_t)(i * 131 + 7), "byte %zu is 0x%02x", i, got[i]);
	/* kept by reference: not complete before host 1 had it (a copy
	 * would have been allowed to complete, and is not how it is kept) */
	ck_assert_msg(!done, "the send completed before host 1 read a byte of it");
	ck_assert_msg(net_reconnects(d.n[0]) + net_reconnects(d.n[1]) >= 1, "the link never broke");
	/* the big send went the way this pass meant (the small ones never
	 * reach the hand-off's size) */
	ck_assert_uint_eq(net_handoffs(d.n[0]), _i ? 1 : 0);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(xport_wait(s_small[k], long_, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(xport_wait(r_small[1], long_, err, sizeof(err)) == 0, "%s", err);
	ck_assert_mem_eq(in[0], small[0], SMALL);
	ck_assert_mem_eq(in[1], small[1], SMALL);
	duo_free(&d);
	free(big);
	free(got);
}
END_TEST

/* ---- a lingering link is read again without the net thread's tick ---- */

/* A device thread that polled a link for a request that completed leaves
 * it lingering: its socket unarmed, its stream thread to come back for it
 * after LINGER_NS (1 ms) if nobody polls again. The stream thread may
 * have been asleep with no timeout when the linger began (nothing else
 * lingered): then only stream_linger's timer brings it back, and without
 * it the net thread's tick (every 50 ms) ended the linger, and whatever
 * came on the link in between waited unread (fsdp 2x2's 15-50 ms gathers
 * at a step's start, 2026-11-30). Five polled receives on host 1, each
 * followed by 120 ms with nothing on the link (two ticks): no linger may
 * be left for the tick. A count, no clock: the stream thread would have
 * to go unscheduled for 49 ms to miss its timer. */
START_TEST(test_linger_ends_without_tick)
{
	enum { N = 4096 };
	struct duo d = { .handoff = 0 };
	char err[512];
	duo_start(&d);
	uint8_t out[N], in[N];
	memset(out, 0x3c, sizeof(out));
	struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = 3 };
	uint64_t long_ = xport_now_ns() + 30ull * 1000 * 1000 * 1000;
	for (int k = 0; k < 5; k++) {
		struct xreq *s, *r;
		m.chunk = (uint32_t)k;
		memset(in, 0, sizeof(in));
		ck_assert_int_eq(xport_irecv(d.x[1], 0, 1, &m, in, N, &r), 0);
		ck_assert_int_eq(xport_isend(d.x[0], 0, 1, &m, out, N, &s), 0);
		/* host 1's wait polls the link (poll_spin_us 200 ms) */
		ck_assert_msg(xport_wait(r, long_, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(xport_wait(s, long_, err, sizeof(err)) == 0, "%s", err);
		ck_assert_mem_eq(in, out, N);
		usleep(120 * 1000);
	}
	ck_assert_uint_eq(net_linger_lapses(d.n[1]), 0);
	duo_free(&d);
}
END_TEST

/* ---- a large exchange reads before it seals ---- */

struct fdx {
	struct duo *d;
	int h, rc;
	int base;                 /* rounds run before this batch */
	char err[512];
	uint8_t *out, *in;
};

enum { FDX_SEG = 1 << 20, FDX_SEGS = 8, FDX_ROUNDS = 3, FDX_BATCHES = 4 };

/* One host's side of a permute-like exchange: every receive posted, then
 * every send at once, then the waits, FDX_ROUNDS times. */
static void *fdx_main(void *arg)
{
	struct fdx *f = arg;
	int me = f->h, peer = 1 - f->h;
	struct xport *x = f->d->x[me];
	uint64_t long_ = xport_now_ns() + 30ull * 1000 * 1000 * 1000;
	for (int r = 0; r < FDX_ROUNDS && !f->rc; r++) {
		struct xreq *rr[FDX_SEGS], *ss[FDX_SEGS];
		struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_PERMUTE, .group = 7,
				   .seq = (uint64_t)(f->base + r) + 1 };
		for (int k = 0; k < FDX_SEGS; k++) {
			m.chunk = (uint32_t)k;
			ck_assert_int_eq(xport_irecv(x, peer, me, &m, f->in + (size_t)k * FDX_SEG,
						     FDX_SEG, &rr[k]), 0);
		}
		for (int k = 0; k < FDX_SEGS; k++) {
			m.chunk = (uint32_t)k;
			ck_assert_int_eq(xport_isend(x, me, peer, &m, f->out + (size_t)k * FDX_SEG,
						     FDX_SEG, &ss[k]), 0);
		}
		for (int k = 0; k < FDX_SEGS && !f->rc; k++) {
			f->rc = xport_wait(rr[k], long_, f->err, sizeof(f->err));
			if (!f->rc)
				f->rc = xport_wait(ss[k], long_, f->err, sizeof(f->err));
		}
	}
	return NULL;
}

/* Both hosts post 8 MiB of sends at once while 8 MiB comes the other
 * way, as a 16 MiB permute does. A device thread about to seal a large
 * send reads what the peer sent first (recv_before_send), and its poll
 * while it waits reads before it writes a turn (recv_poll); before,
 * each host sealed its whole window while the other's bytes waited in
 * its socket, and the socket copies found them cold. Counts, no clock:
 * batches of 3 rounds of 8 posts a host, each with the peer's bytes on
 * their way, until a count moves (whether the peer's bytes are there yet
 * is the scheduler's: one batch missed about one run in fifteen, so up
 * to four are run); MESHRUN_POLL_ORDER=write (the old order) gives 0 and
 * 0 in every batch. */
START_TEST(test_exchange_reads_first)
{
	struct duo d = { .handoff = 0 };
	duo_start(&d);
	struct fdx f[2];
	pthread_t t[2];
	for (int h = 0; h < 2; h++) {
		f[h] = (struct fdx){ .d = &d, .h = h };
		f[h].out = malloc((size_t)FDX_SEGS * FDX_SEG);
		f[h].in = calloc(FDX_SEGS, FDX_SEG);
		ck_assert(f[h].out && f[h].in);
		for (size_t i = 0; i < (size_t)FDX_SEGS * FDX_SEG; i++)
			f[h].out[i] = (uint8_t)(i * 7 + (size_t)h * 101);
	}
	uint64_t rb = 0, pr = 0;
	for (int b = 0; b < FDX_BATCHES && !rb && !pr; b++) {
		for (int h = 0; h < 2; h++) {
			f[h].base = b * FDX_ROUNDS;
			memset(f[h].in, 0, (size_t)FDX_SEGS * FDX_SEG);
			ck_assert_int_eq(pthread_create(&t[h], NULL, fdx_main, &f[h]), 0);
		}
		for (int h = 0; h < 2; h++)
			pthread_join(t[h], NULL);
		for (int h = 0; h < 2; h++) {
			ck_assert_msg(f[h].rc == 0, "host %d: %s", h, f[h].err);
			ck_assert_mem_eq(f[h].in, f[1 - h].out, (size_t)FDX_SEGS * FDX_SEG);
		}
		rb = net_reads_before_send(d.n[0]) + net_reads_before_send(d.n[1]);
		pr = net_polls_read_first(d.n[0]) + net_polls_read_first(d.n[1]);
	}
	/* which of the two reads first varies run to run (rb 0 and pr 31-76,
	 * or rb 2-12 MB and pr 1-5), so their sum is what must not be 0 */
	ck_assert_msg(rb > 0 || pr > 0, "no send or poll read the peer's bytes before it wrote: "
		      "%llu bytes, %llu polls", (unsigned long long)rb, (unsigned long long)pr);
	duo_free(&d);
	for (int h = 0; h < 2; h++) {
		free(f[h].out);
		free(f[h].in);
	}
}
END_TEST

/* ---- idle: no busy loop outlives a bounded spin ---- */

/* CPU time (ns) every thread of process pid has used so far, from
 * /proc/PID/task/ * /schedstat. */
static uint64_t proc_cpu_ns(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	uint64_t sum = 0;
	ck_assert_msg(d, "no %s", path);
	for (struct dirent *e; (e = readdir(d));) {
		char p2[400];
		unsigned long long ns;
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		snprintf(p2, sizeof(p2), "%s/%s/schedstat", path, e->d_name);
		FILE *f = fopen(p2, "r");
		if (f && fscanf(f, "%llu", &ns) == 1)
			sum += ns;
		if (f)
			fclose(f);
	}
	closedir(d);
	return sum;
}

struct waiter {
	struct xreq *r;
	int rc;
	char err[512];
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	w->rc = xport_wait(w->r, xport_now_ns() + 30ull * 1000 * 1000 * 1000, w->err, sizeof(w->err));
	return NULL;
}

/* A device thread waits 2 s for a message that has not been sent (its
 * poll_spin_us is 200): after its spin it sleeps, and the whole process
 * (both hosts' net, stream and device threads) uses under 1% of a CPU
 * meanwhile; the message then arrives whole. */
START_TEST(test_idle_waiter)
{
	struct duo d = { 0 };
	char err[512];
	duo_start(&d);
	uint8_t out[4096], in[4096];
	memset(out, 0x3c, sizeof(out));
	struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = 5 };
	struct waiter w = { 0 };
	struct xreq *s;
	ck_assert_int_eq(xport_irecv(d.x[1], 0, 1, &m, in, sizeof(in), &w.r), 0);
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, waiter_main, &w), 0);
	usleep(300 * 1000);                   /* past the spin and the linger */
	uint64_t c0 = proc_cpu_ns(getpid()), t0 = xport_now_ns();
	usleep(2000 * 1000);
	uint64_t c1 = proc_cpu_ns(getpid()), t1 = xport_now_ns();
	double share = (double)(c1 - c0) / (double)(t1 - t0);
	ck_assert_int_eq(xport_isend(d.x[0], 0, 1, &m, out, sizeof(out), &s), 0);
	pthread_join(t, NULL);
	ck_assert_msg(w.rc == 0, "%s", w.err);
	ck_assert_msg(xport_wait(s, xport_now_ns() + 10ull * 1000 * 1000 * 1000, err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert_mem_eq(in, out, sizeof(in));
	ck_assert_msg(share < 0.01, "waiting used %.2f%% of a CPU", share * 100);
	duo_free(&d);
}
END_TEST

/* Two agents that ran a pingpong and now hold (as between steps): each
 * uses under 1% of a CPU over 2 s, by /proc. */
START_TEST(test_idle_agents)
{
	struct proc p;
	char *argv[] = { (char *)meshrun_path(), "local", "--hosts", "2", "--job=pingpong",
			 "--rounds=4", "--size=1M", "--hold-s=4", NULL };
	proc_start(&p, "idle", argv, -1);
	ck_assert_msg(proc_wait_output(&p, "pingpong: 2 hosts", 60), "no pingpong:\n%s",
		      slurp(p.err));
	usleep(300 * 1000);
	pid_t a[2] = { agent_of(p.pid, 0), agent_of(p.pid, 1) };
	ck_assert_msg(a[0] > 0 && a[1] > 0, "agents not found");
	uint64_t c0[2], t0 = xport_now_ns();
	for (int h = 0; h < 2; h++)
		c0[h] = proc_cpu_ns(a[h]);
	usleep(2000 * 1000);
	uint64_t t1 = xport_now_ns();
	for (int h = 0; h < 2; h++) {
		double share = (double)(proc_cpu_ns(a[h]) - c0[h]) / (double)(t1 - t0);
		ck_assert_msg(share < 0.01, "idle agent of host %d used %.2f%% of a CPU", h,
			      share * 100);
	}
	ck_assert_int_eq(proc_wait(&p, 30), 0);
}
END_TEST

static void setup_certs(void)
{
	proc_setup("check_xport", 2);
}

static Suite *xport_suite(void)
{
	Suite *s = suite_create("xport");
	TCase *tc = tcase_create("xport");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_xport_recv_add);
	tcase_add_test(tc, test_xport_eager);
	tcase_add_test(tc, test_xport_spin_on_free_cores);
	tcase_add_test(tc, test_xport_look_after_busy_yield);
	tcase_add_test(tc, test_xport_wake_held);
	suite_add_tcase(s, tc);

	tc = tcase_create("replay");
	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup_certs, teardown);
	tcase_add_loop_test(tc, test_send_buffer_across_reset, 0, 2);
	tcase_add_test(tc, test_linger_ends_without_tick);
	tcase_add_test(tc, test_exchange_reads_first);
	suite_add_tcase(s, tc);

	tc = tcase_create("idle");
	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup_certs, teardown);
	tcase_add_test(tc, test_idle_waiter);
	tcase_add_test(tc, test_idle_agents);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(xport_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
