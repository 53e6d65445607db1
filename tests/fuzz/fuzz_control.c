/* (b) Each control message through the real checks of its handler
 * (net/wire_check.c, called by recv.c and rendezvous.c). Input: byte 0
 * picks the body (hello .. ack), byte 1 the state of the link it arrives
 * on (CTL_* bits below), byte 2 its link_seq, byte 3 its ack_seq; the rest
 * is the body's protobuf bytes, or for the chunk kind a data frame's
 * binary header (FRAME_DATA_HDR bytes, zero-filled if short, its link_seq
 * and ack_seq replaced by bytes 2 and 3) and an optional u16 payload
 * length (else the rest of the message). The target wraps a control body
 * in a Frame header and runs the real frame_parse_header (a data header:
 * frame_parse_data), then what recv.c's header_done and dispatch run for
 * that state: wire_check_seq; before the hello, wire_check_hello_stage and
 * the role's check (coordinator: wire_check_hello; agent:
 * wire_check_topology; acceptor: wire_check_link_hello and
 * wire_check_link_join; dialer: wire_check_link_answer); on a running
 * link, the link model (link_model.h: wire_check_running,
 * wire_check_chunk, wire_check_recv_ready and the real xport). Properties:
 * each check returns 0 or its documented errors with a one-line reason,
 * and what the handler does next with a passed body (index its peer
 * table, copy an address into its 128-byte slot) is in bounds. A chunk's
 * payload is landed when it is at most 64 KiB (larger are only parsed).
 * Real: every check, frame_parse_header, frame_parse_data, xport.
 * Modelled: the link's receive state and the job (link_model.c). */
#include <errno.h>
#include <string.h>

#include "net/frame.h"
#include "net/wire_check.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/link_model.h"

#define MAX_PAYLOAD (64u << 10)

/* byte 1 */
#define CTL_ROLE(b)   ((enum link_role)((b) & 3))   /* before the hello */
#define CTL_RUNNING   0x04   /* the link is UP (else it waits for a hello) */
#define CTL_REPLAY    0x08   /* recovery on */
#define CTL_WAS_UP    0x10   /* dialer: a redial; acceptor: the link can resume */
#define CTL_TOPO_DONE 0x20   /* coordinator: the topology went out */
#define CTL_JOINED    0x40   /* coordinator: the id joined; acceptor: a link exists */
#define CTL_PART      0x80   /* a frame was half read when the link broke */
#define CTL_RX_SEQ    4      /* frames received so far on a link that ran */
#define CTL_TX_SEQ    6      /* frames sent so far on a link that ran */

static const struct frame_limits lim = { .max_payload = 64u << 20 };

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	do {
		p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	return n;
}

/* A check's result: rc is 0 or one of the allowed errors (a second
 * allowed error, or 0 for none), and a failure says why on one line. */
static void checked(int rc, int e1, int e2, const char *err, const char *what)
{
	FUZZ_CHECK(rc == 0 || rc == e1 || (e2 && rc == e2));
	if (rc) {
		FUZZ_CHECK(err[0] && !strchr(err, '\n') && !strchr(err, '\r'));
		fuzz_note(what, err);
	}
}

/* rendezvous.c rdv_coord_on_hello, after the certificate check */
static void coord_hello(const struct wire_self *s, unsigned st, const Meshrun__Hello *h)
{
	char err[600] = "";
	struct wire_join j = { .topology_done = st & CTL_TOPO_DONE, .joined = st & CTL_JOINED,
			       .joined_from = st & CTL_REPLAY ? "127.0.0.1:40000" : NULL };
	int rc = wire_check_hello(s, &j, h, err, sizeof(err));
	checked(rc, -EBADMSG, -EINVAL, err, "hello");
	if (rc)
		return;
	/* the handler indexes peers[id] and copies the address into its slot */
	FUZZ_CHECK((int)h->host_id > 0 && (int)h->host_id < s->num_hosts);
	FUZZ_CHECK(h->data_address && strlen(h->data_address) < s->addr_max);
	FUZZ_CHECK(!(st & CTL_JOINED) && (int)h->devices == s->devices_per_host);
}

/* rendezvous.c rdv_agent_on_topology */
static void agent_topology(const struct wire_self *s, const Meshrun__Topology *t)
{
	char err[600] = "", addr[LM_ADDR_MAX];
	int rc = wire_check_topology(s, t, err, sizeof(err));
	checked(rc, -EBADMSG, 0, err, "topology");
	if (rc)
		return;
	FUZZ_CHECK((int)t->n_hosts == s->num_hosts);
	for (size_t i = 0; i < t->n_hosts; i++) {
		FUZZ_CHECK(t->hosts[i]->host_id == i && t->hosts[i]->data_address);
		size_t n = strlen(t->hosts[i]->data_address);
		FUZZ_CHECK(n > 0 && n < sizeof(addr));
		memcpy(addr, t->hosts[i]->data_address, n + 1);
	}
}

