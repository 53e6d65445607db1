/* The net thread: rendezvous, links, barrier, the xport data path,
 * heartbeats, failure and clean shutdown; see net/net.h.
 *
 * Every connection is a struct link driven by two libevent events on its
 * non-blocking socket (read always armed, write armed while output is
 * queued). SSL_read/SSL_write are called directly: payloads are decrypted
 * straight into the posted receive buffer and encrypted straight from the
 * send buffer (no evbuffer, no staging copy of plaintext); only the
 * ciphertext is batched, by the socket BIO of net/conn.c. Links are never
 * freed inside their own callbacks: link_kill() marks them dead and the
 * reap event frees them. */
#include "net/net.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <openssl/rand.h>

#include "net/conn.h"
#include "net/frame.h"
#include "net/tls.h"

#define TICK_MS        50
/* Bytes per read or write callback before yielding to the poll. Reading
 * gets the larger turn: on a link busy both ways, 1 MiB turns each way
 * (or 8 MiB each way) measured 15-20% slower than this; a receiver that
 * lets its socket fill seems to stall its sender. */
#define READ_BUDGET    (1u << 23)
#define WRITE_BUDGET   (1u << 20)
#define FRAG_MAX       (1u << 20)      /* largest data fragment we write */
#define SMALL_PAYLOAD  (16384 - 256)   /* payloads copied into the header's record */
#define CLOSE_GRACE_NS (1000ull * 1000 * 1000)
#define RETRY_NS       (100ull * 1000 * 1000)
#define ACCEPT_MAX     64

enum role { ROLE_COORD_IN, ROLE_COORD_OUT, ROLE_LINK_IN, ROLE_LINK_OUT };
enum lstate { LS_CONNECTING, LS_HANDSHAKE, LS_HELLO, LS_UP, LS_CLOSING, LS_DRAIN, LS_DEAD };
enum rxstage { RX_PREFIX, RX_HEADER, RX_PAYLOAD };
enum phase {
	PH_INIT, PH_RENDEZVOUS, PH_LINKS, PH_BARRIER, PH_RUNNING, PH_FINISHING,
	PH_CLOSING, PH_FAILED,
};

struct ctrl_frame {
	struct ctrl_frame *next;
	size_t len;
	bool heartbeat;
	uint8_t data[];
};

struct send_msg {
	struct send_msg *next;
	struct xreq *req;      /* NULL once completed */
	uint64_t off;          /* next fragment */
};

struct net;

struct link {
	struct net *net;
	struct link *next;             /* n->links list */
	enum role role;
	enum lstate state;
	int peer;                      /* host id, -1 until known */
	char addr[128];
	struct conn *c;
	struct event *ev_read, *ev_write;
	struct event *ev_resume;       /* zero timeout: read on after the next poll */
	bool write_armed, rd_wants_write, wr_wants_read;
	bool refused;                  /* a refusal was logged already */
	uint64_t deadline_ns;          /* handshake/hello or close deadline */
	uint64_t last_rx_ns, last_hb_ns;
	uint64_t tx_seq, rx_seq;

	/* receive */
	enum rxstage rx_stage;
	uint8_t rx_prefix[FRAME_PREFIX_LEN];
	struct frame_prefix rx_p;
	size_t rx_got;
	uint8_t *rx_hdr;
	size_t rx_hdr_cap;
	uint8_t *rx_dst;               /* payload destination, NULL: discard */
	struct xreq *rx_req;           /* message in progress */
	int rx_src, rx_dst_dev;
	uint64_t rx_tag, rx_total, rx_next;
	/* a receive that sums (rx_req->addend): the payload goes through the
	 * net thread's bounce buffer and lands a float at a time */
	struct xland rx_land;

	/* send */
	struct ctrl_frame *cq_head, *cq_tail;
	struct send_msg *dq_head, *dq_tail;
	int hb_queued;
	bool tx_active;
	const uint8_t *tx_hdr;
	size_t tx_hdr_len, tx_hdr_off;
	const uint8_t *tx_pay;         /* NULL while tx_pay_len > 0: zero fill */
	uint64_t tx_pay_len, tx_pay_off;
	struct ctrl_frame *tx_ctrl;
	struct send_msg *tx_msg;
	bool tx_msg_last;
	uint8_t *tx_stage;             /* header (+ small payload) of a data frame */
};

struct peer {
	struct link *l;
	char addr[128];                /* data address from Topology */
	uint32_t devices;
	bool joined;                   /* coordinator: Hello accepted */
	struct link *coord_in;         /* coordinator: its rendezvous connection */
	bool barrier_rx, done_rx;
	uint64_t retry_at;
	_Atomic uint64_t frames_tx, frames_rx;
};

enum cmd_kind { CMD_RR, CMD_SEND, CMD_FINISH, CMD_ABORT, CMD_STOP };

struct cmd {
	struct cmd *next;
	enum cmd_kind kind;
	int src, dst;
	uint64_t tag;
	uint64_t len;
	struct xreq *req;
	int status;
	char msg[];
};

struct net {
	int host_id, num_hosts, devices_per_host;
	char coordinator[256], listen[256], certs_dir[4096];
	double connect_timeout_s, done_timeout_s;
	uint64_t hb_interval_ns, hb_timeout_ns;
	uint8_t config_hash[32];
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	struct frame_limits lim;

	SSL_CTX *ctx;
	struct xport *x;
	struct event_base *base;
	struct event *ev_cmd, *ev_tick, *ev_reap, *ev_coord_l, *ev_data_l;
	int coord_lfd, data_lfd;
	char data_addr[128];
	pthread_t thread;
	bool thread_started;

	enum phase phase;
	uint64_t phase_deadline_ns, finish_deadline_ns, stop_deadline_ns;
	bool stopping;
	uint64_t job_id;
	struct peer *peers;
	int joined;
	struct link *links;
	struct link *coord;            /* agent: connection to the coordinator */
	uint64_t coord_retry_at;
	char coord_err[256];
	bool topology_done;

	pthread_mutex_t mu;            /* guards the fields below */
	pthread_cond_t cv;
	int status;
	char msg[512];
	bool ready, closed;
	struct cmd *cmd_head, *cmd_tail;

	_Atomic uint64_t bytes_sent;
	_Atomic uint64_t key_updates;
	uint64_t key_update_bytes;
	_Atomic uint32_t last_op;
	_Atomic uint64_t last_step;
};

static const uint8_t zeros[64 * 1024];

static uint64_t now_ns(void)
{
	return xport_now_ns();
}

static uint64_t sec_ns(double s)
{
	return s <= 0 ? 0 : (uint64_t)(s * 1e9);
}

static void net_log(struct net *n, const char *fmt, ...)
{
	char line[768];
	int used = snprintf(line, sizeof(line), "host %d: ", n->host_id);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + used, sizeof(line) - (size_t)used, fmt, ap);
	va_end(ap);
	if (n->log)
		n->log(n->log_ctx, line);
	else
		fprintf(stderr, "meshrun: %s\n", line);
}

static const char *op_name(uint32_t op)
{
	switch (op) {
	case MESHRUN__COLL_OP__COLL_ALL_GATHER: return "all_gather";
	case MESHRUN__COLL_OP__COLL_REDUCE_SCATTER: return "reduce_scatter";
	case MESHRUN__COLL_OP__COLL_ALL_REDUCE: return "all_reduce";
	case MESHRUN__COLL_OP__COLL_ALL_TO_ALL: return "all_to_all";
	case MESHRUN__COLL_OP__COLL_PERMUTE: return "permute";
	case MESHRUN__COLL_OP__COLL_BROADCAST: return "broadcast";
	case MESHRUN__COLL_OP__COLL_BARRIER: return "barrier";
	case MESHRUN__COLL_OP__COLL_P2P: return "p2p";
	default: return NULL;
	}
}

/* " during all_reduce step 3", or "" before any traffic. */
static void activity(struct net *n, char *buf, size_t len)
{
	const char *name = op_name(atomic_load_explicit(&n->last_op, memory_order_relaxed));
	if (name)
		snprintf(buf, len, " during %s step %llu", name,
			 (unsigned long long)atomic_load_explicit(&n->last_step, memory_order_relaxed));
	else
		buf[0] = 0;
}

/* ---- fault hook ---- */

int net_fault_hook(struct net *n, int peer, bool outgoing, const Meshrun__Frame *f)
{
	(void)f;
	if (peer < 0 || peer >= n->num_hosts)
		return 0;
	if (outgoing)
		atomic_fetch_add_explicit(&n->peers[peer].frames_tx, 1, memory_order_relaxed);
	else
		atomic_fetch_add_explicit(&n->peers[peer].frames_rx, 1, memory_order_relaxed);
	return 0;
}

void net_frame_counts(struct net *n, int peer, uint64_t *sent, uint64_t *received)
{
	*sent = *received = 0;
	if (peer < 0 || peer >= n->num_hosts)
		return;
	*sent = atomic_load_explicit(&n->peers[peer].frames_tx, memory_order_relaxed);
	*received = atomic_load_explicit(&n->peers[peer].frames_rx, memory_order_relaxed);
}

/* ---- status shared with the control thread ---- */

static void set_ready(struct net *n)
{
	pthread_mutex_lock(&n->mu);
	n->ready = true;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
}

static void set_closed(struct net *n)
{
	pthread_mutex_lock(&n->mu);
	n->closed = true;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
}

/* First failure wins; true if this call recorded it. */
static bool record_failure(struct net *n, int status, const char *msg)
{
	bool first = false;
	pthread_mutex_lock(&n->mu);
	if (!n->status) {
		n->status = status ? status : NET_ERR;
		snprintf(n->msg, sizeof(n->msg), "%s", msg);
		first = true;
	}
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
	return first;
}

