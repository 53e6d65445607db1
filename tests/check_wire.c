/* The control-message checks (net/wire_check.c) one by one: each rule gives
 * the right class of error (-EBADMSG from the peer, -EINVAL between
 * configs) with its reason, and the frame that should pass, passes. The
 * fuzz target tests/fuzz/fuzz_control.c drives the same functions with
 * random input; this suite pins the decisions. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"
#include "net/wire_check.h"
#include "net/xport.h"

static uint8_t hash[WIRE_HASH_LEN];
static char err[600];

static void noop_recv(void *ctx, struct xreq *r)
{
	(void)ctx;
	(void)r;
}

static const struct xport_remote_ops ops = { .recv_posted = noop_recv, .send_ready = noop_recv };

/* host 1 of 3, 2 devices each (0-1 on host 0, 2-3 on 1, 4-5 on 2), job 42 */
static struct wire_self self(const struct xport *x)
{
	memset(hash, 0xab, sizeof(hash));
	return (struct wire_self){ .host_id = 1, .num_hosts = 3, .devices_per_host = 2,
				   .config_hash = hash, .job_id = 42, .addr_max = 128, .x = x };
}

#define ck_err(call, want, text)                                                       \
	do {                                                                           \
		err[0] = 0;                                                            \
		int rc_ = (call);                                                      \
		ck_assert_msg(rc_ == (want), "%s: %d, want %d (%s)", #call, rc_, (want), err); \
		if ((want) < 0)                                                        \
			ck_assert_msg(strstr(err, (text)), "'%s' lacks '%s'", err, (text));    \
	} while (0)

/* a frame as the sequence check sees it */
struct fid {
	int body;
	uint64_t link_seq, ack_seq;
};

static struct fid frame(int body, uint64_t seq, uint64_t ack)
{
	return (struct fid){ .body = body, .link_seq = seq, .ack_seq = ack };
}

#define CHECK_SEQ(s, f) wire_check_seq((s), (f)->body, (f)->link_seq, (f)->ack_seq, err, sizeof(err))

START_TEST(test_seq)
{
	struct wire_rx_seq s = { .replay = true, .acks = true, .rx_seq = 4, .tx_seq = 6 };
	struct fid f = frame(MESHRUN__FRAME__BODY_HEARTBEAT, 5, 6);
	ck_err(CHECK_SEQ(&s, &f), WIRE_SEQ_NEXT, "");
	f.ack_seq = 7;
	ck_err(CHECK_SEQ(&s, &f), -EBADMSG,
	       "heartbeat frame acknowledges frame 7, only 6 sent");
	f.ack_seq = 0;
	f.link_seq = 4;
	ck_err(CHECK_SEQ(&s, &f), WIRE_SEQ_SKIP, "");
	/* with recovery a gap is frames lost on the way: the link redials */
	f.link_seq = 6;
	ck_err(CHECK_SEQ(&s, &f), WIRE_SEQ_GAP, "");
	ck_assert_str_eq(err, "heartbeat frame has sequence number 6, expected 5: frames lost on the way");
	f = frame(MESHRUN__FRAME__BODY_ACK, 0, 3);
	ck_err(CHECK_SEQ(&s, &f), WIRE_SEQ_SKIP, "");
	s.part_seq = 5;
	f = frame(MESHRUN__FRAME__BODY_CHUNK, 5, 0);
	ck_err(CHECK_SEQ(&s, &f), WIRE_SEQ_PART, "");
	/* waiting for the hello: an unsequenced LinkHello is the resume */
	s = (struct wire_rx_seq){ .replay = true, .hello = true, .rx_seq = 4, .tx_seq = 6 };
	f = frame(MESHRUN__FRAME__BODY_LINK_HELLO, 0, 99);
	ck_err(CHECK_SEQ(&s, &f), WIRE_SEQ_RESUME_HELLO, "");
	/* no recovery: no acks, no duplicates */
	s = (struct wire_rx_seq){ .rx_seq = 4, .tx_seq = 6 };
	f = frame(MESHRUN__FRAME__BODY_ACK, 0, 3);
	ck_err(CHECK_SEQ(&s, &f), -EBADMSG, "ack frame has sequence number 0");
	f = frame(MESHRUN__FRAME__BODY_HEARTBEAT, 5, 99);
	ck_err(CHECK_SEQ(&s, &f), WIRE_SEQ_NEXT, "");
	/* without recovery a gap cannot be mended */
	f = frame(MESHRUN__FRAME__BODY_CHUNK, 7, 0);
	ck_err(CHECK_SEQ(&s, &f), -EBADMSG, "chunk frame has sequence number 7, expected 5");
}
END_TEST

START_TEST(test_stage)
{
	ck_err(wire_check_hello_stage(ROLE_COORD_IN, MESHRUN__FRAME__BODY_HELLO, err, sizeof(err)),
	       0, "");
	ck_err(wire_check_hello_stage(ROLE_COORD_IN, MESHRUN__FRAME__BODY_LINK_HELLO, err,
				      sizeof(err)),
	       -EBADMSG, "unexpected link_hello frame before the hello");
	ck_err(wire_check_hello_stage(ROLE_COORD_OUT, MESHRUN__FRAME__BODY_REFUSE, err, sizeof(err)),
	       0, "");
	ck_err(wire_check_hello_stage(ROLE_LINK_IN, MESHRUN__FRAME__BODY_REFUSE, err, sizeof(err)),
	       -EBADMSG, "unexpected refuse frame");
	/* the coordinator's rendezvous deadline reaches an agent as an Abort;
	 * nobody else may send one before the hello */
	ck_err(wire_check_hello_stage(ROLE_COORD_OUT, MESHRUN__FRAME__BODY_ABORT, err, sizeof(err)),
	       0, "");
	ck_err(wire_check_hello_stage(ROLE_COORD_IN, MESHRUN__FRAME__BODY_ABORT, err, sizeof(err)),
	       -EBADMSG, "unexpected abort frame before the hello");
	ck_err(wire_check_hello_stage(ROLE_LINK_OUT, MESHRUN__FRAME__BODY_ABORT, err, sizeof(err)),
	       -EBADMSG, "unexpected abort frame");
	ck_err(wire_check_running(MESHRUN__FRAME__BODY_CHUNK, err, sizeof(err)), 0, "");
	ck_err(wire_check_running(MESHRUN__FRAME__BODY_TOPOLOGY, err, sizeof(err)), -EBADMSG,
	       "unexpected topology frame on a running link");
}
END_TEST

START_TEST(test_hello)
{
	struct wire_self s = self(NULL);
	struct wire_join j = { 0 };
	Meshrun__Hello h = MESHRUN__HELLO__INIT;
	h.host_id = 2;
	h.num_hosts = 3;
	h.devices = 2;
	h.version = (char *)NET_VERSION;
	h.data_address = "127.0.0.1:7002";
	h.config_hash.data = hash;
	h.config_hash.len = WIRE_HASH_LEN;
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), 0, "");
	h.host_id = 3;
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EBADMSG,
	       "host id 3 is out of range: the cluster has 3 hosts (0..2)");
	h.host_id = 0;
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EBADMSG, "duplicate host id 0");
	h.host_id = 2;
	j = (struct wire_join){ .joined = true, .joined_from = "127.0.0.1:5555" };
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EBADMSG,
	       "duplicate host id 2: host 2 already joined from 127.0.0.1:5555");
	j = (struct wire_join){ .topology_done = true };
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EBADMSG, "the rendezvous is over");
	j = (struct wire_join){ 0 };
	h.version = "meshrun 9\nhost 0: forged";
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EINVAL,
	       "runs version 'meshrun 9?host 0: forged'");
	h.version = (char *)NET_VERSION;
	h.num_hosts = 4;
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EINVAL, "started for 4 hosts");
	h.num_hosts = 3;
	uint8_t other[WIRE_HASH_LEN] = { 0x12, 0x34 };
	h.config_hash.data = other;
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EINVAL,
	       "host 2's config hash 12340000 differs from the coordinator's abababab");
	h.config_hash.data = hash;
	h.devices = 1;
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EINVAL, "host 2 has 1 devices");
	h.devices = 2;
	h.data_address = "127.0.0.1";
	ck_err(wire_check_hello(&s, &j, &h, err, sizeof(err)), -EBADMSG,
	       "host 2 sent a bad data address '127.0.0.1'");
}
END_TEST

