/* Agents end to end over loopback (build/meshrun, or $MESHRUN): 2- and
 * 3-host pingpong jobs (several devices per host, messages split into many
 * frames) complete and check every byte; a SIGKILLed or SIGSTOPped agent
 * makes every other agent exit with EXIT_PEER_LOST within
 * heartbeat_timeout_s + 2 s, naming the lost host; config errors (unknown
 * key, wrong type, a mesh that does not multiply to hosts x devices) exit
 * with EXIT_CONFIG and a message naming the key. A fake host 0 that pours
 * a stream of frames into a real agent faster than it can read them still
 * gets that agent's heartbeats during the stream (read fairness).
 * In-process, two struct net on loopback: every frame passes the fault
 * point both ways, and a link closed there at frame k ends both hosts
 * with NET_ERR_PEER_LOST naming the other. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/cli.h"
#include "net/conn.h"
#include "net/frame.h"
#include "net/net.h"
#include "net/tls.h"
#include "net/tls_conn.h"

#include "tests/proc.h"
#include "tests/fake_peer.h"

static void setup(void)
{
	proc_setup("check_agent", 4);
}

static char certs_kv[128], coord_kv[64];

/* A long pingpong agent of a cluster of `hosts` with a 2 s heartbeat
 * timeout. */
static void long_agent(struct proc *p, const char *name, int host, int hosts, int port)
{
	char hid[32], nh[32];
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s/certs", tmpdir);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	snprintf(hid, sizeof(hid), "--host-id=%d", host);
	snprintf(nh, sizeof(nh), "--hosts=%d", hosts);
	/* messages of 16 frames, so failures often land mid-message */
	proc_meshrun(p, name, "agent", hid, nh, "--listen=127.0.0.1:0", "--job=pingpong",
		    "--rounds=100000000", "--size=1M", certs_kv, coord_kv,
		    "max_frame_bytes=65536", "segment_bytes=4096",
		    "heartbeat_interval_s=0.25", "heartbeat_timeout_s=2", "connect_timeout_s=10",
		    (char *)NULL);
}

START_TEST(test_pingpong_2_hosts)
{
	struct proc p;
	proc_meshrun(&p, "local", "local", "--hosts", "2", "--job", "pingpong", "--rounds", "20",
		    "--size", "1M", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, "pingpong: 2 hosts x 1 devices, 20 rounds of 1048576 bytes: ok");
}
END_TEST

START_TEST(test_pingpong_3_hosts_fragments)
{
	struct proc p;
	/* 1000003-byte messages in frames of at most 64 KiB, two devices a host */
	proc_meshrun(&p, "local", "local", "--hosts", "3", "--devices-per-host", "2", "--job",
		    "pingpong", "--rounds", "10", "--size", "1000003", "max_frame_bytes=65536",
		    "segment_bytes=4096", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, "pingpong: 3 hosts x 2 devices, 10 rounds of 1000003 bytes: ok");
}
END_TEST

START_TEST(test_pingpong_small_and_empty)
{
	struct proc a, b;
	proc_meshrun(&a, "empty", "local", "--hosts", "3", "--job", "pingpong", "--rounds", "30",
		    "--size", "0", (char *)NULL);
	proc_meshrun(&b, "small", "local", "--hosts", "2", "--devices-per-host", "3", "--job",
		    "pingpong", "--rounds", "100", "--size", "13", (char *)NULL);
	ck_assert_int_eq(proc_wait(&a, 60), 0);
	ck_assert_int_eq(proc_wait(&b, 60), 0);
	ck_assert_file_has(a.out, "30 rounds of 0 bytes: ok");
	ck_assert_file_has(b.out, "2 hosts x 3 devices, 100 rounds of 13 bytes: ok");
}
END_TEST

/* Starts three long agents and waits until their job runs. */
static void start_three(struct proc h[3], int port)
{
	long_agent(&h[0], "h0", 0, 3, port);
	long_agent(&h[1], "h1", 1, 3, port);
	long_agent(&h[2], "h2", 2, 3, port);
	ck_assert_msg(wait_listening(port, 10), "coordinator never listened");
	usleep(1000000);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(proc_wait(&h[i], 0) == -1, "host %d ended early:\n%s", i, slurp(h[i].err));
}