static int failed_status(struct net *n)
{
	pthread_mutex_lock(&n->mu);
	int s = n->status;
	pthread_mutex_unlock(&n->mu);
	return s;
}

/* ---- links: creation, teardown ---- */

static void link_event_cb(evutil_socket_t fd, short what, void *arg);
static void link_resume_cb(evutil_socket_t fd, short what, void *arg);
static void link_write(struct link *l);
static void link_read(struct link *l);
static void net_fail(struct net *n, int status, int rc, const char *msg);
static void link_begin_close(struct link *l, uint64_t deadline);
static void bad_frame(struct link *l, const char *reason);

static struct link *link_new(struct net *n, enum role role, struct conn *c, int peer,
			     const char *addr)
{
	struct link *l = calloc(1, sizeof(*l));
	if (!l) {
		conn_free(c);
		return NULL;
	}
	l->net = n;
	l->role = role;
	l->c = c;
	l->peer = peer;
	snprintf(l->addr, sizeof(l->addr), "%s", addr);
	l->ev_read = event_new(n->base, c->fd, EV_READ | EV_PERSIST, link_event_cb, l);
	l->ev_write = event_new(n->base, c->fd, EV_WRITE | EV_PERSIST, link_event_cb, l);
	l->ev_resume = evtimer_new(n->base, link_resume_cb, l);
	l->tx_stage = malloc(FRAME_PREFIX_LEN + 1024 + SMALL_PAYLOAD);
	if (!l->ev_read || !l->ev_write || !l->ev_resume || !l->tx_stage) {
		if (l->ev_read)
			event_free(l->ev_read);
		if (l->ev_write)
			event_free(l->ev_write);
		if (l->ev_resume)
			event_free(l->ev_resume);
		free(l->tx_stage);
		conn_free(c);
		free(l);
		return NULL;
	}
	l->last_rx_ns = l->last_hb_ns = now_ns();
	l->next = n->links;
	n->links = l;
	return l;
}

static void arm_write(struct link *l)
{
	if (!l->write_armed && l->state != LS_DEAD) {
		event_add(l->ev_write, NULL);
		l->write_armed = true;
	}
}

static void disarm_write(struct link *l)
{
	if (l->write_armed) {
		event_del(l->ev_write);
		l->write_armed = false;
	}
}

/* Lets go of every request the link holds: each completes with rc. After
 * this the link never touches a user buffer again: a half-written payload
 * continues as zeros (so the stream stays framed for the Abort behind it)
 * and a half-read one is discarded. */
static void link_release_reqs(struct link *l, int rc)
{
	struct send_msg *m;
	if (l->tx_msg) {
		if (l->tx_msg->req) {
			xport_complete(l->tx_msg->req, rc);
			l->tx_msg->req = NULL;
		}
		l->tx_pay = NULL;
		/* a message with fragments still to come is also on the data
		 * queue and is freed with it below */
		if (!l->tx_msg_last)
			l->tx_msg = NULL;
	}
	while ((m = l->dq_head)) {
		l->dq_head = m->next;
		if (m->req)
			xport_complete(m->req, rc);
		free(m);
	}
	l->dq_tail = NULL;
	if (l->rx_req) {
		xport_complete(l->rx_req, rc);
		l->rx_req = NULL;
		l->rx_dst = NULL;
	}
}

static void link_kill(struct link *l)
{
	struct net *n = l->net;
	if (l->state == LS_DEAD)
		return;
	l->state = LS_DEAD;
	event_del(l->ev_read);
	event_del(l->ev_resume);
	disarm_write(l);
	link_release_reqs(l, failed_status(n) ? -ECANCELED : -EPIPE);
	if (l->peer >= 0 && l->peer < n->num_hosts) {
		if (n->peers[l->peer].l == l)
			n->peers[l->peer].l = NULL;
		if (n->peers[l->peer].coord_in == l)
			n->peers[l->peer].coord_in = NULL;
	}
	if (n->coord == l)
		n->coord = NULL;
	event_active(n->ev_reap, EV_READ, 0);
}

static void link_free(struct link *l)
{
	struct ctrl_frame *c;
	struct send_msg *m;
	event_free(l->ev_read);
	event_free(l->ev_write);
	event_free(l->ev_resume);
	conn_free(l->c);
	while ((c = l->cq_head)) {
		l->cq_head = c->next;
		free(c);
	}
	while ((m = l->dq_head)) {
		l->dq_head = m->next;
		free(m);
	}
	if (l->tx_ctrl)
		free(l->tx_ctrl);
	if (l->tx_msg && l->tx_msg_last)
		free(l->tx_msg);
	free(l->tx_stage);
	free(l->rx_hdr);
	free(l);
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	(void)fd;
	(void)what;
	struct link **pp = &n->links;
	while (*pp) {
		struct link *l = *pp;
		if (l->state == LS_DEAD) {
			*pp = l->next;
			link_free(l);
		} else {
			pp = &l->next;
		}
	}
	if (!n->links && (n->phase == PH_CLOSING || n->phase == PH_FAILED))
		set_closed(n);
	if (!n->links && n->stopping)
		event_base_loopbreak(n->base);
}

/* ---- sending ---- */

/* Queues a control frame; fills its sequence numbers. 0 or -ENOMEM. */
static int link_send(struct link *l, Meshrun__Frame *f)
{
	if (l->state == LS_DEAD || l->state == LS_DRAIN)
		return -EPIPE;
	f->link_seq = ++l->tx_seq;
	f->ack_seq = l->rx_seq;
	net_fault_hook(l->net, l->peer, true, f);
	size_t len = frame_encoded_len(f);
	struct ctrl_frame *c = malloc(sizeof(*c) + len);
	if (!c)
		return -ENOMEM;
	c->next = NULL;
	c->len = frame_encode(f, 0, c->data);
	c->heartbeat = f->body_case == MESHRUN__FRAME__BODY_HEARTBEAT;
	if (!c->len) {
		free(c);
		return -EMSGSIZE;
	}
	if (c->heartbeat)
		l->hb_queued++;
	if (l->cq_tail)
		l->cq_tail->next = c;
	else
		l->cq_head = c;
	l->cq_tail = c;
	arm_write(l);
	return 0;
}

static void send_refuse(struct link *l, const char *reason)
{
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Refuse r = MESHRUN__REFUSE__INIT;
	r.reason = (char *)reason;
	f.body_case = MESHRUN__FRAME__BODY_REFUSE;
	f.refuse = &r;
	link_send(l, &f);
}

static void send_simple(struct link *l, int body)
{
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Heartbeat hb = MESHRUN__HEARTBEAT__INIT;
	Meshrun__Barrier b = MESHRUN__BARRIER__INIT;
	Meshrun__Done d = MESHRUN__DONE__INIT;
	f.body_case = body;
	switch (body) {
	case MESHRUN__FRAME__BODY_HEARTBEAT:
		hb.sent_ns = now_ns();
		f.heartbeat = &hb;
		break;
	case MESHRUN__FRAME__BODY_BARRIER:
		b.seq = 1;
		f.barrier = &b;
		break;
	case MESHRUN__FRAME__BODY_DONE:
		d.host_id = (uint32_t)l->net->host_id;
		f.done = &d;
		break;
	default:
		return;
	}
	link_send(l, &f);
}

static void send_link_hello(struct link *l)
{
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__LinkHello h = MESHRUN__LINK_HELLO__INIT;
	h.host_id = (uint32_t)l->net->host_id;
	h.job_id = l->net->job_id;
	f.body_case = MESHRUN__FRAME__BODY_LINK_HELLO;
	f.link_hello = &h;
	link_send(l, &f);
}

/* Picks the next frame to write: control frames first, then the next
 * fragment of the first queued message. false if there is nothing. */
static bool tx_next(struct link *l)
{
	struct ctrl_frame *c = l->cq_head;
	if (c) {
		l->cq_head = c->next;
		if (!l->cq_head)
			l->cq_tail = NULL;
		l->tx_ctrl = c;
		l->tx_hdr = c->data;
		l->tx_hdr_len = c->len;
		l->tx_hdr_off = 0;
		l->tx_pay = NULL;
		l->tx_pay_len = l->tx_pay_off = 0;
		l->tx_active = true;
		return true;
	}
	struct send_msg *m = l->dq_head;
	if (!m || l->state != LS_UP)
		return false;
	struct xreq *r = m->req;
	uint64_t left = r->len - m->off;
	uint64_t cnt = left < FRAG_MAX ? left : FRAG_MAX;
	if (cnt > l->net->lim.max_payload)
		cnt = l->net->lim.max_payload;

	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__CollectiveChunk ch = MESHRUN__COLLECTIVE_CHUNK__INIT;
	ch.op = (Meshrun__CollOp)r->meta.op;
	ch.group_id = r->meta.group;
	ch.coll_seq = r->meta.seq;
	ch.step = r->meta.step;
	ch.src_device = (uint32_t)r->src;
	ch.dst_device = (uint32_t)r->dst;
	ch.chunk_index = r->meta.chunk;
	ch.offset = r->meta.offset;
	ch.byte_count = cnt;
	ch.tag = r->tag;
	ch.msg_bytes = r->len;
	ch.msg_offset = m->off;
	ch.eager = r->eager;
	f.body_case = MESHRUN__FRAME__BODY_CHUNK;
	f.chunk = &ch;
	f.link_seq = ++l->tx_seq;
	f.ack_seq = l->rx_seq;
	net_fault_hook(l->net, l->peer, true, &f);
	size_t hl = frame_encode(&f, cnt, l->tx_stage);
	l->tx_hdr = l->tx_stage;
	l->tx_hdr_off = 0;
	if (cnt <= SMALL_PAYLOAD) {
		/* one record for header and payload */
		if (cnt)
			memcpy(l->tx_stage + hl, (const uint8_t *)r->buf + m->off, cnt);
		l->tx_hdr_len = hl + cnt;
		l->tx_pay = NULL;
		l->tx_pay_len = 0;
	} else {
		l->tx_hdr_len = hl;
		l->tx_pay = (const uint8_t *)r->buf + m->off;
		l->tx_pay_len = cnt;
	}
	l->tx_pay_off = 0;
	m->off += cnt;
	l->tx_msg = m;
	l->tx_msg_last = m->off == r->len;
	if (l->tx_msg_last) {
		l->dq_head = m->next;
		if (!l->dq_head)
			l->dq_tail = NULL;
	}
	l->tx_active = true;
	return true;
}

