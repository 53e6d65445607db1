/* See link_model.h: recv.c's receive state around the real checks
 * (net/wire_check.c), frame and xport code. Keep each function next to its
 * counterpart in net/recv.c. */
#include "tests/fuzz/link_model.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/conn.h"
#include "net/frame.h"
#include "net/net.h"
#include "net/wire_check.h"
#include "net/xport.h"
#include "tests/fuzz/fuzz.h"

struct lm {
	struct xport *x;
	struct xreq *posted[4];
	void *bufs[5];
	bool failed;              /* net_fail ran: data frames are discarded */
	uint64_t rx_seq;
	bool chunk;               /* the current frame is a chunk */
	/* on_chunk's state for a message arriving in fragments */
	struct xreq *rx_req;
	int rx_src, rx_dst_dev;
	uint64_t rx_tag, rx_total, rx_next, rx_got;
	uint8_t *rx_dst;
	struct xland rx_land;
	unsigned sink;            /* bytes "sent", so reading them is not elided */
};

/* net.c's write path reads the whole send buffer: so does the model */
static void send_now(struct lm *m, struct xreq *r)
{
	const uint8_t *p = r->buf;
	for (size_t i = 0; i < r->len; i++)
		m->sink += p[i];
	xport_complete(r, 0);
}

static void op_recv_posted(void *ctx, struct xreq *r)
{
	(void)ctx;
	(void)r;
}

static void op_send_ready(void *ctx, struct xreq *r)
{
	send_now(ctx, r);
}

static const struct xport_remote_ops lm_ops = { .recv_posted = op_recv_posted,
						 .send_ready = op_send_ready };

static void *xalloc(size_t n)
{
	void *p = malloc(n);
	FUZZ_CHECK(p);
	return p;
}

struct lm *lm_new(void)
{
	static const int dev_host[4] = { 0, 0, 1, 1 };
	struct lm *m = calloc(1, sizeof(*m));
	FUZZ_CHECK(m);
	m->x = xport_new(LM_HOST_ID, 4, dev_host, &lm_ops, m);
	FUZZ_CHECK(m->x);
	xport_set_eager(m->x, LM_EAGER_MAX, LM_EAGER_CREDIT);
	/* separate allocations of the exact size: an overrun is an ASan
	 * report, not a write into the neighbour */
	struct xmeta meta = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = LM_GROUP, .seq = LM_SEQ };
	m->bufs[0] = xalloc(LM_RECV0_BYTES);
	meta.chunk = 0;
	FUZZ_CHECK(!xport_irecv(m->x, 0, 2, &meta, m->bufs[0], LM_RECV0_BYTES, &m->posted[0]));
	m->bufs[1] = xalloc(LM_RECV1_BYTES);
	m->bufs[2] = xalloc(LM_RECV1_BYTES);
	for (size_t i = 0; i < LM_RECV1_BYTES / sizeof(float); i++)
		((float *)m->bufs[2])[i] = 1.0f;
	meta.chunk = 1;
	FUZZ_CHECK(!xport_irecv_add(m->x, 1, 3, &meta, m->bufs[1], m->bufs[2], LM_RECV1_BYTES,
				    &m->posted[1]));
	m->bufs[3] = xalloc(LM_SEND_EAGER_BYTES);
	memset(m->bufs[3], 7, LM_SEND_EAGER_BYTES);
	meta.chunk = 2;
	FUZZ_CHECK(!xport_isend(m->x, 2, 0, &meta, m->bufs[3], LM_SEND_EAGER_BYTES, &m->posted[2]));
	m->bufs[4] = xalloc(LM_SEND_BYTES);
	memset(m->bufs[4], 9, LM_SEND_BYTES);
	meta.chunk = 3;
	FUZZ_CHECK(!xport_isend(m->x, 3, 1, &meta, m->bufs[4], LM_SEND_BYTES, &m->posted[3]));
	return m;
}

void lm_free(struct lm *m)
{
	char err[600];
	if (m->rx_req)                  /* link_release_reqs */
		xport_complete(m->rx_req, -EPIPE);
	xport_fail(m->x, -ECANCELED, "the model is done");
	for (int i = 0; i < 4; i++) {
		int rc = xport_wait(m->posted[i], 0, err, sizeof(err));
		FUZZ_CHECK(rc != -EAGAIN); /* every request is complete by now */
		if (rc != -ECANCELED) {
			snprintf(err, sizeof(err), "posted request %d completed: %d", i, rc);
			fuzz_note("link model", err);
		}
	}
	xport_free(m->x);
	for (int i = 0; i < 5; i++)
		free(m->bufs[i]);
	free(m);
}