START_TEST(test_topology)
{
	struct wire_self s = self(NULL);
	Meshrun__HostInfo hi[3], *ptrs[3];
	for (int i = 0; i < 3; i++) {
		Meshrun__HostInfo init = MESHRUN__HOST_INFO__INIT;
		hi[i] = init;
		hi[i].host_id = (uint32_t)i;
		hi[i].data_address = "10.0.0.1:7000";
		ptrs[i] = &hi[i];
	}
	Meshrun__Topology t = MESHRUN__TOPOLOGY__INIT;
	t.hosts = ptrs;
	t.n_hosts = 3;
	ck_err(wire_check_topology(&s, &t, err, sizeof(err)), 0, "");
	t.n_hosts = 2;
	ck_err(wire_check_topology(&s, &t, err, sizeof(err)), -EBADMSG,
	       "topology of 2 hosts, expected 3");
	t.n_hosts = 3;
	hi[1].host_id = 2;
	ck_err(wire_check_topology(&s, &t, err, sizeof(err)), -EBADMSG,
	       "bad topology entry 1 (host_id)");
	hi[1].host_id = 1;
	hi[2].data_address = "";
	ck_err(wire_check_topology(&s, &t, err, sizeof(err)), -EBADMSG,
	       "bad topology entry 2 (empty data_address)");
}
END_TEST