static void tx_frame_done(struct link *l)
{
	if (l->tx_ctrl) {
		if (l->tx_ctrl->heartbeat)
			l->hb_queued--;
		free(l->tx_ctrl);
		l->tx_ctrl = NULL;
	}
	if (l->tx_msg && l->tx_msg_last) {
		if (l->tx_msg->req)
			xport_complete(l->tx_msg->req, 0);
		free(l->tx_msg);
	}
	l->tx_msg = NULL;
	l->tx_active = false;
}

static void link_lost(struct link *l, int rc, const char *reason);

/* Writing failed (the peer closed or reset). A peer that leaves on purpose
 * says why first (Abort, Done): read what it sent before blaming it. */
static void link_write_failed(struct link *l)
{
	char why[256];
	snprintf(why, sizeof(why), "%s", l->c->err);
	if (l->state != LS_DRAIN)
		link_read(l);
	if (l->state != LS_DEAD)
		link_lost(l, -EPIPE, why);
}

/* Writes queued frames until the socket is full or the budget is spent. */
static void link_write(struct link *l)
{
	struct net *n = l->net;
	size_t budget = WRITE_BUDGET;

	while (budget) {
		if (l->state == LS_DEAD || l->state == LS_DRAIN)
			return;
		if (!l->tx_active && !tx_next(l)) {
			int frc = conn_flush(l->c);
			if (frc == -EAGAIN) {
				arm_write(l);
				return;
			}
			if (frc < 0) {
				link_write_failed(l);
				return;
			}
			if (l->state == LS_CLOSING) {
				int rc = conn_shutdown(l->c);
				if (rc == -EAGAIN) {
					if (l->c->want == CONN_WANT_READ)
						l->wr_wants_read = true;
					return;
				}
				disarm_write(l);
				/* after a failure nobody waits for the peer's goodbye */
				if (failed_status(n) || n->stopping)
					link_kill(l);
				else
					l->state = LS_DRAIN;
				return;
			}
			disarm_write(l);
			return;
		}
		const uint8_t *src;
		size_t len;
		bool hdr = l->tx_hdr_off < l->tx_hdr_len;
		if (hdr) {
			src = l->tx_hdr + l->tx_hdr_off;
			len = l->tx_hdr_len - l->tx_hdr_off;
		} else if (l->tx_pay_off < l->tx_pay_len) {
			len = (size_t)(l->tx_pay_len - l->tx_pay_off);
			if (l->tx_pay) {
				src = l->tx_pay + l->tx_pay_off;
			} else {
				src = zeros;
				if (len > sizeof(zeros))
					len = sizeof(zeros);
			}
		} else {
			tx_frame_done(l);
			continue;
		}
		ssize_t w = conn_write(l->c, src, len);
		if (w == -EAGAIN) {
			conn_flush(l->c);
			if (l->c->want == CONN_WANT_READ) {
				l->wr_wants_read = true;
				disarm_write(l);
			} else {
				arm_write(l);
			}
			return;
		}
		if (w < 0) {
			link_write_failed(l);
			return;
		}
		if (hdr)
			l->tx_hdr_off += (size_t)w;
		else
			l->tx_pay_off += (uint64_t)w;
		atomic_fetch_add_explicit(&n->bytes_sent, (uint64_t)w, memory_order_relaxed);
		budget = (size_t)w >= budget ? 0 : budget - (size_t)w;
	}
	/* budget spent: the write event stays armed and the loop comes back */
	int frc = conn_flush(l->c);
	if (frc < 0 && frc != -EAGAIN) {
		link_write_failed(l);
		return;
	}
	arm_write(l);
}

/* ---- failure ---- */

static void peer_desc(struct link *l, char *buf, size_t len)
{
	struct net *n = l->net;
	if (l->peer >= 0 && l->peer < n->num_hosts)
		snprintf(buf, len, "host %d (%s)", l->peer, l->addr);
	else
		snprintf(buf, len, "%s", l->addr);
}

static void net_fail(struct net *n, int status, int rc, const char *msg)
{
	if (!record_failure(n, status, msg))
		return;
	if (n->x)
		xport_fail(n->x, rc, msg);
	n->phase = PH_FAILED;
	uint64_t deadline = now_ns() + CLOSE_GRACE_NS;
	for (struct link *l = n->links; l; l = l->next) {
		if (l->state == LS_DEAD)
			continue;
		link_release_reqs(l, rc);
		if (l->state == LS_UP) {
			Meshrun__Frame f = MESHRUN__FRAME__INIT;
			Meshrun__Abort a = MESHRUN__ABORT__INIT;
			a.host_id = (uint32_t)n->host_id;
			a.reason = (char *)msg;
			a.code = status;
			f.body_case = MESHRUN__FRAME__BODY_ABORT;
			f.abort = &a;
			link_send(l, &f);
		}
		link_begin_close(l, deadline);
	}
	if (!n->links)
		set_closed(n);
	event_active(n->ev_reap, EV_READ, 0);
}

/* A link broke (EOF, I/O error, bad frame, silence). Whether that is a
 * failure of the job depends on what the link was for. */
static void link_lost(struct link *l, int rc, const char *reason)
{
	struct net *n = l->net;
	char who[200], during[96], msg[512];

	if (l->state == LS_DEAD)
		return;
	peer_desc(l, who, sizeof(who));
	bool quiet = l->state == LS_CLOSING || l->state == LS_DRAIN || failed_status(n);

	switch (l->role) {
	case ROLE_COORD_IN:
		if (!quiet && l->peer >= 0 && n->peers[l->peer].coord_in == l && !n->topology_done) {
			snprintf(msg, sizeof(msg), "lost host %d (%s) during rendezvous: %s",
				 l->peer, l->addr, reason);
			link_kill(l);
			net_fail(n, NET_ERR_PEER_LOST, rc, msg);
			return;
		}
		if (!quiet && l->peer < 0 && !l->refused)
			net_log(n, "refused connection from %s: %s", l->addr, reason);
		link_kill(l);
		return;
	case ROLE_COORD_OUT:
		if (quiet || n->topology_done) {
			link_kill(l);
			return;
		}
		snprintf(msg, sizeof(msg), "lost the coordinator (%s) during rendezvous: %s",
			 l->addr, reason);
		link_kill(l);
		net_fail(n, NET_ERR_PEER_LOST, rc, msg);
		return;
	case ROLE_LINK_IN:
		if (l->state != LS_UP && l->peer < 0) {
			if (!quiet && !l->refused)
				net_log(n, "refused link from %s: %s", l->addr, reason);
			link_kill(l);
			return;
		}
		break;
	case ROLE_LINK_OUT:
		break;
	}
	if (quiet || (l->peer >= 0 && n->peers[l->peer].done_rx)) {
		link_kill(l);
		return;
	}
	activity(n, during, sizeof(during));
	if (l->state == LS_UP)
		snprintf(msg, sizeof(msg), "lost %s: %s%s", who, reason, during);
	else
		snprintf(msg, sizeof(msg), "link to %s failed: %s", who, reason);
	link_kill(l);
	net_fail(n, NET_ERR_PEER_LOST, rc, msg);
}

static void link_begin_close(struct link *l, uint64_t deadline)
{
	if (l->state == LS_DEAD || l->state == LS_CLOSING || l->state == LS_DRAIN)
		return;
	if (l->state == LS_CONNECTING || l->state == LS_HANDSHAKE) {
		link_kill(l);
		return;
	}
	l->state = LS_CLOSING;
	l->deadline_ns = deadline;
	arm_write(l);
}

/* ---- rendezvous: coordinator side ---- */

static void hex8(const uint8_t *h, size_t len, char *out)
{
	static const char d[] = "0123456789abcdef";
	size_t i;
	for (i = 0; i < 4 && i < len; i++) {
		out[2 * i] = d[h[i] >> 4];
		out[2 * i + 1] = d[h[i] & 15];
	}
	out[2 * i] = 0;
}

/* Refuses one connection; the rendezvous goes on. */
static void refuse_conn(struct link *l, const char *reason)
{
	struct net *n = l->net;
	net_log(n, "refused %s from %s: %s",
		l->role == ROLE_COORD_IN ? "agent" : "link", l->addr, reason);
	l->refused = true;
	l->peer = -1;
	send_refuse(l, reason);
	link_begin_close(l, now_ns() + CLOSE_GRACE_NS);
}

/* A mismatch that no waiting can fix: refuse everyone and fail. */
static void rendezvous_fail(struct net *n, struct link *l, const char *reason)
{
	char msg[600];
	snprintf(msg, sizeof(msg), "rendezvous failed: %s", reason);
	refuse_conn(l, reason);
	for (int h = 1; h < n->num_hosts; h++) {
		struct link *o = n->peers[h].coord_in;
		if (o && o != l && o->state != LS_DEAD)
			send_refuse(o, msg);
	}
	net_fail(n, NET_ERR_REFUSED, -ECONNREFUSED, msg);
}

static void start_links(struct net *n);