/* net_fail: the job fails, the transport with it */
static void fail(struct lm *m, const char *why)
{
	if (!m->failed)
		xport_fail(m->x, -ECONNABORTED, why);
	m->failed = true;
}

/* What the real checks (net/wire_check.h) read of "this host". */
static struct wire_self lm_self(const struct lm *m)
{
	static uint8_t hash[WIRE_HASH_LEN];
	memset(hash, LM_CONFIG_HASH_BYTE, sizeof(hash));
	return (struct wire_self){ .host_id = LM_HOST_ID, .num_hosts = LM_NUM_HOSTS,
				   .devices_per_host = 2, .config_hash = hash, .job_id = LM_JOB_ID,
				   .addr_max = LM_ADDR_MAX, .x = m->x };
}

/* recv.c on_chunk: the real check, then the model's receive state */
static int on_chunk(struct lm *m, const struct frame_data *c, uint64_t byte_count, char *why,
		    size_t whylen)
{
	int src = (int)c->src, dst = (int)c->dst;

	m->rx_dst = NULL;
	if (m->failed)
		return 0;
	struct wire_self self = lm_self(m);
	struct wire_rx_msg msg = { .in_msg = m->rx_req != NULL, .src = m->rx_src,
				   .dst = m->rx_dst_dev, .tag = m->rx_tag, .next = m->rx_next,
				   .total = m->rx_total };
	int rc = wire_check_chunk(&self, LM_PEER, &msg, c, why, whylen);
	if (rc)
		return rc;
	/* what the handler relies on once the check passed */
	FUZZ_CHECK(xport_host_of(m->x, src) == LM_PEER && xport_host_of(m->x, dst) == LM_HOST_ID);
	if (!m->rx_req) {
		const char *what;
		struct xreq *r = xport_remote_data(m->x, src, dst, c->tag, (size_t)c->msg_bytes,
						   (c->flags & FRAME_DATA_EAGER) != 0, &what);
		if (!r) {
			snprintf(why, whylen, "data from device %d to device %d %s", src, dst, what);
			return -EBADMSG;
		}
		m->rx_req = r;
		m->rx_src = src;
		m->rx_dst_dev = dst;
		m->rx_tag = c->tag;
		m->rx_total = c->msg_bytes;
		m->rx_next = 0;
		m->rx_land = (struct xland){ 0 };
	}
	FUZZ_CHECK(c->msg_offset == m->rx_next && c->msg_bytes == m->rx_total);
	m->rx_dst = (uint8_t *)m->rx_req->buf + c->msg_offset;
	m->rx_next += byte_count;
	return 0;
}

/* recv.c on_recv_ready */
static int on_recv_ready(struct lm *m, const struct frame_rr *rr, char *why, size_t whylen)
{
	if (m->failed)
		return 0;
	struct wire_self self = lm_self(m);
	int rc = wire_check_recv_ready(&self, LM_PEER, rr, why, whylen);
	if (rc)
		return rc;
	/* what the handler relies on once the check passed */
	FUZZ_CHECK(xport_host_of(m->x, (int)rr->src) == LM_HOST_ID &&
		   xport_host_of(m->x, (int)rr->dst) == LM_PEER);
	struct xreq *r = xport_remote_ready(m->x, (int)rr->src, (int)rr->dst, rr->tag,
					    (size_t)rr->bytes);
	if (r)
		send_now(m, r);
	return 0;
}

int lm_data_body(struct lm *m, const struct frame_data *d, uint64_t payload_len, char *why,
		 size_t whylen)
{
	m->chunk = true;
	m->rx_got = 0;
	m->rx_dst = NULL;
	/* frame_parse_data's promises */
	FUZZ_CHECK(!(d->flags & ~(uint32_t)FRAME_DATA_FLAGS));
	FUZZ_CHECK(d->msg_offset <= d->msg_bytes && payload_len <= d->msg_bytes - d->msg_offset);
	if (d->flags & FRAME_DATA_RR) {
		int rc = on_recv_ready(m, &d->rr, why, whylen);
		if (rc)
			return rc;
	}
	return on_chunk(m, d, payload_len, why, whylen);
}

