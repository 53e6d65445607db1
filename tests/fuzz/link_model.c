/* See link_model.h: net.c's receive-side checks around the real frame and
 * xport code. Keep each function next to its counterpart in net/net.c. */
#include "tests/fuzz/link_model.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/conn.h"
#include "net/frame.h"
#include "net/net.h"
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

static const struct xport_remote_ops lm_ops = { op_recv_posted, op_send_ready };

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

/* coord_on_hello, the checks that do not need the coordinator's state */
int lm_check_hello(const Meshrun__Hello *h, char *why, size_t whylen)
{
	static uint8_t hash[32];
	char hostpart[128], a[16];
	int port, id = (int)h->host_id;

	memset(hash, LM_CONFIG_HASH_BYTE, sizeof(hash));
	if (id <= 0 || id >= LM_NUM_HOSTS) {
		snprintf(why, whylen, "host id %d is out of range", id);
		return -EPROTO;
	}
	if (!h->version || strcmp(h->version, NET_VERSION)) {
		snprintf(why, whylen, "host %d runs version '%s'", id, h->version ? h->version : "");
		return -EPROTO;
	}
	if ((int)h->num_hosts != LM_NUM_HOSTS || (int)h->devices != 2) {
		snprintf(why, whylen, "host %d was started for %u hosts of %u devices", id,
			 h->num_hosts, h->devices);
		return -EPROTO;
	}
	if (h->config_hash.len != sizeof(hash) || memcmp(h->config_hash.data, hash, sizeof(hash))) {
		size_t i; /* hex8 */
		for (i = 0; i < 4 && i < h->config_hash.len; i++)
			snprintf(a + 2 * i, 3, "%02x", h->config_hash.data[i]);
		a[2 * i] = 0;
		snprintf(why, whylen, "host %d's config hash %s differs", id, a);
		return -EPROTO;
	}
	if (!h->data_address || conn_split_addr(h->data_address, hostpart, sizeof(hostpart), &port) ||
	    !port || strlen(h->data_address) >= 64) {
		snprintf(why, whylen, "host %d sent a bad data address '%s'", id,
			 h->data_address ? h->data_address : "");
		return -EPROTO;
	}
	return 0;
}

/* agent_on_topology */
int lm_check_topology(const Meshrun__Topology *t, char *why, size_t whylen)
{
	char addr[64];
	if ((int)t->n_hosts != LM_NUM_HOSTS) {
		snprintf(why, whylen, "coordinator sent a topology of %zu hosts", t->n_hosts);
		return -EPROTO;
	}
	for (size_t i = 0; i < t->n_hosts; i++) {
		const Meshrun__HostInfo *h = t->hosts[i];
		if (h->host_id != i || !h->data_address || !h->data_address[0] ||
		    strlen(h->data_address) >= sizeof(addr)) {
			snprintf(why, whylen, "coordinator sent a bad topology entry %zu", i);
			return -EPROTO;
		}
		snprintf(addr, sizeof(addr), "%s", h->data_address);
	}
	return 0;
}

/* accept_link_hello, for the acceptor (host 1: only host 0 may dial it) */
int lm_check_link_hello(const Meshrun__LinkHello *h, char *why, size_t whylen)
{
	int id = (int)h->host_id;
	if (id < 0 || id >= LM_HOST_ID) {
		snprintf(why, whylen, "host %d may not dial host %d", id, LM_HOST_ID);
		return -EPROTO;
	}
	return 0;
}

/* on_chunk */
static int on_chunk(struct lm *m, const Meshrun__CollectiveChunk *c, char *why, size_t whylen)
{
	int src = (int)c->src_device, dst = (int)c->dst_device;

	m->rx_dst = NULL;
	if (m->failed)
		return 0;
	if (xport_host_of(m->x, src) != LM_PEER || xport_host_of(m->x, dst) != LM_HOST_ID) {
		snprintf(why, whylen, "chunk from device %d to device %d does not belong on this link",
			 src, dst);
		return -EPROTO;
	}
	if (!m->rx_req) {
		if (c->msg_offset != 0) {
			snprintf(why, whylen, "chunk fragment without its start");
			return -EPROTO;
		}
		const char *what;
		struct xreq *r = xport_remote_data(m->x, src, dst, c->tag, (size_t)c->msg_bytes,
						   c->eager, &what);
		if (!r) {
			snprintf(why, whylen, "data from device %d to device %d %s", src, dst, what);
			return -EPROTO;
		}
		m->rx_req = r;
		m->rx_src = src;
		m->rx_dst_dev = dst;
		m->rx_tag = c->tag;
		m->rx_total = c->msg_bytes;
		m->rx_next = 0;
		m->rx_land = (struct xland){ 0 };
	} else if (src != m->rx_src || dst != m->rx_dst_dev || c->tag != m->rx_tag ||
		   c->msg_offset != m->rx_next || c->msg_bytes != m->rx_total) {
		snprintf(why, whylen, "chunk fragment out of order");
		return -EPROTO;
	}
	m->rx_dst = (uint8_t *)m->rx_req->buf + c->msg_offset;
	m->rx_next += c->byte_count;
	return 0;
}