static void send_topology(struct net *n)
{
	Meshrun__HostInfo *infos = calloc((size_t)n->num_hosts, sizeof(*infos));
	Meshrun__HostInfo **ptrs = calloc((size_t)n->num_hosts, sizeof(*ptrs));
	if (!infos || !ptrs) {
		free(infos);
		free(ptrs);
		net_fail(n, NET_ERR, -ENOMEM, "out of memory sending the topology");
		return;
	}
	for (int h = 0; h < n->num_hosts; h++) {
		Meshrun__HostInfo init = MESHRUN__HOST_INFO__INIT;
		infos[h] = init;
		infos[h].host_id = (uint32_t)h;
		infos[h].data_address = n->peers[h].addr;
		infos[h].devices = n->peers[h].devices;
		ptrs[h] = &infos[h];
	}
	Meshrun__Topology t = MESHRUN__TOPOLOGY__INIT;
	t.n_hosts = (size_t)n->num_hosts;
	t.hosts = ptrs;
	t.job_id = n->job_id;
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	f.body_case = MESHRUN__FRAME__BODY_TOPOLOGY;
	f.topology = &t;
	for (int h = 1; h < n->num_hosts; h++) {
		struct link *l = n->peers[h].coord_in;
		if (!l)
			continue;
		link_send(l, &f);
		link_begin_close(l, now_ns() + sec_ns(n->connect_timeout_s));
	}
	free(infos);
	free(ptrs);
	n->topology_done = true;
	start_links(n);
}

static void coord_on_hello(struct link *l, const Meshrun__Hello *h)
{
	struct net *n = l->net;
	char why[400], a[16], b[16];
	int id = (int)h->host_id;

	if (l->peer >= 0) {
		bad_frame(l, "second hello on one connection");
		return;
	}
	if (!tls_peer_is_host(l->c->ssl, id, why, sizeof(why))) {
		refuse_conn(l, why);
		return;
	}
	if (id <= 0 || id >= n->num_hosts) {
		if (id == 0)
			snprintf(why, sizeof(why), "duplicate host id 0: host 0 is the coordinator");
		else
			snprintf(why, sizeof(why), "host id %d is out of range: the cluster has %d hosts (0..%d)",
				 id, n->num_hosts, n->num_hosts - 1);
		refuse_conn(l, why);
		return;
	}
	if (n->topology_done && !n->peers[id].joined) {
		snprintf(why, sizeof(why), "the rendezvous is over: the cluster started without host %d", id);
		refuse_conn(l, why);
		return;
	}
	if (n->peers[id].joined) {
		snprintf(why, sizeof(why), "duplicate host id %d: host %d already joined%s%s", id, id,
			 n->peers[id].coord_in ? " from " : "",
			 n->peers[id].coord_in ? n->peers[id].coord_in->addr : "");
		refuse_conn(l, why);
		return;
	}
	if (!h->version || strcmp(h->version, NET_VERSION)) {
		snprintf(why, sizeof(why), "host %d runs version '%s', the coordinator '%s'", id,
			 h->version ? h->version : "", NET_VERSION);
		rendezvous_fail(n, l, why);
		return;
	}
	if ((int)h->num_hosts != n->num_hosts) {
		snprintf(why, sizeof(why), "host %d was started for %u hosts, the coordinator for %d",
			 id, h->num_hosts, n->num_hosts);
		rendezvous_fail(n, l, why);
		return;
	}
	if (h->config_hash.len != sizeof(n->config_hash) ||
	    memcmp(h->config_hash.data, n->config_hash, sizeof(n->config_hash))) {
		hex8(h->config_hash.data, h->config_hash.len, a);
		hex8(n->config_hash, sizeof(n->config_hash), b);
		snprintf(why, sizeof(why),
			 "host %d's config hash %s differs from the coordinator's %s: run every host with the same config and overrides",
			 id, a, b);
		rendezvous_fail(n, l, why);
		return;
	}
	if ((int)h->devices != n->devices_per_host) {
		snprintf(why, sizeof(why), "host %d has %u devices, the mesh wants %d per host",
			 id, h->devices, n->devices_per_host);
		rendezvous_fail(n, l, why);
		return;
	}
	char hostpart[128];
	int port;
	if (!h->data_address || conn_split_addr(h->data_address, hostpart, sizeof(hostpart), &port) ||
	    !port || strlen(h->data_address) >= sizeof(n->peers[id].addr)) {
		snprintf(why, sizeof(why), "host %d sent a bad data address '%s'", id,
			 h->data_address ? h->data_address : "");
		refuse_conn(l, why);
		return;
	}
	l->peer = id;
	l->deadline_ns = 0;
	n->peers[id].joined = true;
	n->peers[id].coord_in = l;
	n->peers[id].devices = h->devices;
	snprintf(n->peers[id].addr, sizeof(n->peers[id].addr), "%s", h->data_address);
	n->joined++;
	if (n->joined == n->num_hosts)
		send_topology(n);
}

/* ---- rendezvous: agent side ---- */

static void send_hello(struct link *l)
{
	struct net *n = l->net;
	char addr[200], lhost[128], dhost[128];
	int lport, dport;

	/* a wildcard listener reports the address we reach the coordinator from */
	snprintf(addr, sizeof(addr), "%s", n->data_addr);
	if (!conn_split_addr(n->data_addr, dhost, sizeof(dhost), &dport) &&
	    (!strcmp(dhost, "0.0.0.0") || !strcmp(dhost, "::") || !dhost[0])) {
		char local[160];
		conn_sockname(l->c->fd, true, local, sizeof(local));
		if (!conn_split_addr(local, lhost, sizeof(lhost), &lport))
			snprintf(addr, sizeof(addr), strchr(lhost, ':') ? "[%s]:%d" : "%s:%d",
				 lhost, dport);
	}
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Hello h = MESHRUN__HELLO__INIT;
	h.host_id = (uint32_t)n->host_id;
	h.num_hosts = (uint32_t)n->num_hosts;
	h.devices = (uint32_t)n->devices_per_host;
	h.data_address = addr;
	h.config_hash.data = n->config_hash;
	h.config_hash.len = sizeof(n->config_hash);
	h.version = (char *)NET_VERSION;
	f.body_case = MESHRUN__FRAME__BODY_HELLO;
	f.hello = &h;
	link_send(l, &f);
}

static void agent_on_topology(struct link *l, const Meshrun__Topology *t)
{
	struct net *n = l->net;
	char msg[400];
	if ((int)t->n_hosts != n->num_hosts) {
		snprintf(msg, sizeof(msg), "coordinator sent a topology of %zu hosts, expected %d",
			 t->n_hosts, n->num_hosts);
		net_fail(n, NET_ERR, -EPROTO, msg);
		return;
	}
	for (size_t i = 0; i < t->n_hosts; i++) {
		const Meshrun__HostInfo *h = t->hosts[i];
		if (h->host_id != i || !h->data_address || !h->data_address[0] ||
		    strlen(h->data_address) >= sizeof(n->peers[i].addr)) {
			snprintf(msg, sizeof(msg), "coordinator sent a bad topology entry %zu", i);
			net_fail(n, NET_ERR, -EPROTO, msg);
			return;
		}
		snprintf(n->peers[i].addr, sizeof(n->peers[i].addr), "%s", h->data_address);
		n->peers[i].devices = h->devices;
	}
	n->job_id = t->job_id;
	n->topology_done = true;
	link_begin_close(l, now_ns() + CLOSE_GRACE_NS);
	start_links(n);
}

/* ---- links ---- */

static void check_barrier(struct net *n)
{
	if (n->phase != PH_BARRIER)
		return;
	for (int h = 0; h < n->num_hosts; h++)
		if (h != n->host_id && !n->peers[h].barrier_rx)
			return;
	n->phase = PH_RUNNING;
	set_ready(n);
}

static void check_links(struct net *n)
{
	if (n->phase != PH_LINKS)
		return;
	for (int h = 0; h < n->num_hosts; h++)
		if (h != n->host_id && (!n->peers[h].l || n->peers[h].l->state != LS_UP))
			return;
	/* every link is up: no one else may dial us */
	if (n->ev_data_l) {
		event_free(n->ev_data_l);
		n->ev_data_l = NULL;
	}
	if (n->data_lfd >= 0) {
		close(n->data_lfd);
		n->data_lfd = -1;
	}
	n->phase = PH_BARRIER;
	for (int h = 0; h < n->num_hosts; h++)
		if (h != n->host_id)
			send_simple(n->peers[h].l, MESHRUN__FRAME__BODY_BARRIER);
	check_barrier(n);
}

static void link_up(struct link *l, int peer)
{
	struct net *n = l->net;
	l->peer = peer;
	l->state = LS_UP;
	l->last_rx_ns = l->last_hb_ns = now_ns();
	n->peers[peer].l = l;
	check_links(n);
}

static void dial(struct net *n, int peer);

static void accept_link_hello(struct link *l, const Meshrun__LinkHello *h)
{
	struct net *n = l->net;
	char why[400];
	int id = (int)h->host_id;
	if (h->job_id != n->job_id) {
		refuse_conn(l, "link hello for another job (stale agent?)");
		return;
	}
	if (id < 0 || id >= n->host_id) {
		snprintf(why, sizeof(why), "host %d may not dial host %d (the lower id dials)",
			 id, n->host_id);
		refuse_conn(l, why);
		return;
	}
	if (!tls_peer_is_host(l->c->ssl, id, why, sizeof(why))) {
		refuse_conn(l, why);
		return;
	}
	if (n->peers[id].l) {
		snprintf(why, sizeof(why), "duplicate link from host %d", id);
		refuse_conn(l, why);
		return;
	}
	send_link_hello(l);
	link_up(l, id);
}

/* ---- receiving ---- */

static void bad_frame(struct link *l, const char *reason)
{
	char msg[400];
	snprintf(msg, sizeof(msg), "bad frame: %.380s", reason);
	link_lost(l, -EPROTO, msg);
}