START_TEST(test_sigkill_peer)
{
	struct proc h[3];
	int port = free_port();
	start_three(h, port);
	kill(h[2].pid, SIGKILL);
	double t0 = now_s();
	ck_assert_int_eq(proc_wait(&h[0], 4.0), EXIT_PEER_LOST);
	ck_assert_int_eq(proc_wait(&h[1], 4.0 - (now_s() - t0)), EXIT_PEER_LOST);
	ck_assert_double_le(now_s() - t0, 4.0);
	ck_assert_file_has(h[0].err, "lost host 2 (127.0.0.1:");
	ck_assert_file_has(h[1].err, "lost host 2 (127.0.0.1:");
	ck_assert_file_has(h[1].err, "meshrun: host 1: ");
	/* the failure is the last line (earlier ones log our port probe) */
	char *e = slurp(h[0].err), *last = e;
	for (char *q = e; *q; q++)
		if (*q == '\n' && q[1])
			last = q + 1;
	ck_assert_msg(!strncmp(last, "meshrun: host 0: ", 17) && strstr(last, "lost host 2"),
		      "last line: %s", last);
}
END_TEST

START_TEST(test_sigstop_peer)
{
	struct proc h[3];
	int port = free_port();
	start_three(h, port);
	kill(h[1].pid, SIGSTOP);
	double t0 = now_s();
	ck_assert_int_eq(proc_wait(&h[0], 4.0), EXIT_PEER_LOST);
	ck_assert_int_eq(proc_wait(&h[2], 4.0 - (now_s() - t0)), EXIT_PEER_LOST);
	double dt = now_s() - t0;
	ck_assert_double_le(dt, 4.0);
	ck_assert_double_ge(dt, 1.5);   /* it was silence that was detected */
	ck_assert_file_has(h[0].err, "host 1 (127.0.0.1:");
	ck_assert_file_has(h[2].err, "host 1 (127.0.0.1:");
	ck_assert(file_has(h[0].err, "no heartbeat for") || file_has(h[2].err, "no heartbeat for"));
	kill(h[1].pid, SIGKILL);
}
END_TEST

/* A host whose job ends late is neither lost nor leaves the others with an
 * error: they wait for its Done while heartbeats go on. */
START_TEST(test_slow_finisher)
{
	struct proc h[3];
	int port = free_port();
	char hid[3][32];
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s/certs", tmpdir);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	double t0 = now_s();
	for (int i = 0; i < 3; i++) {
		snprintf(hid[i], sizeof(hid[i]), "--host-id=%d", i);
		proc_meshrun(&h[i], i == 0 ? "h0" : i == 1 ? "h1" : "h2", "agent", hid[i], "--hosts=3",
			    "--listen=127.0.0.1:0", "--job=pingpong", "--rounds=20", "--size=64K",
			    i == 2 ? "--hold-s=3" : "--hold-s=0", certs_kv, coord_kv,
			    "heartbeat_interval_s=0.2", "heartbeat_timeout_s=1", (char *)NULL);
	}
	for (int i = 0; i < 3; i++)
		ck_assert_msg(proc_wait(&h[i], 20) == 0, "host %d: %s", i, slurp(h[i].err));
	ck_assert_double_ge(now_s() - t0, 2.9);
	ck_assert_file_has(h[0].out, "pingpong: 3 hosts x 1 devices, 20 rounds of 65536 bytes: ok");
}
END_TEST