/* rendezvous.c rdv_accept_link_hello, the certificate taken as matching */
static void accept_link_hello(const struct wire_self *s, unsigned st,
			      const Meshrun__LinkHello *h)
{
	char err[600] = "";
	int rc = wire_check_link_hello(s, h, err, sizeof(err));
	checked(rc, -EBADMSG, 0, err, "link_hello");
	if (rc)
		return;
	/* the handler reads peers[id] next */
	FUZZ_CHECK((int)h->host_id >= 0 && (int)h->host_id < s->host_id);
	FUZZ_CHECK(h->job_id == s->job_id);
	struct wire_link_view v = { .exists = st & (CTL_JOINED | CTL_WAS_UP),
				    .resumable = st & CTL_WAS_UP,
				    .tx_seq = st & CTL_WAS_UP ? CTL_TX_SEQ : 0 };
	rc = wire_check_link_join(&v, h, err, sizeof(err));
	checked(rc, -EBADMSG, 0, err, "link_hello join");
	/* a resume takes over a running link; a new link replaces none; a
	 * resume never asks for frames after the last one sent */
	FUZZ_CHECK(rc || (h->resume ? v.resumable && h->last_seq <= v.tx_seq : !v.exists));
}

/* recv.c dispatch (dialer, a first link) and rendezvous.c rdv_link_resumed */
static void link_answer(const struct wire_self *s, unsigned st, const Meshrun__LinkHello *h)
{
	char err[600] = "";
	bool was_up = st & CTL_WAS_UP;
	int rc = wire_check_link_answer(s, LM_PEER, "127.0.0.1:7000", 0, was_up, h, err,
					sizeof(err));
	checked(rc, -EBADMSG, 0, err, "link_hello answer");
	FUZZ_CHECK(rc || ((int)h->host_id == LM_PEER && h->job_id == s->job_id &&
			  (!was_up || h->resume) && h->stream == 0));
	if (rc || !was_up)
		return;
	rc = wire_check_resume_seq(h->host_id, h->last_seq, CTL_TX_SEQ, err, sizeof(err));
	checked(rc, -EBADMSG, 0, err, "link_hello resume");
	FUZZ_CHECK(rc || h->last_seq <= CTL_TX_SEQ);
}

/* recv.c dispatch before the hello */
static void hello_stage(const struct wire_self *s, unsigned st, const Meshrun__Frame *f)
{
	char err[600] = "";
	enum link_role role = CTL_ROLE(st);
	int rc = wire_check_hello_stage(role, f->body_case, err, sizeof(err));
	checked(rc, -EBADMSG, 0, err, "before the hello");
	/* a Refuse or (to an agent, the coordinator's deadline) an Abort
	 * carries only text and a class, which recv.c prints sanitized */
	if (rc || f->body_case == MESHRUN__FRAME__BODY_REFUSE ||
	    f->body_case == MESHRUN__FRAME__BODY_ABORT)
		return;
	switch (role) {
	case ROLE_COORD_IN:
		coord_hello(s, st, f->hello);
		break;
	case ROLE_COORD_OUT:
		agent_topology(s, f->topology);
		break;
	case ROLE_LINK_IN:
		accept_link_hello(s, st, f->link_hello);
		break;
	case ROLE_LINK_OUT:
		link_answer(s, st, f->link_hello);
		break;
	}
}

/* The link's running stage, through the link model (a control body f, or
 * a data frame d): 0 if its payload is to be fed to the model. */
static int running(const Meshrun__Frame *f, const struct frame_data *d, const uint8_t *body,
		   size_t blen, uint64_t plen)
{
	char why[600] = "";
	struct lm *m = lm_new();
	int rc = f ? lm_body(m, f, why, sizeof(why)) : lm_data_body(m, d, plen, why, sizeof(why));
	checked(rc, -EBADMSG, 0, why, "running link");
	if (rc == 0 && plen) {
		/* the payload: the body's own bytes, repeated */
		uint8_t *p = malloc((size_t)plen);
		FUZZ_CHECK(p);
		for (size_t i = 0; i < plen; i++)
			p[i] = blen ? body[i % blen] : (uint8_t)i;
		lm_payload(m, p, (size_t)plen);
		free(p);
	}
	if (rc == 0)
		lm_payload_done(m);
	lm_free(m);
	return rc;
}

/* The sequence check a frame meets on a link in state st (recv.c
 * header_done); its class, after the properties are checked. */
static int sequence(unsigned st, int body, uint64_t link_seq, uint64_t ack_seq,
		    struct wire_rx_seq *rs)
{
	char why[600] = "";
	bool run = st & CTL_RUNNING, ran = run || (st & CTL_WAS_UP);
	*rs = (struct wire_rx_seq){ .replay = st & CTL_REPLAY, .hello = !run, .acks = run,
				    .rx_seq = ran ? CTL_RX_SEQ : 0, .tx_seq = ran ? CTL_TX_SEQ : 0,
				    .part_seq = (st & CTL_PART) && ran ? CTL_RX_SEQ + 1 : 0 };
	int k = wire_check_seq(rs, body, link_seq, ack_seq, why, sizeof(why));
	checked(k < 0 ? k : 0, -EBADMSG, 0, why, "sequence");
	FUZZ_CHECK(k <= WIRE_SEQ_PART);
	FUZZ_CHECK(k != WIRE_SEQ_NEXT || link_seq == rs->rx_seq + 1);
	FUZZ_CHECK(k != WIRE_SEQ_SKIP || body == MESHRUN__FRAME__BODY_ACK ||
		   (link_seq && link_seq <= rs->rx_seq));
	FUZZ_CHECK(k != WIRE_SEQ_RESUME_HELLO || (rs->replay && !run && link_seq == 0));
	/* what recv.c then passes to link_acked */
	FUZZ_CHECK(k < 0 || !rs->replay || !rs->acks || ack_seq <= rs->tx_seq);
	return k;
}