int lm_data(struct lm *m, const struct frame_data *d, uint64_t payload_len, char *why,
	    size_t whylen)
{
	struct wire_rx_seq s = { .replay = true, .acks = true, .rx_seq = m->rx_seq,
				 .tx_seq = LM_TX_SEQ };
	int k = wire_check_seq(&s, MESHRUN__FRAME__BODY_CHUNK, d->link_seq, d->ack_seq, why, whylen);
	if (k < 0)
		return k;
	/* frames lost on the way: recv_seq drops the connection, nothing lands */
	if (k == WIRE_SEQ_GAP)
		return -EPROTO;
	FUZZ_CHECK(k == WIRE_SEQ_NEXT || k == WIRE_SEQ_SKIP);
	FUZZ_CHECK(d->ack_seq <= LM_TX_SEQ);     /* what link_acked may take */
	if (k == WIRE_SEQ_SKIP) {
		/* a frame we have: its payload is read, nothing lands */
		m->chunk = false;
		m->rx_dst = NULL;
		m->rx_got = 0;
		return 0;
	}
	m->rx_seq = d->link_seq;
	return lm_data_body(m, d, payload_len, why, whylen);
}

int lm_body(struct lm *m, const Meshrun__Frame *f, char *why, size_t whylen)
{
	char msg[600];
	int rc;

	m->chunk = false;
	m->rx_got = 0;
	/* frame_parse_header's promise: data travels in data frames */
	FUZZ_CHECK(f->body_case != MESHRUN__FRAME__BODY_CHUNK);
	rc = wire_check_running(f->body_case, why, whylen);
	if (rc)
		return rc;
	switch (f->body_case) {
	case MESHRUN__FRAME__BODY_RECV_READY: {
		const Meshrun__RecvReady *q = f->recv_ready;
		struct frame_rr rr = { .src = q->src_device, .dst = q->dst_device, .tag = q->tag,
				       .bytes = q->byte_count };
		return on_recv_ready(m, &rr, why, whylen);
	}
	case MESHRUN__FRAME__BODY_DONE:
		if (f->done->status) {
			FUZZ_CHECK(wire_done_status(f->done->status) < 0);
			snprintf(msg, sizeof(msg), "host %d finished with status %d", LM_PEER,
				 f->done->status);
			fail(m, msg);
		}
		return 0;
	case MESHRUN__FRAME__BODY_ABORT:
		FUZZ_CHECK(wire_done_status(f->abort->code) < 0);
		snprintf(msg, sizeof(msg), "host %d aborted the job: %s", LM_PEER,
			 f->abort->reason ? f->abort->reason : "");
		fail(m, msg);
		return 0;
	default:                        /* heartbeat, barrier */
		return 0;
	}
}

/* recv.c header_done: the real sequence check (recovery on), then the body */
int lm_frame(struct lm *m, const Meshrun__Frame *f, char *why, size_t whylen)
{
	struct wire_rx_seq s = { .replay = true, .acks = true, .rx_seq = m->rx_seq,
				 .tx_seq = LM_TX_SEQ };
	int k = wire_check_seq(&s, f->body_case, f->link_seq, f->ack_seq, why, whylen);
	if (k < 0)
		return k;
	FUZZ_CHECK(k == WIRE_SEQ_NEXT || k == WIRE_SEQ_SKIP);
	FUZZ_CHECK(f->ack_seq <= LM_TX_SEQ);     /* what link_acked may take */
	if (k == WIRE_SEQ_SKIP) {
		/* an Ack, or a frame we have: its payload is read, nothing lands */
		m->chunk = false;
		m->rx_dst = NULL;
		m->rx_got = 0;
		return 0;
	}
	m->rx_seq = f->link_seq;
	return lm_body(m, f, why, whylen);
}

/* link_read's RX_PAYLOAD stage */
void lm_payload(struct lm *m, const uint8_t *p, size_t n)
{
	if (m->rx_dst && m->rx_req && m->rx_req->addend)
		xport_land_stream(m->rx_req, &m->rx_land, p, n);
	else if (m->rx_dst && m->rx_req)
		memcpy(m->rx_dst + m->rx_got, p, n);
	m->rx_got += n;
}

/* chunk_payload_done */
void lm_payload_done(struct lm *m)
{
	if (!m->chunk)
		return;
	if (m->rx_req && m->rx_next == m->rx_total) {
		xport_complete(m->rx_req, 0);
		m->rx_req = NULL;
	}
	m->rx_dst = NULL;
}
