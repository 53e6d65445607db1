/* A fake peer host for suites that talk to real agents: blocking-style
 * TLS over a non-blocking connection (poll on c->want), whole frames sent
 * and received, every failure a test failure naming what was awaited.
 * Header-only, static functions, like tests/proc.h (which it needs for
 * now_s and slurp). */
#ifndef MESHRUN_TESTS_FAKE_PEER_H
#define MESHRUN_TESTS_FAKE_PEER_H

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "net/conn.h"
#include "net/frame.h"
#include "net/tls_conn.h"
#include "tests/proc.h"

/* Bytes read but not yet decoded into a frame. */
struct fake_rx {
	uint8_t buf[1 << 16];
	size_t len;
};

static void fake_poll(struct conn *c, double end, const char *what)
{
	ck_assert_msg(now_s() < end, "fake peer: timed out in %s", what);
	struct pollfd p = { .fd = c->fd, .events = c->want == CONN_WANT_WRITE ? POLLOUT : POLLIN };
	poll(&p, 1, 50);
}

static void fake_handshake(struct conn *c, struct proc *agent)
{
	double end = now_s() + 10;
	int rc;
	while ((rc = conn_handshake(c)) == -EAGAIN)
		fake_poll(c, end, "the handshake");
	ck_assert_msg(rc == 0, "fake peer: handshake: %s\nagent:\n%s", c->err, slurp(agent->err));
}

static void fake_send(struct conn *c, Meshrun__Frame *f)
{
	static uint8_t buf[4096];
	double end = now_s() + 10;
	size_t n = frame_encode(f, 0, buf), off = 0;
	ck_assert_uint_gt(n, 0);
	while (off < n) {
		ssize_t w = conn_write(c, buf + off, n - off);
		if (w == -EAGAIN) {
			fake_poll(c, end, "a write");
			continue;
		}
		ck_assert_msg(w > 0, "fake peer: write: %s", c->err);
		off += (size_t)w;
	}
	while (conn_flush(c) == -EAGAIN)
		fake_poll(c, end, "a flush");
}

/* The next whole frame on c, or NULL if none arrives before end (only when
 * may_time_out; otherwise that fails the test). */
static Meshrun__Frame *fake_recv(struct conn *c, struct fake_rx *rx, double end, bool may_time_out)
{
	const struct frame_limits lim = { .max_payload = 1 << 20 };
	for (;;) {
		Meshrun__Frame *f;
		const uint8_t *pay;
		uint64_t plen;
		size_t used;
		char why[200];
		int rc = frame_decode(rx->buf, rx->len, &lim, &f, &pay, &plen, &used, why, sizeof(why));
		if (rc == 0) {
			memmove(rx->buf, rx->buf + used, rx->len - used);
			rx->len -= used;
			return f;
		}
		ck_assert_msg(rc == -EAGAIN, "fake peer: bad frame from the agent: %s", why);
		ck_assert_uint_lt(rx->len, sizeof(rx->buf));
		ssize_t r = conn_read(c, rx->buf + rx->len, sizeof(rx->buf) - rx->len);
		if (r == -EAGAIN) {
			if (may_time_out && now_s() >= end)
				return NULL;
			fake_poll(c, end, "a read");
			continue;
		}
		ck_assert_msg(r > 0, "fake peer: read: %s", r ? c->err : "closed by the agent");
		rx->len += (size_t)r;
	}
}

/* The next frame of kind body, skipping heartbeats, acks and receive posts. */
static Meshrun__Frame *fake_expect(struct conn *c, struct fake_rx *rx, int body)
{
	double end = now_s() + 10;
	for (;;) {
		Meshrun__Frame *f = fake_recv(c, rx, end, false);
		if ((int)f->body_case == body)
			return f;
		ck_assert_msg(f->body_case == MESHRUN__FRAME__BODY_HEARTBEAT ||
			      f->body_case == MESHRUN__FRAME__BODY_ACK ||
			      f->body_case == MESHRUN__FRAME__BODY_RECV_READY,
			      "fake peer: unexpected %s frame", frame_body_name(f->body_case));
		frame_header_free(f);
	}
}

/* As host 0, the coordinator of a 2-host job: accepts host 1's agent a on
 * the listener lfd (closed here), takes its Hello and answers a Topology
 * carrying job_id and the agent's own data address, which lands in
 * data_addr. Returns the rendezvous connection. */
static struct conn *fake_rendezvous(int lfd, SSL_CTX *ctx, struct proc *a, struct fake_rx *rx,
				    uint64_t job_id, char *data_addr, size_t len)
{
	int fd = -EAGAIN;
	for (double end = now_s() + 10; fd == -EAGAIN && now_s() < end;) {
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		poll(&p, 1, 50);
		fd = conn_accept(lfd, NULL, 0);
	}
	ck_assert_msg(fd >= 0, "the agent never dialled the coordinator:\n%s", slurp(a->err));
	close(lfd);
	struct conn *cc = tls_conn_new(ctx, fd, true);
	ck_assert_ptr_nonnull(cc);
	fake_handshake(cc, a);
	Meshrun__Frame *f = fake_expect(cc, rx, MESHRUN__FRAME__BODY_HELLO);
	snprintf(data_addr, len, "%s", f->hello->data_address);
	uint32_t devices = f->hello->devices;
	frame_header_free(f);

	Meshrun__HostInfo h0 = MESHRUN__HOST_INFO__INIT, h1 = MESHRUN__HOST_INFO__INIT;
	Meshrun__HostInfo *hosts[2] = { &h0, &h1 };
	Meshrun__Topology t = MESHRUN__TOPOLOGY__INIT;
	Meshrun__Frame tf = MESHRUN__FRAME__INIT;
	h0.host_id = 0;
	h0.data_address = "127.0.0.1:9";
	h0.devices = devices;
	h1.host_id = 1;
	h1.data_address = data_addr;
	h1.devices = devices;
	t.n_hosts = 2;
	t.hosts = hosts;
	t.job_id = job_id;
	tf.link_seq = 1;
	tf.body_case = MESHRUN__FRAME__BODY_TOPOLOGY;
	tf.topology = &t;
	fake_send(cc, &tf);
	return cc;
}

/* As host 0: dials the agent's link listener at data_addr and finishes
 * TLS on it (rx starts empty). Returns the link's connection. */
static struct conn *fake_dial_link(SSL_CTX *ctx, const char *data_addr, struct proc *a,
				   struct fake_rx *rx)
{
	char err[256];
	int fd = conn_connect_start(data_addr, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	struct conn *c = tls_conn_new(ctx, fd, false);
	ck_assert_ptr_nonnull(c);
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	ck_assert_int_eq(poll(&p, 1, 10000), 1);
	ck_assert_int_eq(conn_connect_result(fd), 0);
	rx->len = 0;
	fake_handshake(c, a);
	return c;
}

#endif