START_TEST(test_local_reports_failure)
{
	struct proc p;
	/* a config every agent would refuse: local refuses it itself, once,
	 * before starting any (it used to print each agent's refusal) */
	proc_meshrun(&p, "local", "local", "--hosts", "2", "--job", "pingpong",
		    "dcn_data_parallelism=3", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 30), EXIT_CONFIG);
	ck_assert_str_eq(slurp(p.err), "meshrun: local: config: dcn_* parallelism multiplies to 3 "
				       "hosts ('dcn_data_parallelism'=3), but the run has 2 hosts "
				       "(dcn_data_parallelism: command line)\n");
	/* a failure of the agents themselves: each is named, in either order */
	proc_meshrun(&p, "local2", "local", "--hosts", "2", "--config", "configs/llama-tiny.yml",
		    "steps=100", "per_device_batch_size=4", "--quiet", "--fault", "kill:host=1:step=2",
		    (char *)NULL);
	ck_assert_int_ne(proc_wait(&p, 30), 0);
	ck_assert_file_has(p.err, "meshrun: local: host 1 was killed by signal 9");
}
END_TEST

/* A link that receives without pause must still write: the agent (host 1)
 * gets a stream of heartbeat frames, TLS records encrypted in advance and
 * poured into the socket far faster than the agent can decrypt and parse
 * them, so its socket is never empty. A read loop that never returns to
 * the poll would send nothing until the stream ends (and, with a real
 * peer, be taken for dead); a fair one sends a heartbeat every tick. */