/* A data frame header: find the posted receive and aim the payload at it. */
static void on_chunk(struct link *l, const Meshrun__CollectiveChunk *c)
{
	struct net *n = l->net;
	char why[300];
	int src = (int)c->src_device, dst = (int)c->dst_device;

	l->rx_dst = NULL;
	if (l->state != LS_UP || failed_status(n))
		return;                 /* discard */
	if (xport_host_of(n->x, src) != l->peer || xport_host_of(n->x, dst) != n->host_id) {
		snprintf(why, sizeof(why), "chunk from device %d to device %d does not belong on this link",
			 src, dst);
		bad_frame(l, why);
		return;
	}
	if (!l->rx_req) {
		if (c->msg_offset != 0) {
			bad_frame(l, "chunk fragment without its start");
			return;
		}
		const char *what;
		struct xreq *r = xport_remote_data(n->x, src, dst, c->tag, (size_t)c->msg_bytes,
						   c->eager, &what);
		if (!r) {
			if (failed_status(n))
				return;
			snprintf(why, sizeof(why),
				 "data from device %d to device %d (tag 0x%llx, %llu bytes) %s",
				 src, dst, (unsigned long long)c->tag, (unsigned long long)c->msg_bytes,
				 what);
			bad_frame(l, why);
			return;
		}
		l->rx_req = r;
		l->rx_src = src;
		l->rx_dst_dev = dst;
		l->rx_tag = c->tag;
		l->rx_total = c->msg_bytes;
		l->rx_next = 0;
		l->rx_land = (struct xland){ 0 };
	} else if (src != l->rx_src || dst != l->rx_dst_dev || c->tag != l->rx_tag ||
		   c->msg_offset != l->rx_next || c->msg_bytes != l->rx_total) {
		bad_frame(l, "chunk fragment out of order");
		return;
	}
	l->rx_dst = (uint8_t *)l->rx_req->buf + c->msg_offset;
	l->rx_next += c->byte_count;
}

/* The payload of the current data frame (possibly empty) is in. */
static void chunk_payload_done(struct link *l)
{
	if (l->rx_req && l->rx_next == l->rx_total) {
		xport_complete(l->rx_req, 0);
		l->rx_req = NULL;
	}
	l->rx_dst = NULL;
}

static void on_recv_ready(struct link *l, const Meshrun__RecvReady *rr)
{
	struct net *n = l->net;
	char why[200];
	int src = (int)rr->src_device, dst = (int)rr->dst_device;
	if (failed_status(n))
		return;
	if (xport_host_of(n->x, src) != n->host_id || xport_host_of(n->x, dst) != l->peer) {
		snprintf(why, sizeof(why), "recv_ready for device %d -> %d does not belong on this link",
			 src, dst);
		bad_frame(l, why);
		return;
	}
	struct xreq *r = xport_remote_ready(n->x, src, dst, rr->tag, (size_t)rr->byte_count);
	if (!r)
		return;
	struct send_msg *m = calloc(1, sizeof(*m));
	if (!m) {
		xport_complete(r, -ENOMEM);
		return;
	}
	m->req = r;
	if (l->dq_tail)
		l->dq_tail->next = m;
	else
		l->dq_head = m;
	l->dq_tail = m;
	arm_write(l);
}

static void check_finish(struct net *n);

/* One complete frame header arrived on l. */
static void dispatch(struct link *l, Meshrun__Frame *f)
{
	struct net *n = l->net;
	char why[600];
	int body = f->body_case;

	if (l->state == LS_CLOSING || l->state == LS_DRAIN) {
		if (body == MESHRUN__FRAME__BODY_CHUNK)
			l->rx_dst = NULL;
		if (body == MESHRUN__FRAME__BODY_REFUSE && l->role == ROLE_COORD_OUT &&
		    !n->topology_done)
			goto refused;
		return;
	}
	if (l->state == LS_HELLO) {
		switch (l->role) {
		case ROLE_COORD_IN:
			if (body == MESHRUN__FRAME__BODY_HELLO) {
				coord_on_hello(l, f->hello);
				return;
			}
			break;
		case ROLE_COORD_OUT:
			if (body == MESHRUN__FRAME__BODY_TOPOLOGY) {
				agent_on_topology(l, f->topology);
				return;
			}
			if (body == MESHRUN__FRAME__BODY_REFUSE)
				goto refused;
			break;
		case ROLE_LINK_IN:
			if (body == MESHRUN__FRAME__BODY_LINK_HELLO) {
				accept_link_hello(l, f->link_hello);
				return;
			}
			break;
		case ROLE_LINK_OUT:
			if (body == MESHRUN__FRAME__BODY_LINK_HELLO) {
				if ((int)f->link_hello->host_id != l->peer ||
				    f->link_hello->job_id != n->job_id) {
					snprintf(why, sizeof(why), "host %d answered as host %u of job %llx",
						 l->peer, f->link_hello->host_id,
						 (unsigned long long)f->link_hello->job_id);
					bad_frame(l, why);
					return;
				}
				link_up(l, l->peer);
				return;
			}
			if (body == MESHRUN__FRAME__BODY_REFUSE) {
				snprintf(why, sizeof(why), "host %d (%s) refused our link: %s", l->peer,
					 l->addr, f->refuse->reason);
				link_kill(l);
				net_fail(n, NET_ERR_REFUSED, -ECONNREFUSED, why);
				return;
			}
			break;
		}
		snprintf(why, sizeof(why), "unexpected %s frame before the hello", frame_body_name(body));
		if (l->role == ROLE_COORD_IN || (l->role == ROLE_LINK_IN && l->peer < 0))
			refuse_conn(l, why);
		else
			bad_frame(l, why);
		return;
	}
	/* LS_UP */
	switch (body) {
	case MESHRUN__FRAME__BODY_HEARTBEAT:
		return;
	case MESHRUN__FRAME__BODY_CHUNK:
		on_chunk(l, f->chunk);
		return;
	case MESHRUN__FRAME__BODY_RECV_READY:
		on_recv_ready(l, f->recv_ready);
		return;
	case MESHRUN__FRAME__BODY_BARRIER:
		n->peers[l->peer].barrier_rx = true;
		check_barrier(n);
		return;
	case MESHRUN__FRAME__BODY_DONE:
		n->peers[l->peer].done_rx = true;
		if (f->done->status) {
			snprintf(why, sizeof(why), "host %d finished with status %d", l->peer,
				 f->done->status);
			net_fail(n, f->done->status > 0 && f->done->status < 128 ? f->done->status : NET_ERR,
				 -ECONNABORTED, why);
			return;
		}
		check_finish(n);
		return;
	case MESHRUN__FRAME__BODY_ABORT: {
		int code = f->abort->code > 0 && f->abort->code < 128 ? f->abort->code : NET_ERR;
		snprintf(why, sizeof(why), "host %d aborted the job: %s", l->peer,
			 f->abort->reason ? f->abort->reason : "");
		/* the sender closes next; that is not news */
		n->peers[l->peer].done_rx = true;
		net_fail(n, code, -ECONNABORTED, why);
		return;
	}
	default:
		snprintf(why, sizeof(why), "unexpected %s frame on a running link", frame_body_name(body));
		bad_frame(l, why);
		return;
	}

refused:
	snprintf(why, sizeof(why), "rendezvous refused by the coordinator (%s): %s", l->addr,
		 f->refuse->reason ? f->refuse->reason : "");
	link_kill(l);
	net_fail(n, NET_ERR_REFUSED, -ECONNREFUSED, why);
}

/* Header bytes are in: check, dispatch, set up the payload. */
static void header_done(struct link *l)
{
	struct net *n = l->net;
	char why[300];
	Meshrun__Frame *f = frame_parse_header(l->rx_hdr, l->rx_p.header_len, l->rx_p.payload_len,
					       &n->lim, why, sizeof(why));
	if (!f) {
		bad_frame(l, why);
		return;
	}
	if (f->link_seq != l->rx_seq + 1) {
		snprintf(why, sizeof(why), "%s frame has sequence number %llu, expected %llu",
			 frame_body_name(f->body_case), (unsigned long long)f->link_seq,
			 (unsigned long long)(l->rx_seq + 1));
		frame_header_free(f);
		bad_frame(l, why);
		return;
	}
	l->rx_seq = f->link_seq;
	net_fault_hook(n, l->peer, false, f);
	bool chunk = f->body_case == MESHRUN__FRAME__BODY_CHUNK;
	dispatch(l, f);
	frame_header_free(f);
	if (l->state == LS_DEAD)
		return;
	l->rx_got = 0;
	if (l->rx_p.payload_len) {
		l->rx_stage = RX_PAYLOAD;
	} else {
		l->rx_stage = RX_PREFIX;
		if (chunk)
			chunk_payload_done(l);
	}
}