START_TEST(test_link_hello)
{
	struct wire_self s = self(NULL);
	Meshrun__LinkHello h = MESHRUN__LINK_HELLO__INIT;
	h.host_id = 0;
	h.job_id = 42;
	ck_err(wire_check_link_hello(&s, &h, err, sizeof(err)), 0, "");
	h.job_id = 43;
	ck_err(wire_check_link_hello(&s, &h, err, sizeof(err)), -EBADMSG, "another job");
	h.job_id = 42;
	h.host_id = 2;
	ck_err(wire_check_link_hello(&s, &h, err, sizeof(err)), -EBADMSG,
	       "host 2 may not dial host 1 (the lower id dials)");
	h.host_id = 0;
	/* link_streams: the stream index must be one the pair has */
	h.stream = 1;
	ck_err(wire_check_link_hello(&s, &h, err, sizeof(err)), -EBADMSG,
	       "link hello for stream 1, but host pairs have 1");
	s.streams = 2;
	ck_err(wire_check_link_hello(&s, &h, err, sizeof(err)), 0, "");
	h.stream = 0;
	struct wire_link_view none = { 0 }, up = { .exists = true, .resumable = true };
	ck_err(wire_check_link_join(&none, &h, err, sizeof(err)), 0, "");
	ck_err(wire_check_link_join(&up, &h, err, sizeof(err)), -EBADMSG, "duplicate link from host 0");
	h.resume = true;
	ck_err(wire_check_link_join(&up, &h, err, sizeof(err)), 0, "");
	ck_err(wire_check_link_join(&none, &h, err, sizeof(err)), -EBADMSG,
	       "host 0 asked to resume a link that is not running");
	/* a resume after a frame never sent (the link sent 5) */
	struct wire_link_view sent5 = { .exists = true, .resumable = true, .tx_seq = 5 };
	h.last_seq = 5;
	ck_err(wire_check_link_join(&sent5, &h, err, sizeof(err)), 0, "");
	h.last_seq = 6;
	ck_err(wire_check_link_join(&sent5, &h, err, sizeof(err)), -EBADMSG,
	       "host 0 resumes after frame 6, but only 5 were sent to it");
	ck_err(wire_check_resume_seq(2, 9, 8, err, sizeof(err)), -EBADMSG,
	       "host 2 resumes after frame 9, but only 8 were sent to it");
	ck_err(wire_check_resume_seq(2, 8, 8, err, sizeof(err)), 0, "");
	h.last_seq = 0;
	/* the dialer (host 1 dials host 2) */
	h.host_id = 2;
	ck_err(wire_check_link_answer(&s, 2, "a:1", 0, true, &h, err, sizeof(err)), 0, "");
	h.resume = false;
	ck_err(wire_check_link_answer(&s, 2, "a:1", 0, true, &h, err, sizeof(err)), -EBADMSG,
	       "host 2 (a:1) answered our redial as host 2 of job 2a");
	ck_err(wire_check_link_answer(&s, 2, "a:1", 0, false, &h, err, sizeof(err)), 0, "");
	h.stream = 1;
	ck_err(wire_check_link_answer(&s, 2, "a:1", 1, false, &h, err, sizeof(err)), 0, "");
	ck_err(wire_check_link_answer(&s, 2, "a:1", 0, false, &h, err, sizeof(err)), -EBADMSG,
	       "host 2 (a:1) answered our stream 0 as stream 1");
	h.stream = 0;
	h.host_id = 0;
	ck_err(wire_check_link_answer(&s, 2, "a:1", 0, false, &h, err, sizeof(err)), -EBADMSG,
	       "host 2 answered as host 0 of job 2a");
}
END_TEST