START_TEST(test_read_fairness)
{
	char certs[300], err[256], addr[128], hid[32];
	int port = free_port(), lfd;
	struct fake_rx *rx = calloc(1, sizeof(*rx));
	struct proc a;
	ck_assert_ptr_nonnull(rx);
	snprintf(certs, sizeof(certs), "%s/certs", tmpdir);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	ck_assert_msg(conn_listen(addr, &lfd, err, sizeof(err)) == 0, "%s", err);
	SSL_CTX *ctx = tls_ctx_new(certs, 0, err, sizeof(err));
	ck_assert_msg(ctx, "%s", err);

	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s/certs", tmpdir);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	snprintf(hid, sizeof(hid), "--host-id=1");
	proc_meshrun(&a, "agent", "agent", hid, "--hosts=2", "--listen=127.0.0.1:0", "--job=pingpong",
		    "--rounds=1", "--size=1K", certs_kv, coord_kv, "heartbeat_interval_s=0.05",
		    "heartbeat_timeout_s=60", "collective_timeout_s=60", "connect_timeout_s=20",
		    /* the fake peer is silent while it encrypts its stream (seconds
		     * on a loaded machine): not a half-open link */
		    "link_silence_s=59", (char *)NULL);

	/* rendezvous: the agent's Hello, our Topology (job 42) */
	char data_addr[128];
	struct conn *cc = fake_rendezvous(lfd, ctx, &a, rx, 42, data_addr, sizeof(data_addr));

	/* the link: host 0 dials, LinkHello both ways, Barrier both ways */
	struct conn *c = fake_dial_link(ctx, data_addr, &a, rx);
	int fd = c->fd;
	Meshrun__Frame *f;
	uint64_t seq = 0;
	Meshrun__Frame lf = MESHRUN__FRAME__INIT;
	Meshrun__LinkHello lh = MESHRUN__LINK_HELLO__INIT;
	lh.host_id = 0;
	lh.job_id = 42;
	lf.link_seq = ++seq;
	lf.body_case = MESHRUN__FRAME__BODY_LINK_HELLO;
	lf.link_hello = &lh;
	fake_send(c, &lf);
	frame_header_free(fake_expect(c, rx, MESHRUN__FRAME__BODY_LINK_HELLO));
	Meshrun__Frame bf = MESHRUN__FRAME__INIT;
	Meshrun__Barrier b = MESHRUN__BARRIER__INIT;
	b.seq = 1;
	bf.link_seq = ++seq;
	bf.body_case = MESHRUN__FRAME__BODY_BARRIER;
	bf.barrier = &b;
	fake_send(c, &bf);
	frame_header_free(fake_expect(c, rx, MESHRUN__FRAME__BODY_BARRIER));

	/* the stream: 4M heartbeat frames (~100 MB), encrypted into memory */
	enum { FRAMES = 4000000 };
	size_t cap = (size_t)FRAMES * 48, plen = 0;
	uint8_t *plain = malloc(cap);
	ck_assert_ptr_nonnull(plain);
	for (int i = 0; i < FRAMES; i++) {
		Meshrun__Frame hf = MESHRUN__FRAME__INIT;
		Meshrun__Heartbeat hb = MESHRUN__HEARTBEAT__INIT;
		hb.sent_ns = 1;
		hf.link_seq = ++seq;
		hf.body_case = MESHRUN__FRAME__BODY_HEARTBEAT;
		hf.heartbeat = &hb;
		ck_assert_uint_le(plen + frame_encoded_len(&hf), cap);
		plen += frame_encode(&hf, 0, plain + plen);
	}
	BIO *mem = BIO_new(BIO_s_mem());
	ck_assert_ptr_nonnull(mem);
	SSL *ssl = tls_conn_ssl(c);
	ck_assert_ptr_nonnull(ssl);
	SSL_set0_wbio(ssl, mem);        /* reads still come off the socket */
	for (size_t off = 0; off < plen;) {
		size_t w = 0;
		ck_assert_int_eq(SSL_write_ex(ssl, plain + off, plen - off, &w), 1);
		off += w;
	}
	free(plain);
	char *wire;
	long wlen = BIO_get_mem_data(mem, &wire);
	ck_assert_int_gt(wlen, (long)plen);

	/* pour it in; count the heartbeats the agent sent while it was busy
	 * reading (its clock is ours: CLOCK_MONOTONIC on one machine) */
	int beats = 0;
	uint64_t t0 = xport_now_ns(), t1 = 0;
	double end = now_s() + 60;
	for (long off = 0; off < wlen || !t1 || xport_now_ns() < t1 + 200000000ull;) {
		ck_assert_msg(now_s() < end, "the agent read only %ld of %ld bytes in 60 s", off, wlen);
		struct pollfd p = { .fd = fd, .events = off < wlen ? POLLIN | POLLOUT : POLLIN };
		poll(&p, 1, 50);
		if (p.revents & POLLOUT) {
			ssize_t n = send(fd, wire + off, (size_t)(wlen - off), MSG_NOSIGNAL);
			ck_assert_msg(n > 0 || errno == EAGAIN, "send: %s", strerror(errno));
			if (n > 0)
				off += n;
			if (off == wlen)
				t1 = xport_now_ns();
		}
		if (p.revents & POLLIN)
			while ((f = fake_recv(c, rx, 0, true))) {
				beats += f->body_case == MESHRUN__FRAME__BODY_HEARTBEAT &&
					 f->heartbeat->sent_ns > t0 && (!t1 || f->heartbeat->sent_ns < t1);
				frame_header_free(f);
			}
	}
	double dt = (double)(t1 - t0) / 1e9;
	ck_assert_msg(proc_wait(&a, 0) == -1, "the agent ended during the stream:\n%s", slurp(a.err));
	/* ticks are 50 ms apart and a read turn is at most READ_BUDGET (8 MiB,
	 * tens of ms here); a read loop that never yields sends none at all */
	ck_assert_msg(dt >= 0.3, "the stream took only %.2f s: too short to tell", dt);
	ck_assert_msg(beats >= 3, "%d heartbeats from the agent during a %.2f s stream", beats, dt);
	conn_free(c);
	conn_free(cc);
	SSL_CTX_free(ctx);
	free(rx);
}
END_TEST

/* ---- two nets in one process: the fault point ---- */

/* Where a test's net_params.fault closes a link, and what it saw. */
struct fault_plan {
	int peer;                      /* the link to this host... */
	bool outgoing;                 /* ...sending (or receiving)... */
	uint64_t at;                   /* ...its frame of this index; UINT64_MAX: never */
	_Atomic int closes;            /* CLOSE returned */
	_Atomic int body;              /* body of the frame closed */
	_Atomic int chunks[2];         /* data frames seen: [0] received, [1] sent */
};