/* A data frame: its binary header from the body, through frame_parse_data,
 * the sequence check and, on a running link, the link model. */
static void data_frame(unsigned st, uint64_t link_seq, uint64_t ack_seq, const uint8_t *body,
		       size_t blen)
{
	uint8_t hdr[FRAME_DATA_HDR] = { 0 };
	memcpy(hdr, body, blen < sizeof(hdr) ? blen : sizeof(hdr));
	/* the link's numbers, where the control kinds take theirs */
	for (int i = 0; i < 8; i++) {
		hdr[i] = (uint8_t)(link_seq >> (8 * i));
		hdr[8 + i] = (uint8_t)(ack_seq >> (8 * i));
	}
	uint64_t msg = 0, off = 0;
	for (int i = 7; i >= 0; i--) {
		msg = msg << 8 | hdr[24 + i];
		off = off << 8 | hdr[32 + i];
	}
	uint64_t plen = blen >= sizeof(hdr) + 2 ? (uint64_t)(body[sizeof(hdr)] | body[sizeof(hdr) + 1] << 8)
		      : msg >= off ? msg - off : 0;
	struct frame_data d;
	char why[600] = "";
	int rc = frame_parse_data(hdr, sizeof(hdr), plen, &lim, &d, why, sizeof(why));
	checked(rc, -EPROTO, 0, why, "data header");
	if (rc)
		return;
	FUZZ_CHECK(d.link_seq == link_seq && d.ack_seq == ack_seq);
	struct wire_rx_seq rs;
	int k = sequence(st, MESHRUN__FRAME__BODY_CHUNK, link_seq, ack_seq, &rs);
	/* data before the hello is a bad frame (recv.c data_header_done) */
	if (k == WIRE_SEQ_NEXT && (st & CTL_RUNNING) && plen <= MAX_PAYLOAD)
		running(NULL, &d, body, blen, plen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t hash[WIRE_HASH_LEN];
	char why[600];
	if (size < 4 || size > 4096)
		return 0;
	unsigned field = MESHRUN__FRAME__BODY_HELLO + data[0] % 11; /* fields 10..20 */
	unsigned st = data[1];
	uint64_t link_seq = data[2], ack_seq = data[3];
	const uint8_t *body = data + 4;
	size_t blen = size - 4;
	if (field == MESHRUN__FRAME__BODY_CHUNK) {
		data_frame(st, link_seq, ack_seq, body, blen);
		return 0;
	}

	uint8_t *hdr = malloc(blen + 32);
	FUZZ_CHECK(hdr);
	size_t hl = 0;
	hdr[hl++] = 0x08;                 /* link_seq */
	hl += put_varint(hdr + hl, link_seq);
	hdr[hl++] = 0x10;                 /* ack_seq */
	hl += put_varint(hdr + hl, ack_seq);
	hl += put_varint(hdr + hl, (uint64_t)field << 3 | 2);
	hl += put_varint(hdr + hl, blen);
	memcpy(hdr + hl, body, blen);
	hl += blen;

	why[0] = 0;
	Meshrun__Frame *f = frame_parse_header(hdr, hl, 0, &lim, why, sizeof(why));
	free(hdr);
	if (!f) {
		FUZZ_CHECK(why[0]);
		fuzz_note("header", why);
		return 0;
	}
	FUZZ_CHECK((unsigned)f->body_case == field && f->link_seq == link_seq &&
		   f->ack_seq == ack_seq);

	/* recv.c header_done: the sequence check for this link's state */
	bool run = st & CTL_RUNNING;
	struct wire_rx_seq rs;
	int k = sequence(st, f->body_case, f->link_seq, f->ack_seq, &rs);
	if (k == WIRE_SEQ_NEXT || k == WIRE_SEQ_RESUME_HELLO) {
		memset(hash, LM_CONFIG_HASH_BYTE, sizeof(hash));
		struct wire_self s = { .host_id = LM_HOST_ID, .num_hosts = LM_NUM_HOSTS,
				       .devices_per_host = 2, .config_hash = hash,
				       .job_id = LM_JOB_ID, .addr_max = LM_ADDR_MAX };
		if (!run || k == WIRE_SEQ_RESUME_HELLO)
			hello_stage(&s, st, f);
		else
			running(f, NULL, body, blen, 0);
	}
	frame_header_free(f);
	return 0;
}