START_TEST(test_data)
{
	static const int dev_host[6] = { 0, 0, 1, 1, 2, 2 };
	struct xport *x = xport_new(1, 6, dev_host, &ops, NULL);
	ck_assert_ptr_nonnull(x);
	struct wire_self s = self(x);
	struct wire_rx_msg none = { 0 };
	struct frame_data c = { .src = 4, .dst = 3, .tag = 7, .msg_bytes = 100 };
	ck_err(wire_check_chunk(&s, 2, &none, &c, err, sizeof(err)), 0, "");
	ck_err(wire_check_chunk(&s, 0, &none, &c, err, sizeof(err)), -EBADMSG,
	       "chunk from device 4 to device 3 does not belong on this link");
	c.src = 99;
	ck_err(wire_check_chunk(&s, 2, &none, &c, err, sizeof(err)), -EBADMSG, "does not belong");
	/* a u32 device id past INT_MAX is no device */
	c.src = 0x80000004u;
	ck_err(wire_check_chunk(&s, 2, &none, &c, err, sizeof(err)), -EBADMSG, "does not belong");
	c.src = 4;
	c.msg_offset = 60;
	ck_err(wire_check_chunk(&s, 2, &none, &c, err, sizeof(err)), -EBADMSG,
	       "chunk fragment without its start");
	struct wire_rx_msg in = { .in_msg = true, .src = 4, .dst = 3, .tag = 7, .next = 60,
				  .total = 100 };
	ck_err(wire_check_chunk(&s, 2, &in, &c, err, sizeof(err)), 0, "");
	c.tag = 8;
	ck_err(wire_check_chunk(&s, 2, &in, &c, err, sizeof(err)), -EBADMSG,
	       "chunk fragment out of order");
	struct frame_rr rr = { .src = 2, .dst = 5 };
	ck_err(wire_check_recv_ready(&s, 2, &rr, err, sizeof(err)), 0, "");
	ck_err(wire_check_recv_ready(&s, 0, &rr, err, sizeof(err)), -EBADMSG,
	       "recv_ready for device 2 -> 5 does not belong on this link");
	rr.dst = 0xfffffffbu;
	ck_err(wire_check_recv_ready(&s, 2, &rr, err, sizeof(err)), -EBADMSG, "does not belong");
	ck_assert_int_eq(wire_done_status(EHOSTDOWN), -EHOSTDOWN);
	ck_assert_int_eq(wire_done_status(-5), NET_ERR);
	ck_assert_int_eq(wire_done_status(1 << 20), NET_ERR);
	xport_free(x);
}
END_TEST

/* The request times are read only while a trace asks (xport_set_stamps):
 * a message between two devices of this host, waited on both ends. */
START_TEST(test_stamps)
{
	static const int dev_host[2] = { 0, 0 };
	struct xport *x = xport_new(0, 2, dev_host, &ops, NULL);
	ck_assert_ptr_nonnull(x);
	for (int on = 0; on < 2; on++) {
		xport_set_stamps(x, on);
		struct xmeta m = { .group = 1, .seq = (uint64_t)on, .chunk = 0 };
		char a[16] = "stamped", b[16];
		struct xreq *s, *r;
		ck_assert_int_eq(xport_irecv(x, 0, 1, &m, b, sizeof(b), &r), 0);
		ck_assert_int_eq(xport_isend(x, 0, 1, &m, a, sizeof(a), &s), 0);
		ck_assert_int_eq(xport_wait(s, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
		ck_assert_int_eq(xport_wait(r, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
		ck_assert_str_eq(b, "stamped");
		struct xtimes t = xport_last_times();
		if (on)
			ck_assert_msg(t.issued_ns > 0 && t.done_ns >= t.issued_ns &&
				      (!t.net_ns || (t.net_ns >= t.issued_ns && t.net_ns <= t.done_ns)),
				      "issued %llu net %llu done %llu", (unsigned long long)t.issued_ns,
				      (unsigned long long)t.net_ns, (unsigned long long)t.done_ns);
		else
			ck_assert_msg(!t.issued_ns && !t.net_ns && !t.done_ns, "untraced, yet issued %llu done %llu",
				      (unsigned long long)t.issued_ns, (unsigned long long)t.done_ns);
	}
	xport_free(x);
}
END_TEST

START_TEST(test_peer_text)
{
	char out[8];
	ck_assert_str_eq(wire_peer_text("a\nb\r\x1b", out, sizeof(out)), "a?b??");
	ck_assert_str_eq(wire_peer_text("0123456789", out, sizeof(out)), "0123456");
	ck_assert_str_eq(wire_peer_text(NULL, out, sizeof(out)), "");
	ck_assert_str_eq(wire_peer_text("h\xc3\xa9", out, sizeof(out)), "h\xc3\xa9");
}
END_TEST

static Suite *wire_suite(void)
{
	Suite *s = suite_create("wire");
	const struct { const char *name; const TTest *t; } cases[] = {
		{ "seq", test_seq }, { "stage", test_stage }, { "hello", test_hello },
		{ "topology", test_topology }, { "link_hello", test_link_hello },
		{ "data", test_data }, { "stamps", test_stamps }, { "peer_text", test_peer_text },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_set_timeout(tc, 10);
		tcase_add_test(tc, cases[i].t);
		suite_add_tcase(s, tc);
	}
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(wire_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