static int fault_plan_cb(void *ctx, int peer, bool outgoing, uint64_t frame_index,
			 const Meshrun__Frame *f)
{
	struct fault_plan *p = ctx;
	if (f->body_case == MESHRUN__FRAME__BODY_CHUNK)
		atomic_fetch_add(&p->chunks[outgoing], 1);
	if (peer != p->peer || outgoing != p->outgoing || frame_index != p->at)
		return LINK_FAULT_PASS;
	atomic_fetch_add(&p->closes, 1);
	atomic_store(&p->body, (int)f->body_case);
	return LINK_FAULT_CLOSE;
}

/* Host 0 and host 1 of one job, each a struct net with its xport (one
 * device each), on loopback with the suite's certificates. */
struct two_nets {
	struct net *n[2];
	struct xport *x[2];
	struct fault_plan plan[2];
	int rc[2];
	char err[2][512];
};

struct net_call {
	struct two_nets *t;
	int host;
	bool finish;
};

static void *net_call_main(void *arg)
{
	struct net_call *c = arg;
	struct two_nets *t = c->t;
	int h = c->host;
	t->rc[h] = c->finish ? net_finish(t->n[h], t->err[h], sizeof(t->err[h]))
			     : net_start(t->n[h], t->err[h], sizeof(t->err[h]));
	return NULL;
}

/* net_start (or net_finish) on both hosts at once: each blocks until the
 * other answers. */
static void two_nets_call(struct two_nets *t, bool finish)
{
	pthread_t th[2];
	struct net_call c[2] = { { t, 0, finish }, { t, 1, finish } };
	for (int h = 0; h < 2; h++)
		ck_assert_int_eq(pthread_create(&th[h], NULL, net_call_main, &c[h]), 0);
	for (int h = 0; h < 2; h++)
		pthread_join(th[h], NULL);
}

static void two_nets_start(struct two_nets *t)
{
	char certs[300], coord[64];
	static const int dev_host[2] = { 0, 1 };
	int port = free_port();
	snprintf(certs, sizeof(certs), "%s/certs", tmpdir);
	snprintf(coord, sizeof(coord), "127.0.0.1:%d", port);
	for (int h = 0; h < 2; h++) {
		struct net_params p = {
			.host_id = h, .num_hosts = 2, .devices_per_host = 1,
			.coordinator = coord, .listen = "127.0.0.1:0",
			.coord_fd = -1, .data_fd = -1, .certs_dir = certs,
			.heartbeat_interval_s = 0.1, .heartbeat_timeout_s = 5,
			.connect_timeout_s = 10, .done_timeout_s = 10,
			.max_frame_bytes = 65536,   /* 1 MiB goes as 16 data frames */
			.fault = fault_plan_cb, .fault_ctx = &t->plan[h],
		};
		int status;
		t->n[h] = net_new(&p, &status, t->err[h], sizeof(t->err[h]));
		ck_assert_msg(t->n[h], "host %d: %s", h, t->err[h]);
		t->x[h] = xport_new(h, 2, dev_host, net_xport_ops(), t->n[h]);
		ck_assert_ptr_nonnull(t->x[h]);
		net_set_xport(t->n[h], t->x[h]);
	}
	two_nets_call(t, false);
	for (int h = 0; h < 2; h++)
		ck_assert_msg(t->rc[h] == NET_OK, "host %d: start: %s", h, t->err[h]);
}

static void two_nets_free(struct two_nets *t)
{
	for (int h = 0; h < 2; h++) {
		net_free(t->n[h]);
		xport_free(t->x[h]);
	}
}

/* 1 MiB from device 0 to device 1 and back at once; 0 or the first
 * failure's code with err. */
static int exchange(struct two_nets *t, uint8_t *buf[4], char *err, size_t errlen)
{
	struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = 1 };
	struct xreq *r[4];
	size_t len = 1 << 20;
	ck_assert_int_eq(xport_irecv(t->x[1], 0, 1, &m, buf[1], len, &r[0]), 0);
	ck_assert_int_eq(xport_irecv(t->x[0], 1, 0, &m, buf[3], len, &r[1]), 0);
	ck_assert_int_eq(xport_isend(t->x[0], 0, 1, &m, buf[0], len, &r[2]), 0);
	ck_assert_int_eq(xport_isend(t->x[1], 1, 0, &m, buf[2], len, &r[3]), 0);
	uint64_t deadline = xport_now_ns() + 10ull * 1000 * 1000 * 1000;
	int first = 0;
	for (int i = 0; i < 4; i++) {
		char why[512];
		int rc = xport_wait(r[i], deadline, why, sizeof(why));
		if (rc && !first) {
			first = rc;
			snprintf(err, errlen, "%s", why);
		}
	}
	return first;
}