/* on_recv_ready */
static int on_recv_ready(struct lm *m, const Meshrun__RecvReady *rr, char *why, size_t whylen)
{
	int src = (int)rr->src_device, dst = (int)rr->dst_device;
	if (m->failed)
		return 0;
	if (xport_host_of(m->x, src) != LM_HOST_ID || xport_host_of(m->x, dst) != LM_PEER) {
		snprintf(why, whylen, "recv_ready for device %d -> %d does not belong on this link",
			 src, dst);
		return -EPROTO;
	}
	struct xreq *r = xport_remote_ready(m->x, src, dst, rr->tag, (size_t)rr->byte_count);
	if (r)
		send_now(m, r);
	return 0;
}

/* header_done's sequence check, then dispatch for a link in LS_UP */
int lm_frame(struct lm *m, const Meshrun__Frame *f, uint64_t payload_len, char *why,
	     size_t whylen)
{
	char msg[600];
	int rc;

	if (f->body_case == MESHRUN__FRAME__BODY_ACK) {
		/* recv_resumed: an Ack is dropped before the sequence check */
		m->chunk = false;
		m->rx_got = 0;
		return 0;
	}
	if (f->link_seq != m->rx_seq + 1) {
		snprintf(why, whylen, "frame has sequence number %llu, expected %llu",
			 (unsigned long long)f->link_seq, (unsigned long long)(m->rx_seq + 1));
		return -EPROTO;
	}
	m->rx_seq = f->link_seq;
	m->chunk = f->body_case == MESHRUN__FRAME__BODY_CHUNK;
	m->rx_got = 0;
	FUZZ_CHECK(m->chunk || payload_len == 0); /* frame_parse_header's promise */
	switch (f->body_case) {
	case MESHRUN__FRAME__BODY_HEARTBEAT:
	case MESHRUN__FRAME__BODY_BARRIER:
		return 0;
	case MESHRUN__FRAME__BODY_CHUNK:
		FUZZ_CHECK(f->chunk->byte_count == payload_len);
		return on_chunk(m, f->chunk, why, whylen);
	case MESHRUN__FRAME__BODY_RECV_READY:
		return on_recv_ready(m, f->recv_ready, why, whylen);
	case MESHRUN__FRAME__BODY_DONE:
		if (f->done->status) {
			snprintf(msg, sizeof(msg), "host %d finished with status %d", LM_PEER,
				 f->done->status);
			fail(m, msg);
		}
		return 0;
	case MESHRUN__FRAME__BODY_ABORT:
		snprintf(msg, sizeof(msg), "host %d aborted the job: %s", LM_PEER,
			 f->abort->reason ? f->abort->reason : "");
		fail(m, msg);
		return 0;
	case MESHRUN__FRAME__BODY_HELLO:
		rc = lm_check_hello(f->hello, msg, sizeof(msg));
		break;
	case MESHRUN__FRAME__BODY_TOPOLOGY:
		rc = lm_check_topology(f->topology, msg, sizeof(msg));
		break;
	case MESHRUN__FRAME__BODY_LINK_HELLO:
		rc = lm_check_link_hello(f->link_hello, msg, sizeof(msg));
		break;
	case MESHRUN__FRAME__BODY_REFUSE:
		rc = snprintf(msg, sizeof(msg), "refused: %s",
			      f->refuse->reason ? f->refuse->reason : "") < 0;
		break;
	default:
		FUZZ_CHECK(!"frame_parse_header passed a frame without a known body");
		return -EPROTO;
	}
	/* checked or not, a rendezvous frame ends a running link */
	snprintf(why, whylen, "unexpected %s frame on a running link (rendezvous check: %.300s)",
		 frame_body_name(f->body_case), rc ? msg : "passed");
	return -EPROTO;
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