static void link_read(struct link *l)
{
	struct net *n = l->net;
	size_t budget = READ_BUDGET;
	/* discarded payloads, never read: one per net thread */
	static _Thread_local uint8_t scratch[64 * 1024];
	/* payloads of receives that sum, on their way to the sum: small
	 * enough to stay in L1, a TLS record's worth */
	static _Thread_local _Alignas(64) uint8_t bounce[16 * 1024];
	char why[300];

	while (l->state != LS_DEAD) {
		if (!budget) {
			/* Yield through the poll, not around it: re-activating
			 * ourselves here would run again before epoll and the
			 * timers, so a link that never runs dry would starve its
			 * own writes, the other links and the heartbeats. Bytes
			 * left in the socket fire EV_READ again (level-triggered);
			 * bytes already in user space do not, so a zero timeout
			 * brings us back after the next poll. */
			if (conn_pending(l->c)) {
				static const struct timeval now_tv = { 0, 0 };
				event_add(l->ev_resume, &now_tv);
			}
			break;
		}
		uint8_t *dst;
		size_t want;
		bool sum = false;
		switch (l->rx_stage) {
		case RX_PREFIX:
			dst = l->rx_prefix + l->rx_got;
			want = FRAME_PREFIX_LEN - l->rx_got;
			break;
		case RX_HEADER:
			dst = l->rx_hdr + l->rx_got;
			want = l->rx_p.header_len - l->rx_got;
			break;
		default:
			want = (size_t)(l->rx_p.payload_len - l->rx_got);
			if (l->rx_dst && l->rx_req && l->state == LS_UP && l->rx_req->addend) {
				sum = true;
				dst = bounce;
				if (want > sizeof(bounce))
					want = sizeof(bounce);
			} else if (l->rx_dst && l->rx_req && l->state == LS_UP) {
				dst = l->rx_dst + l->rx_got;
			} else {
				dst = scratch;
				if (want > sizeof(scratch))
					want = sizeof(scratch);
			}
			break;
		}
		ssize_t r = conn_read(l->c, dst, want);
		if (r == -EAGAIN) {
			if (l->c->want == CONN_WANT_WRITE) {
				l->rd_wants_write = true;
				arm_write(l);
			}
			break;
		}
		if (r == 0) {
			link_lost(l, -EPIPE, l->rx_stage == RX_PREFIX && !l->rx_got
					  ? "connection closed by peer"
					  : "connection closed by peer in the middle of a frame");
			return;
		}
		if (r < 0) {
			link_lost(l, -EPIPE, l->c->err);
			return;
		}
		l->last_rx_ns = now_ns();
		if (sum)
			xport_land_stream(l->rx_req, &l->rx_land, bounce, (size_t)r);
		l->rx_got += (size_t)r;
		budget = (size_t)r >= budget ? 0 : budget - (size_t)r;
		switch (l->rx_stage) {
		case RX_PREFIX:
			if (l->rx_got < FRAME_PREFIX_LEN)
				break;
			if (frame_parse_prefix(l->rx_prefix, &n->lim, &l->rx_p, why, sizeof(why))) {
				bad_frame(l, why);
				return;
			}
			if (l->rx_hdr_cap < l->rx_p.header_len) {
				uint8_t *b = realloc(l->rx_hdr, l->rx_p.header_len);
				if (!b) {
					link_lost(l, -ENOMEM, "out of memory");
					return;
				}
				l->rx_hdr = b;
				l->rx_hdr_cap = l->rx_p.header_len;
			}
			l->rx_stage = RX_HEADER;
			l->rx_got = 0;
			break;
		case RX_HEADER:
			if (l->rx_got == l->rx_p.header_len)
				header_done(l);
			break;
		case RX_PAYLOAD:
			if (l->rx_got == l->rx_p.payload_len) {
				chunk_payload_done(l);
				l->rx_stage = RX_PREFIX;
				l->rx_got = 0;
			}
			break;
		}
	}
	if (l->state != LS_DEAD && l->wr_wants_read) {
		l->wr_wants_read = false;
		link_write(l);
	}
	/* reading may have made OpenSSL write (alerts, key updates) */
	if (l->state != LS_DEAD && l->state != LS_DRAIN && conn_flush(l->c) == -EAGAIN)
		arm_write(l);
}

/* ---- handshake and events ---- */

static void link_handshake(struct link *l)
{
	struct net *n = l->net;
	char why[300];
	int rc = conn_handshake(l->c);
	if (rc == -EAGAIN) {
		if (l->c->want == CONN_WANT_WRITE)
			arm_write(l);
		else
			disarm_write(l);
		return;
	}
	disarm_write(l);
	if (rc < 0) {
		link_lost(l, -EPROTO, l->c->err);
		return;
	}
	l->state = LS_HELLO;
	switch (l->role) {
	case ROLE_COORD_OUT:
		if (!tls_peer_is_host(l->c->ssl, 0, why, sizeof(why))) {
			char msg[512];
			snprintf(msg, sizeof(msg), "coordinator %s: %s", l->addr, why);
			link_kill(l);
			net_fail(n, NET_ERR_REFUSED, -EPROTO, msg);
			return;
		}
		send_hello(l);
		break;
	case ROLE_LINK_OUT:
		if (!tls_peer_is_host(l->c->ssl, l->peer, why, sizeof(why))) {
			char msg[512];
			snprintf(msg, sizeof(msg), "link to host %d (%s): %s", l->peer, l->addr, why);
			link_kill(l);
			net_fail(n, NET_ERR_REFUSED, -EPROTO, msg);
			return;
		}
		send_link_hello(l);
		break;
	default:
		break;
	}
	/* records may already sit in OpenSSL's buffer */
	link_read(l);
}

static void link_connected(struct link *l)
{
	struct net *n = l->net;
	int rc = conn_connect_result(l->c->fd);
	if (rc) {
		/* not listening yet (or gone): retry until the phase deadline */
		snprintf(n->coord_err, sizeof(n->coord_err), "%s", conn_strerror(-rc));
		if (l->role == ROLE_COORD_OUT)
			n->coord_retry_at = now_ns() + RETRY_NS;
		else
			n->peers[l->peer].retry_at = now_ns() + RETRY_NS;
		link_kill(l);
		return;
	}
	l->state = LS_HANDSHAKE;
	event_add(l->ev_read, NULL);
	link_handshake(l);
}

static void link_event_cb(evutil_socket_t fd, short what, void *arg)
{
	struct link *l = arg;
	(void)fd;
	switch (l->state) {
	case LS_DEAD:
		return;
	case LS_CONNECTING:
		if (what & EV_WRITE)
			link_connected(l);
		return;
	case LS_HANDSHAKE:
		link_handshake(l);
		return;
	default:
		break;
	}
	if (what & EV_READ)
		link_read(l);
	if ((what & EV_WRITE) && l->state != LS_DEAD) {
		if (l->rd_wants_write) {
			l->rd_wants_write = false;
			link_read(l);
		}
		if (l->state != LS_DEAD)
			link_write(l);
	}
}

static void link_resume_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	link_event_cb(fd, EV_READ, arg);
}

/* Every link's TLS connection, dialed or accepted, renews its sending key
 * as configured. NULL on allocation failure. */
static struct conn *tls_conn(struct net *n, int fd, bool server)
{
	struct conn *c = conn_new_tls(n->ctx, fd, server);
	if (c)
		conn_set_key_update(c, n->key_update_bytes, &n->key_updates);
	return c;
}

static void dial_addr(struct net *n, enum role role, int peer, const char *addr)
{
	char err[256];
	int fd = conn_connect_start(addr, err, sizeof(err));
	if (fd < 0) {
		snprintf(n->coord_err, sizeof(n->coord_err), "%s", err);
		if (role == ROLE_COORD_OUT)
			n->coord_retry_at = now_ns() + RETRY_NS;
		else
			n->peers[peer].retry_at = now_ns() + RETRY_NS;
		return;
	}
	struct conn *c = tls_conn(n, fd, false);
	struct link *l = c ? link_new(n, role, c, peer, addr) : NULL;
	if (!l) {
		net_fail(n, NET_ERR, -ENOMEM, "out of memory opening a connection");
		return;
	}
	l->state = LS_CONNECTING;
	l->write_armed = true;
	event_add(l->ev_write, NULL);
	if (role == ROLE_COORD_OUT)
		n->coord = l;
	else
		n->peers[peer].l = l;
}

static void dial(struct net *n, int peer)
{
	n->peers[peer].retry_at = 0;
	dial_addr(n, ROLE_LINK_OUT, peer, n->peers[peer].addr);
}

static void start_links(struct net *n)
{
	n->phase = PH_LINKS;
	if (n->ev_data_l)
		event_add(n->ev_data_l, NULL);
	for (int h = n->host_id + 1; h < n->num_hosts; h++)
		dial(n, h);
	check_links(n);
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
	struct net *n = arg;
	(void)what;
	bool coord = lfd == n->coord_lfd;
	char peer[128];
	for (int i = 0; i < ACCEPT_MAX; i++) {
		int fd = conn_accept(lfd, peer, sizeof(peer));
		if (fd == -EAGAIN)
			return;
		if (fd < 0) {
			net_log(n, "accept failed: %s", conn_strerror(-fd));
			return;
		}
		struct conn *c = tls_conn(n, fd, true);
		struct link *l = c ? link_new(n, coord ? ROLE_COORD_IN : ROLE_LINK_IN, c, -1, peer) : NULL;
		if (!l) {
			net_log(n, "out of memory accepting %s", peer);
			continue;
		}
		l->state = LS_HANDSHAKE;
		l->deadline_ns = now_ns() + sec_ns(n->connect_timeout_s);
		event_add(l->ev_read, NULL);
		link_handshake(l);
		/* that may have brought up the last link and closed the listener */
		if (coord ? !n->ev_coord_l : n->data_lfd != lfd)
			return;
	}
}

/* ---- commands from other threads ---- */

static void push_cmd(struct net *n, struct cmd *c)
{
	pthread_mutex_lock(&n->mu);
	if (n->cmd_tail)
		n->cmd_tail->next = c;
	else
		n->cmd_head = c;
	n->cmd_tail = c;
	pthread_mutex_unlock(&n->mu);
	event_active(n->ev_cmd, EV_READ, 0);
}

static struct cmd *cmd_new(enum cmd_kind kind, const char *msg)
{
	size_t ml = msg ? strlen(msg) + 1 : 1;
	struct cmd *c = calloc(1, sizeof(*c) + ml);
	if (c) {
		c->kind = kind;
		memcpy(c->msg, msg ? msg : "", ml);
	}
	return c;
}