static uint8_t *pattern(size_t len, unsigned seed)
{
	uint8_t *b = malloc(len);
	ck_assert_ptr_nonnull(b);
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)(i * 31 + seed);
	return b;
}

/* Every frame passes the fault point, both ways: with a callback that
 * never closes, the data arrives, each side counts the 16 data frames it
 * sent and the 16 it received, and the job ends cleanly. */
START_TEST(test_fault_pass)
{
	struct two_nets t = { 0 };
	char err[512];
	uint8_t *buf[4] = { pattern(1 << 20, 1), calloc(1, 1 << 20), pattern(1 << 20, 2),
			    calloc(1, 1 << 20) };
	for (int h = 0; h < 2; h++)
		t.plan[h] = (struct fault_plan){ .peer = 1 - h, .at = UINT64_MAX };
	two_nets_start(&t);
	ck_assert_msg(exchange(&t, buf, err, sizeof(err)) == 0, "%s", err);
	ck_assert_mem_eq(buf[1], buf[0], 1 << 20);
	ck_assert_mem_eq(buf[3], buf[2], 1 << 20);
	for (int h = 0; h < 2; h++) {
		ck_assert_int_eq(atomic_load(&t.plan[h].chunks[1]), 16);
		ck_assert_int_eq(atomic_load(&t.plan[h].chunks[0]), 16);
		ck_assert_int_eq(atomic_load(&t.plan[h].closes), 0);
	}
	two_nets_call(&t, true);
	for (int h = 0; h < 2; h++)
		ck_assert_msg(t.rc[h] == NET_OK, "host %d: finish: %s", h, t.err[h]);
	two_nets_free(&t);
	for (int i = 0; i < 4; i++)
		free(buf[i]);
}
END_TEST

/* CLOSE at frame k, sent by one host (loop 0) or received by the other
 * (loop 1): the link fails as on a read error, and both hosts end with
 * the peer-lost class naming the other host. */
START_TEST(test_fault_close)
{
	struct two_nets t = { 0 };
	char err[512], want[2][64];
	uint8_t *buf[4] = { pattern(1 << 20, 1), calloc(1, 1 << 20), pattern(1 << 20, 2),
			    calloc(1, 1 << 20) };
	int faulty = _i == 0 ? 1 : 0;     /* the host whose link closes */
	const uint64_t k = 5;             /* past the hellos and the barrier */
	for (int h = 0; h < 2; h++)
		t.plan[h] = (struct fault_plan){ .peer = 1 - h, .at = UINT64_MAX };
	t.plan[faulty].outgoing = _i == 0;
	t.plan[faulty].at = k;
	two_nets_start(&t);
	ck_assert_int_ne(exchange(&t, buf, err, sizeof(err)), 0);
	ck_assert_int_eq(atomic_load(&t.plan[faulty].closes), 1);
	for (int h = 0; h < 2; h++) {
		char why[512] = "";
		snprintf(want[h], sizeof(want[h]), "lost host %d (127.0.0.1:", 1 - h);
		/* the other side learns from its own read: allow it a moment */
		for (double end = now_s() + 5; !net_failed(t.n[h], NULL, 0) && now_s() < end;)
			usleep(10000);
		int st = net_failed(t.n[h], why, sizeof(why));
		ck_assert_msg(st == NET_ERR_PEER_LOST, "host %d: status %d: %s", h, st, why);
		ck_assert_msg(strstr(why, want[h]), "host %d: %s", h, why);
		if (h == faulty) {
			char at[80];
			snprintf(at, sizeof(at), "closed by an injected fault at %s frame %llu",
				 _i == 0 ? "sent" : "received", (unsigned long long)k);
			ck_assert_msg(strstr(why, at), "host %d: %s", h, why);
		}
	}
	two_nets_free(&t);
	for (int i = 0; i < 4; i++)
		free(buf[i]);
}
END_TEST

START_TEST(test_config_errors)
{
	struct proc a, b, c, d, e, f;
	char yml[128], cfgarg[160];
	snprintf(yml, sizeof(yml), "%s/bad.yml", tmpdir);
	FILE *y = fopen(yml, "w");
	ck_assert_ptr_nonnull(y);
	fprintf(y, "steps: 3\nno_such_key: 4\n");
	fclose(y);
	snprintf(cfgarg, sizeof(cfgarg), "--config=%s", yml);

	proc_meshrun(&a, "unknown", "agent", "--hosts=1", "--job=pingpong", "bogus_key=1", (char *)NULL);
	proc_meshrun(&b, "type", "agent", "--hosts=1", "--job=pingpong", "heartbeat_timeout_s=soon",
		    (char *)NULL);
	proc_meshrun(&c, "yaml", "agent", "--hosts=1", "--job=pingpong", cfgarg, (char *)NULL);
	proc_meshrun(&d, "mesh", "agent", "--hosts=2", "--host-id=0", "--job=pingpong",
		    "dcn_data_parallelism=3", (char *)NULL);
	proc_meshrun(&e, "devices", "agent", "--hosts=1", "--devices-per-host=2", "--job=pingpong",
		    "ici_data_parallelism=3", (char *)NULL);
	proc_meshrun(&f, "job", "agent", "--hosts=1", "--job=nope", (char *)NULL);

	ck_assert_int_eq(proc_wait(&a, 20), EXIT_CONFIG);
	ck_assert_file_has(a.err, "unknown key 'bogus_key'");
	ck_assert_int_eq(proc_wait(&b, 20), EXIT_CONFIG);
	ck_assert_file_has(b.err, "key 'heartbeat_timeout_s' (command line) wants a number, got 'soon'");
	ck_assert_int_eq(proc_wait(&c, 20), EXIT_CONFIG);
	ck_assert_file_has(c.err, "unknown key 'no_such_key'");
	ck_assert_file_has(c.err, "bad.yml");
	ck_assert_int_eq(proc_wait(&d, 20), EXIT_CONFIG);
	ck_assert_file_has(d.err, "multiplies to 3 hosts ('dcn_data_parallelism'=3), but the run has "
			   "2 hosts (dcn_data_parallelism: command line)");
	ck_assert_int_eq(proc_wait(&e, 20), EXIT_CONFIG);
	ck_assert_file_has(e.err, "multiplies to 3 devices per host ('ici_data_parallelism'=3), but "
			   "the run has 2 (ici_data_parallelism: command line)");
	ck_assert_int_eq(proc_wait(&f, 20), EXIT_USAGE);
	ck_assert_file_has(f.err, "unknown job 'nope'");
}
END_TEST

START_TEST(test_single_host)
{
	struct proc p;
	/* one host needs no certificates and no sockets */
	proc_meshrun(&p, "one", "agent", "--hosts=1", "--devices-per-host=4", "--job=pingpong",
		    "--rounds=5", "--size=4K", "certs_dir=/nonexistent", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 20), 0);
	ck_assert_file_has(p.out, "1 hosts x 4 devices, 5 rounds of 4096 bytes: ok");
}
END_TEST

/* ---- rendezvous names the missing ---- */

/* A pingpong agent of 3 hosts with a 3 s start-up deadline. */
static void rdv_agent(struct proc *p, const char *name, int host, int port)
{
	char hid[32];
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s/certs", tmpdir);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	snprintf(hid, sizeof(hid), "--host-id=%d", host);
	proc_meshrun(p, name, "agent", hid, "--hosts=3", "--listen=127.0.0.1:0", "--job=pingpong",
		    "--rounds=10", certs_kv, coord_kv, "connect_timeout_s=3", (char *)NULL);
}