static struct link *peer_link(struct net *n, int host)
{
	if (host < 0 || host >= n->num_hosts)
		return NULL;
	struct link *l = n->peers[host].l;
	return l && l->state == LS_UP ? l : NULL;
}

static void begin_stop(struct net *n)
{
	n->stopping = true;
	n->stop_deadline_ns = now_ns() + CLOSE_GRACE_NS;
	for (struct link *l = n->links; l; l = l->next)
		link_begin_close(l, n->stop_deadline_ns);
	if (n->ev_coord_l) {
		event_free(n->ev_coord_l);
		n->ev_coord_l = NULL;
	}
	event_active(n->ev_reap, EV_READ, 0);
}

static void cmd_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	(void)fd;
	(void)what;
	pthread_mutex_lock(&n->mu);
	struct cmd *c = n->cmd_head;
	n->cmd_head = n->cmd_tail = NULL;
	pthread_mutex_unlock(&n->mu);

	while (c) {
		struct cmd *next = c->next;
		int fs = failed_status(n);
		switch (c->kind) {
		case CMD_RR: {
			struct link *l = peer_link(n, xport_host_of(n->x, c->src));
			if (fs || !l)
				break;   /* the xport is failed (or about to be) */
			Meshrun__Frame f = MESHRUN__FRAME__INIT;
			Meshrun__RecvReady rr = MESHRUN__RECV_READY__INIT;
			rr.src_device = (uint32_t)c->src;
			rr.dst_device = (uint32_t)c->dst;
			rr.tag = c->tag;
			rr.byte_count = c->len;
			f.body_case = MESHRUN__FRAME__BODY_RECV_READY;
			f.recv_ready = &rr;
			if (link_send(l, &f))
				link_lost(l, -ENOMEM, "out of memory queueing a frame");
			break;
		}
		case CMD_SEND: {
			struct link *l = peer_link(n, xport_host_of(n->x, c->req->dst));
			struct send_msg *m = (!fs && l) ? calloc(1, sizeof(*m)) : NULL;
			if (!m) {
				xport_complete(c->req, fs ? -ECANCELED : -EPIPE);
				break;
			}
			m->req = c->req;
			if (l->dq_tail)
				l->dq_tail->next = m;
			else
				l->dq_head = m;
			l->dq_tail = m;
			arm_write(l);
			break;
		}
		case CMD_FINISH:
			if (fs)
				break;
			n->phase = PH_FINISHING;
			n->finish_deadline_ns = now_ns() + sec_ns(n->done_timeout_s);
			for (int h = 0; h < n->num_hosts; h++) {
				struct link *l = peer_link(n, h);
				if (l)
					send_simple(l, MESHRUN__FRAME__BODY_DONE);
			}
			check_finish(n);
			break;
		case CMD_ABORT:
			net_fail(n, c->status, -ECANCELED, c->msg);
			break;
		case CMD_STOP:
			begin_stop(n);
			break;
		}
		free(c);
		c = next;
	}
}

static void check_finish(struct net *n)
{
	if (n->phase != PH_FINISHING)
		return;
	for (int h = 0; h < n->num_hosts; h++)
		if (h != n->host_id && !n->peers[h].done_rx)
			return;
	n->phase = PH_CLOSING;
	if (n->ev_coord_l) {
		event_free(n->ev_coord_l);
		n->ev_coord_l = NULL;
	}
	uint64_t deadline = now_ns() + 2 * CLOSE_GRACE_NS;
	for (struct link *l = n->links; l; l = l->next)
		link_begin_close(l, deadline);
	if (!n->links)
		set_closed(n);
	event_active(n->ev_reap, EV_READ, 0);
}

/* ---- the tick: heartbeats, timeouts, retries, deadlines ---- */

static void missing_hosts(struct net *n, bool (*missing)(struct net *, int), char *out, size_t len)
{
	size_t used = 0;
	int count = 0;
	out[0] = 0;
	for (int h = 0; h < n->num_hosts && used < len; h++) {
		if (h == n->host_id || !missing(n, h))
			continue;
		if (count++ == 8) {
			used += snprintf(out + used, len - used, ", ...");
			break;
		}
		used += snprintf(out + used, len - used, "%s%d", used ? ", " : "", h);
	}
}

static bool no_hello(struct net *n, int h) { return !n->peers[h].joined; }
static bool no_link(struct net *n, int h) { return !peer_link(n, h); }
static bool no_barrier(struct net *n, int h) { return !n->peers[h].barrier_rx; }
static bool no_done(struct net *n, int h) { return !n->peers[h].done_rx; }

static void phase_timeout(struct net *n)
{
	char hosts[200], msg[512];
	double t = n->connect_timeout_s;
	switch (n->phase) {
	case PH_RENDEZVOUS:
		if (n->host_id == 0) {
			missing_hosts(n, no_hello, hosts, sizeof(hosts));
			snprintf(msg, sizeof(msg), "rendezvous timed out after %g s: no hello from hosts %s",
				 t, hosts);
		} else {
			snprintf(msg, sizeof(msg), "rendezvous timed out after %g s: no topology from the coordinator %.200s%s%.200s",
				 t, n->coordinator, n->coord_err[0] ? " (last error: " : "",
				 n->coord_err[0] ? n->coord_err : "");
			if (n->coord_err[0])
				strncat(msg, ")", sizeof(msg) - strlen(msg) - 1);
		}
		break;
	case PH_LINKS:
		missing_hosts(n, no_link, hosts, sizeof(hosts));
		snprintf(msg, sizeof(msg), "link set-up timed out after %g s: no link to hosts %s", t, hosts);
		break;
	default:
		missing_hosts(n, no_barrier, hosts, sizeof(hosts));
		snprintf(msg, sizeof(msg), "start-up barrier timed out after %g s: waiting for hosts %s",
			 t, hosts);
		break;
	}
	net_fail(n, NET_ERR, -ETIMEDOUT, msg);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	uint64_t now = now_ns();
	char msg[200];
	(void)fd;
	(void)what;

	for (struct link *l = n->links; l; l = l->next) {
		switch (l->state) {
		case LS_UP:
			if (l->peer >= 0 && !n->peers[l->peer].done_rx &&
			    now - l->last_rx_ns > n->hb_timeout_ns) {
				snprintf(msg, sizeof(msg), "no heartbeat for %.1f s",
					 (double)(now - l->last_rx_ns) / 1e9);
				link_lost(l, -ETIMEDOUT, msg);
				break;
			}
			if (now - l->last_hb_ns >= n->hb_interval_ns) {
				l->last_hb_ns = now;
				if (!l->hb_queued)
					send_simple(l, MESHRUN__FRAME__BODY_HEARTBEAT);
			}
			break;
		case LS_HANDSHAKE:
		case LS_HELLO:
			if (l->deadline_ns && now > l->deadline_ns)
				link_lost(l, -ETIMEDOUT, "no hello in time");
			break;
		case LS_CLOSING:
		case LS_DRAIN:
			if (now > l->deadline_ns)
				link_kill(l);
			break;
		default:
			break;
		}
	}
	if (n->stopping) {
		if (now > n->stop_deadline_ns)
			for (struct link *l = n->links; l; l = l->next)
				link_kill(l);
		return;
	}
	switch (n->phase) {
	case PH_RENDEZVOUS:
	case PH_LINKS:
	case PH_BARRIER:
		if (now > n->phase_deadline_ns) {
			phase_timeout(n);
			return;
		}
		if (n->phase == PH_RENDEZVOUS && n->host_id != 0 && !n->coord && n->coord_retry_at &&
		    now >= n->coord_retry_at) {
			n->coord_retry_at = 0;
			dial_addr(n, ROLE_COORD_OUT, 0, n->coordinator);
		}
		if (n->phase == PH_LINKS)
			for (int h = n->host_id + 1; h < n->num_hosts; h++)
				if (!n->peers[h].l && n->peers[h].retry_at && now >= n->peers[h].retry_at)
					dial(n, h);
		break;
	case PH_FINISHING:
		if (now > n->finish_deadline_ns) {
			char hosts[200], m2[400];
			missing_hosts(n, no_done, hosts, sizeof(hosts));
			snprintf(m2, sizeof(m2), "timed out after %g s waiting for hosts %s to finish",
				 n->done_timeout_s, hosts);
			net_fail(n, NET_ERR, -ETIMEDOUT, m2);
		}
		break;
	default:
		break;
	}
}

/* ---- xport hooks (device threads) ---- */

static void note_op(struct net *n, const struct xreq *r)
{
	if (r->meta.op) {
		atomic_store_explicit(&n->last_step, r->meta.step, memory_order_relaxed);
		atomic_store_explicit(&n->last_op, r->meta.op, memory_order_relaxed);
	}
}

static void op_recv_posted(void *ctx, struct xreq *r)
{
	struct net *n = ctx;
	note_op(n, r);
	struct cmd *c = cmd_new(CMD_RR, NULL);
	if (!c) {
		xport_fail(n->x, -ENOMEM, "out of memory posting a receive");
		return;
	}
	c->src = r->src;
	c->dst = r->dst;
	c->tag = r->tag;
	c->len = r->len;
	push_cmd(n, c);
}

static void op_send_ready(void *ctx, struct xreq *r)
{
	struct net *n = ctx;
	note_op(n, r);
	struct cmd *c = cmd_new(CMD_SEND, NULL);
	if (!c) {
		xport_complete(r, -ENOMEM);
		return;
	}
	c->req = r;
	push_cmd(n, c);
}

static const struct xport_remote_ops ops = {
	.recv_posted = op_recv_posted,
	.send_ready = op_send_ready,
};

const struct xport_remote_ops *net_xport_ops(void)
{
	return &ops;
}

void net_set_xport(struct net *n, struct xport *x)
{
	n->x = x;
}