START_TEST(test_missing_host_named)
{
	/* host 2 of 3 never starts (or is stopped before it says hello): the
	 * coordinator's deadline fires first and every host names host 2;
	 * nobody blames host 1 for it */
	struct proc h[3];
	char want[200];
	int port = free_port();
	bool stopped = _i == 1;
	rdv_agent(&h[0], "h0", 0, port);
	ck_assert_msg(wait_listening(port, 10), "coordinator never listened");
	double t0 = now_s();
	rdv_agent(&h[1], "h1", 1, port);
	if (stopped) {
		rdv_agent(&h[2], "h2", 2, port);
		kill(h[2].pid, SIGSTOP);
	}
	ck_assert_int_eq(proc_wait(&h[0], 10), EXIT_FAIL);
	ck_assert_int_eq(proc_wait(&h[1], 10), EXIT_FAIL);
	/* before host 1's own deadline (3 s + 5 s): it heard the coordinator */
	ck_assert_double_lt(now_s() - t0, 7);
	if (!stopped) {
		snprintf(want, sizeof(want), "rendezvous timed out after 3 s: host 2 never said hello "
			 "to the coordinator at 127.0.0.1:%d (here: hosts 0, 1)", port);
		ck_assert_file_has(h[0].err, want);
		ck_assert_file_has(h[1].err, "meshrun: host 1: the coordinator (127.0.0.1:");
		ck_assert_file_has(h[1].err, want);
	} else {
		/* stopped before or after its hello: rendezvous or link set-up */
		for (int i = 0; i < 2; i++)
			ck_assert_msg(file_has(h[i].err, "host 2 never said hello") ||
				      file_has(h[i].err, "no link to hosts 2"), "host %d:\n%s", i,
				      slurp(h[i].err));
		kill(h[2].pid, SIGKILL);
	}
	for (int i = 0; i < 2; i++)
		ck_assert_msg(!file_has(h[i].err, "lost host"), "host %d blames a host:\n%s", i,
			      slurp(h[i].err));
}
END_TEST

START_TEST(test_coordinator_unreachable)
{
	/* nothing listens at the coordinator's address: host 1 names it */
	struct proc h;
	char want[200];
	int port = free_port();
	rdv_agent(&h, "h1", 1, port);
	ck_assert_int_eq(proc_wait(&h, 15), EXIT_FAIL);
	snprintf(want, sizeof(want), "rendezvous timed out after 8 s: no topology from the "
		 "coordinator at 127.0.0.1:%d (last error: connection refused)", port);
	ck_assert_file_has(h.err, want);
}
END_TEST

static Suite *agent_suite(void)
{
	Suite *s = suite_create("agent");
	TCase *tc = tcase_create("pingpong");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_pingpong_2_hosts);
	tcase_add_test(tc, test_pingpong_3_hosts_fragments);
	tcase_add_test(tc, test_pingpong_small_and_empty);
	tcase_add_test(tc, test_single_host);
	suite_add_tcase(s, tc);

	tc = tcase_create("peer_lost");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 40);
	tcase_add_test(tc, test_sigkill_peer);
	tcase_add_test(tc, test_sigstop_peer);
	tcase_add_test(tc, test_slow_finisher);
	suite_add_tcase(s, tc);

	tc = tcase_create("fairness");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_read_fairness);
	suite_add_tcase(s, tc);

	tc = tcase_create("fault");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 40);
	tcase_add_test(tc, test_fault_pass);
	tcase_add_loop_test(tc, test_fault_close, 0, 2);
	suite_add_tcase(s, tc);

	tc = tcase_create("rendezvous");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 40);
	tcase_add_loop_test(tc, test_missing_host_named, 0, 2);
	tcase_add_test(tc, test_coordinator_unreachable);
	suite_add_tcase(s, tc);

	tc = tcase_create("config");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 40);
	tcase_add_test(tc, test_config_errors);
	tcase_add_test(tc, test_local_reports_failure);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	SRunner *sr = srunner_create(agent_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