/* ---- lifecycle ---- */

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;

static void evthread_init(void)
{
	evthread_rc = evthread_use_pthreads();
}

static void *net_thread(void *arg)
{
	struct net *n = arg;
	event_base_loop(n->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

struct net *net_new(const struct net_params *p, int *status, char *err, size_t errlen)
{
	struct net *n;
	char why[300];

	*status = NET_ERR;
	pthread_once(&evthread_once, evthread_init);
	if (evthread_rc) {
		snprintf(err, errlen, "net: libevent has no pthread support");
		return NULL;
	}
	n = calloc(1, sizeof(*n));
	if (!n) {
		snprintf(err, errlen, "net: out of memory");
		return NULL;
	}
	/* the inherited sockets are ours from here on, even on failure */
	n->data_lfd = p->data_fd;
	n->coord_lfd = p->host_id == 0 ? p->coord_fd : -1;
	if (p->host_id != 0 && p->coord_fd >= 0)
		close(p->coord_fd);
	n->host_id = p->host_id;
	n->num_hosts = p->num_hosts;
	n->devices_per_host = p->devices_per_host;
	snprintf(n->coordinator, sizeof(n->coordinator), "%s", p->coordinator ? p->coordinator : "");
	snprintf(n->listen, sizeof(n->listen), "%s", p->listen ? p->listen : "");
	snprintf(n->certs_dir, sizeof(n->certs_dir), "%s", p->certs_dir ? p->certs_dir : ".");
	n->hb_interval_ns = sec_ns(p->heartbeat_interval_s);
	n->hb_timeout_ns = sec_ns(p->heartbeat_timeout_s);
	n->connect_timeout_s = p->connect_timeout_s;
	n->done_timeout_s = p->done_timeout_s;
	memcpy(n->config_hash, p->config_hash, sizeof(n->config_hash));
	n->log = p->log;
	n->log_ctx = p->log_ctx;
	n->lim.max_payload = p->max_frame_bytes;
	n->key_update_bytes = p->key_update_bytes;
	pthread_mutex_init(&n->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&n->cv, &ca);
	pthread_condattr_destroy(&ca);

	n->peers = calloc((size_t)(n->num_hosts > 0 ? n->num_hosts : 1), sizeof(*n->peers));
	n->base = event_base_new();
	if (!n->peers || !n->base) {
		snprintf(err, errlen, "net: out of memory");
		goto out_free;
	}
	n->ev_cmd = event_new(n->base, -1, EV_READ | EV_PERSIST, cmd_cb, n);
	n->ev_tick = event_new(n->base, -1, EV_PERSIST, tick_cb, n);
	n->ev_reap = event_new(n->base, -1, EV_READ | EV_PERSIST, reap_cb, n);
	if (!n->ev_cmd || !n->ev_tick || !n->ev_reap) {
		snprintf(err, errlen, "net: out of memory");
		goto out_free;
	}
	if (n->num_hosts > 1) {
		n->ctx = tls_ctx_new(n->certs_dir, n->host_id, err, errlen);
		if (!n->ctx) {
			*status = NET_ERR_CONFIG;
			goto out_free;
		}
		/* the link listener exists before the Hello names its port */
		if (n->data_lfd >= 0) {
			conn_set_nonblock(n->data_lfd);
		} else if (conn_listen(n->listen, &n->data_lfd, why, sizeof(why))) {
			snprintf(err, errlen, "net: link listener: %s", why);
			*status = NET_ERR_CONFIG;
			goto out_free;
		}
		conn_sockname(n->data_lfd, true, n->data_addr, sizeof(n->data_addr));
		n->ev_data_l = event_new(n->base, n->data_lfd, EV_READ | EV_PERSIST, accept_cb, n);
		if (n->host_id == 0) {
			if (n->coord_lfd >= 0) {
				conn_set_nonblock(n->coord_lfd);
			} else if (conn_listen(n->coordinator, &n->coord_lfd, why, sizeof(why))) {
				snprintf(err, errlen, "net: coordinator listener: %s", why);
				*status = NET_ERR_CONFIG;
				goto out_free;
			}
			n->ev_coord_l = event_new(n->base, n->coord_lfd, EV_READ | EV_PERSIST, accept_cb, n);
		}
	}
	*status = NET_OK;
	return n;

out_free:
	net_free(n);
	return NULL;
}

/* Runs on the net thread once the loop starts. */
static void start_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	(void)fd;
	(void)what;
	n->phase_deadline_ns = now_ns() + sec_ns(n->connect_timeout_s);
	if (n->num_hosts == 1) {
		n->phase = PH_RUNNING;
		set_ready(n);
		return;
	}
	n->phase = PH_RENDEZVOUS;
	if (n->host_id == 0) {
		uint64_t id;
		RAND_bytes((unsigned char *)&id, sizeof(id));
		n->job_id = id;
		n->peers[0].joined = true;
		n->peers[0].devices = (uint32_t)n->devices_per_host;
		char h[128];
		int port, cport;
		/* a wildcard link listener is reached at the coordinator's host */
		if (!conn_split_addr(n->data_addr, h, sizeof(h), &port) &&
		    (!strcmp(h, "0.0.0.0") || !strcmp(h, "::")) &&
		    !conn_split_addr(n->coordinator, h, sizeof(h), &cport))
			snprintf(n->peers[0].addr, sizeof(n->peers[0].addr),
				 strchr(h, ':') ? "[%s]:%d" : "%s:%d",
				 h[0] && strcmp(h, "0.0.0.0") ? h : "127.0.0.1", port);
		else
			snprintf(n->peers[0].addr, sizeof(n->peers[0].addr), "%s", n->data_addr);
		n->joined = 1;
		event_add(n->ev_coord_l, NULL);
	} else {
		dial_addr(n, ROLE_COORD_OUT, 0, n->coordinator);
	}
}

int net_start(struct net *n, char *err, size_t errlen)
{
	struct timeval tv = { .tv_sec = 0, .tv_usec = TICK_MS * 1000 };
	event_add(n->ev_cmd, NULL);
	event_add(n->ev_reap, NULL);
	event_add(n->ev_tick, &tv);
	if (event_base_once(n->base, -1, EV_TIMEOUT, start_cb, n, NULL)) {
		snprintf(err, errlen, "net: unable to start");
		return NET_ERR;
	}
	if (pthread_create(&n->thread, NULL, net_thread, n)) {
		snprintf(err, errlen, "net: unable to start the network thread");
		return NET_ERR;
	}
	n->thread_started = true;
	pthread_mutex_lock(&n->mu);
	while (!n->ready && !n->status)
		pthread_cond_wait(&n->cv, &n->mu);
	int s = n->status;
	if (s)
		snprintf(err, errlen, "%s", n->msg);
	pthread_mutex_unlock(&n->mu);
	return s;
}

int net_finish(struct net *n, char *err, size_t errlen)
{
	struct cmd *c = cmd_new(CMD_FINISH, NULL);
	if (!c) {
		snprintf(err, errlen, "net: out of memory");
		return NET_ERR;
	}
	push_cmd(n, c);
	pthread_mutex_lock(&n->mu);
	while (!n->closed && !n->status)
		pthread_cond_wait(&n->cv, &n->mu);
	int s = n->status;
	if (s)
		snprintf(err, errlen, "%s", n->msg);
	pthread_mutex_unlock(&n->mu);
	return s;
}

void net_abort(struct net *n, int status, const char *msg)
{
	if (n->x)
		xport_fail(n->x, -ECANCELED, msg);
	if (!n->thread_started) {
		record_failure(n, status, msg);
		return;
	}
	struct cmd *c = cmd_new(CMD_ABORT, msg);
	if (!c) {
		record_failure(n, status, msg);
		return;
	}
	c->status = status;
	push_cmd(n, c);
}

int net_failed(struct net *n, char *err, size_t errlen)
{
	pthread_mutex_lock(&n->mu);
	int s = n->status;
	if (s && err)
		snprintf(err, errlen, "%s", n->msg);
	pthread_mutex_unlock(&n->mu);
	return s;
}

uint64_t net_bytes_sent(struct net *n)
{
	return atomic_load_explicit(&n->bytes_sent, memory_order_relaxed);
}

uint64_t net_key_updates(struct net *n)
{
	return atomic_load_explicit(&n->key_updates, memory_order_relaxed);
}

void net_free(struct net *n)
{
	if (!n)
		return;
	if (n->thread_started) {
		struct cmd *c = cmd_new(CMD_STOP, NULL);
		if (c)
			push_cmd(n, c);
		else
			event_base_loopbreak(n->base);
		pthread_join(n->thread, NULL);
	}
	while (n->links) {
		struct link *l = n->links;
		n->links = l->next;
		l->state = LS_DEAD;
		link_release_reqs(l, -ECANCELED);
		link_free(l);
	}
	while (n->cmd_head) {
		struct cmd *c = n->cmd_head;
		n->cmd_head = c->next;
		if (c->kind == CMD_SEND)
			xport_complete(c->req, -ECANCELED);
		free(c);
	}
	if (n->ev_cmd)
		event_free(n->ev_cmd);
	if (n->ev_tick)
		event_free(n->ev_tick);
	if (n->ev_reap)
		event_free(n->ev_reap);
	if (n->ev_coord_l)
		event_free(n->ev_coord_l);
	if (n->ev_data_l)
		event_free(n->ev_data_l);
	if (n->coord_lfd >= 0)
		close(n->coord_lfd);
	if (n->data_lfd >= 0)
		close(n->data_lfd);
	if (n->base)
		event_base_free(n->base);
	tls_ctx_free(n->ctx);
	free(n->peers);
	pthread_mutex_destroy(&n->mu);
	pthread_cond_destroy(&n->cv);
	free(n);
}
