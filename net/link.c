/* Links (net/link.h): creation, the state machine, the link lock and the
 * stream thread's watch, send queues, teardown, the fault point every
 * frame passes, and failure: what a broken link means for the job, and
 * failing the whole net. The bottom of the net thread's files: it calls
 * only status.c and stream.c (and conn, frame, xport). */
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net_int.h"

/* ---- the link lock ---- */

void link_lock(struct link *l)
{
	if (pthread_mutex_trylock(&l->mu)) {
		atomic_fetch_add(&l->lockers, 1);
		pthread_mutex_lock(&l->mu);
		atomic_fetch_sub(&l->lockers, 1);
	}
	if (l->depth++ == 0)
		l->off_main = !net_on_main(l->net);
}

bool link_trylock(struct link *l)
{
	if (atomic_load_explicit(&l->lockers, memory_order_relaxed) || pthread_mutex_trylock(&l->mu))
		return false;
	if (l->depth++ == 0)
		l->off_main = !net_on_main(l->net);
	return true;
}

void link_watch(struct link *l)
{
	if (!l->watched || l->state != LS_UP || l->conn_dead)
		return;
	uint32_t ev = 0;
	if (!l->pollers) {
		if (!l->rx_blocked && !l->hold_reads && !l->lingering)
			ev |= EPOLLIN;
		if (l->want_write && !l->held)
			ev |= EPOLLOUT;
	}
	if (ev != l->armed)
		stream_arm(l, ev);
}

void link_unlock(struct link *l)
{
	if (l->depth == 1)
		link_watch(l);
	l->depth--;
	pthread_mutex_unlock(&l->mu);
	/* the stream thread came while we held it (it sets kick, then tries
	 * the lock once more): its event is spent (one shot), so arm again
	 * for what it came for */
	while (atomic_exchange(&l->kick, 0)) {
		pthread_mutex_lock(&l->mu);
		l->depth++;
		l->armed = 0;
		link_watch(l);
		l->depth--;
		pthread_mutex_unlock(&l->mu);
	}
}

void link_defer(struct link *l, enum link_defer what, int rc, const char *why,
		Meshrun__Frame *f)
{
	if (f) {
		frame_header_free(l->defer_frame);
		l->defer_frame = f;
	}
	if (what != DEFER_NONE && l->defer == DEFER_NONE) {
		l->defer = what;
		l->defer_rc = rc;
		snprintf(l->defer_why, sizeof(l->defer_why), "%s", why ? why : "");
	}
	if (what != DEFER_NONE)
		l->conn_dead = true;
	l->rx_blocked = true;
	event_active(l->ev_defer, EV_READ, 0);
}

/* ---- state ---- */

#define EDGE(s) (1u << (s))

/* The allowed edges of the state diagram in net/link.h: link_next[from]
 * has bit `to` set if from -> to is legal. */
static const unsigned link_next[LS_COUNT] = {
	[LS_NEW] = EDGE(LS_CONNECTING) | EDGE(LS_HANDSHAKE) | EDGE(LS_DEAD),
	[LS_CONNECTING] = EDGE(LS_HANDSHAKE) | EDGE(LS_DEAD),
	[LS_HANDSHAKE] = EDGE(LS_HELLO) | EDGE(LS_BROKEN) | EDGE(LS_DEAD),
	[LS_HELLO] = EDGE(LS_UP) | EDGE(LS_CLOSING) | EDGE(LS_BROKEN) | EDGE(LS_DEAD),
	[LS_UP] = EDGE(LS_CLOSING) | EDGE(LS_BROKEN) | EDGE(LS_DEAD),
	[LS_CLOSING] = EDGE(LS_DRAIN) | EDGE(LS_DEAD),
	[LS_DRAIN] = EDGE(LS_DEAD),
	[LS_DEAD] = 0,
	[LS_BROKEN] = EDGE(LS_RECONNECTING) | EDGE(LS_HELLO) | EDGE(LS_CLOSING) | EDGE(LS_DEAD),
	[LS_RECONNECTING] = EDGE(LS_HANDSHAKE) | EDGE(LS_BROKEN) | EDGE(LS_DEAD),
};

static const char *link_state_name(enum link_state s)
{
	static const char *const names[LS_COUNT] = {
		[LS_NEW] = "new", [LS_CONNECTING] = "connecting", [LS_HANDSHAKE] = "handshake",
		[LS_HELLO] = "hello", [LS_UP] = "up", [LS_CLOSING] = "closing",
		[LS_DRAIN] = "drain", [LS_DEAD] = "dead", [LS_BROKEN] = "broken",
		[LS_RECONNECTING] = "reconnecting",
	};
	return s >= 0 && s < LS_COUNT ? names[s] : "?";
}

void link_set_state(struct link *l, enum link_state to)
{
	bool legal = l->state < LS_COUNT && to < LS_COUNT && (link_next[l->state] & EDGE(to));
	if (!legal) {
		fprintf(stderr, "meshrun: link to %s (role %d): illegal state change %s -> %s\n",
			l->addr, (int)l->role, link_state_name(l->state), link_state_name(to));
		assert(legal && "illegal link state change");
	}
	/* a probe of the peer's listener (link_probe) ends with the break */
	if (to != LS_BROKEN && l->probe_fd >= 0) {
		close(l->probe_fd);
		l->probe_fd = -1;
	}
	enum link_state from = l->state;
	l->state = to;
	if (to == LS_UP) {
		/* UP: its stream thread watches the socket, not the event loop */
		bool ww = l->write_armed;
		event_del(l->ev_read);
		link_disarm_write(l);
		l->want_write = ww || l->want_write;
		l->conn_dead = false;
		if (l->c && !l->watched && stream_add(l))
			status_log(l->net, "link to %s: no stream thread watch: %s", l->addr,
				   strerror(errno));
		l->armed = 0;
	} else if (from == LS_UP) {
		bool ww = l->want_write;
		stream_del(l);
		l->want_write = false;
		/* an orderly close reads the peer's goodbye on the event loop */
		if (to == LS_CLOSING) {
			event_add(l->ev_read, NULL);
			if (ww)
				link_arm_write(l);
		}
	}
}

/* ---- creation, teardown ---- */

static void link_resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct link *l = arg;
	(void)what;
	l->net->link_cb(fd, EV_READ, l);
}

/* A hold ran out: reading and writing go on. */
static void link_hold_cb(evutil_socket_t fd, short what, void *arg)
{
	struct link *l = arg;
	(void)fd;
	(void)what;
	link_lock(l);
	l->held = false;
	if (l->hold_reads) {
		l->hold_reads = false;
		if (l->state != LS_UP)
			event_add(l->ev_read, NULL);
		/* records that arrived meanwhile may sit in user space: the net
		 * thread reads them (recv_defer_cb) */
		event_active(l->state == LS_UP ? l->ev_defer : l->ev_read, EV_READ, 0);
	}
	link_arm_write(l);
	link_unlock(l);
}

/* TCP_USER_TIMEOUT on a link's socket: the kernel gives up on data it
 * sent that stays unacknowledged for heartbeat_timeout_s (without it,
 * tcp_retries2 retransmits for about 15 minutes), so a write into a dead
 * path fails by the time the heartbeat check would call the peer dead.
 * Not shorter: a live peer that reads slowly keeps its window shut, and
 * the half-open probe (link_silence_s) answers sooner and tells a stale
 * path from a stopped process, which the kernel cannot. */
static void link_user_timeout(struct link *l, int fd)
{
	uint64_t ms = l->net->hb_timeout_ns / 1000000u;
	unsigned int v = ms > 0x7fffffffu ? 0x7fffffffu : ms ? (unsigned int)ms : 1u;
	if (fd >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, sizeof(v)) &&
	    errno != EOPNOTSUPP && errno != ENOPROTOOPT)
		status_log(l->net, "link to %s: TCP_USER_TIMEOUT: %s", l->addr, conn_strerror(errno));
}

/* TCP_NOTSENT_LOWAT on a link's socket: the kernel takes more only while
 * fewer than tcp_notsent_lowat_bytes wait unsent, so a control frame (an
 * abort, a barrier, an ack) never queues behind megabytes of data, which
 * on a slow link are seconds (bench/README.md: 1.3 MB unsent at most on an
 * 8 Mbit/s link without it, 0.33 MB with 256 KiB). What the socket will
 * not take waits in our queues, where control frames go first. */
static void link_notsent_lowat(struct link *l, int fd)
{
	int v = l->net->notsent_lowat;
	if (fd >= 0 && v > 0 && setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof(v)) &&
	    errno != EOPNOTSUPP && errno != ENOPROTOOPT)
		status_log(l->net, "link to %s: TCP_NOTSENT_LOWAT: %s", l->addr, conn_strerror(errno));
}

struct link *link_new(struct net *n, enum link_role role, struct conn *c, int peer,
		      const char *addr)
{
	struct link *l = calloc(1, sizeof(*l));
	if (!l) {
		conn_free(c);
		return NULL;
	}
	l->net = n;
	l->role = role;
	l->state = LS_NEW;
	l->c = c;
	l->peer = peer;
	l->probe_fd = -1;
	snprintf(l->addr, sizeof(l->addr), "%s", addr);
	l->ev_read = event_new(n->base, c->fd, EV_READ | EV_PERSIST, n->link_cb, l);
	l->ev_write = event_new(n->base, c->fd, EV_WRITE | EV_PERSIST, n->link_cb, l);
	l->ev_resume = evtimer_new(n->base, link_resume_cb, l);
	l->ev_hold = evtimer_new(n->base, link_hold_cb, l);
	l->ev_defer = event_new(n->base, -1, 0, n->defer_cb, l);
	l->tx_stage = malloc(FRAME_PREFIX_LEN + 1024 + SMALL_PAYLOAD);
	if (!l->ev_read || !l->ev_write || !l->ev_resume || !l->ev_hold || !l->ev_defer ||
	    !l->tx_stage) {
		if (l->ev_read)
			event_free(l->ev_read);
		if (l->ev_write)
			event_free(l->ev_write);
		if (l->ev_resume)
			event_free(l->ev_resume);
		if (l->ev_hold)
			event_free(l->ev_hold);
		if (l->ev_defer)
			event_free(l->ev_defer);
		free(l->tx_stage);
		conn_free(c);
		free(l);
		return NULL;
	}
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&l->mu, &ma);
	pthread_mutexattr_destroy(&ma);
	l->last_rx_ns = l->last_hb_ns = now_ns();
	link_user_timeout(l, c->fd);
	link_notsent_lowat(l, c->fd);
	l->next = n->links;
	n->links = l;
	return l;
}

void link_arm_write(struct link *l)
{
	if (l->state == LS_UP) {
		/* whoever holds the lock writes it, or link_unlock arms the
		 * stream thread for it */
		l->want_write = true;
		return;
	}
	if (!l->write_armed && l->state != LS_DEAD && l->state != LS_BROKEN) {
		event_add(l->ev_write, NULL);
		l->write_armed = true;
	}
}

void link_disarm_write(struct link *l)
{
	if (l->state == LS_UP)
		l->want_write = false;
	if (l->write_armed) {
		event_del(l->ev_write);
		l->write_armed = false;
	}
}

/* A half-written payload continues as zeros (so the stream stays framed
 * for the Abort behind it) and a half-read one is discarded. Replay
 * entries kept by reference let go of the caller's buffers: a resend, if
 * one still came, would carry zeros. */
void link_release_reqs(struct link *l, int rc)
{
	struct send_msg *m;
	for (struct ctrl_frame *c = l->rp_head; c; c = c->next) {
		if (c->req)
			xport_complete(c->req, rc);
		c->req = NULL;
		c->pay = NULL;
	}
	if (!l->tx_ctrl)
		l->tx_pay = NULL;
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

void link_kill(struct link *l)
{
	struct net *n = l->net;
	if (l->state == LS_DEAD)
		return;
	link_set_state(l, LS_DEAD);
	event_del(l->ev_read);
	event_del(l->ev_resume);
	event_del(l->ev_hold);
	event_del(l->ev_defer);
	link_disarm_write(l);
	link_release_reqs(l, status_failed(n) ? -ECANCELED : -EPIPE);
	if (l->peer >= 0 && l->peer < n->num_hosts) {
		if (n->peers[l->peer].l[l->stream] == l)
			n->peers[l->peer].l[l->stream] = NULL;
		if (n->peers[l->peer].coord_in == l)
			n->peers[l->peer].coord_in = NULL;
	}
	if (n->coord == l)
		n->coord = NULL;
	event_active(n->ev_reap, EV_READ, 0);
}

void link_free(struct link *l)
{
	struct ctrl_frame *c;
	struct send_msg *m;
	event_free(l->ev_read);
	event_free(l->ev_write);
	event_free(l->ev_resume);
	event_free(l->ev_hold);
	event_free(l->ev_defer);
	frame_header_free(l->defer_frame);
	free(l->rr_q);
	pthread_mutex_destroy(&l->mu);
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
	while ((c = l->rp_head)) {
		l->rp_head = c->next;
		free(c);
	}
	while ((c = l->rp_pool)) {
		l->rp_pool = c->next;
		free(c);
	}
	free(l->hello_out);
	free(l->tx_stage);
	free(l->rx_hdr);
	if (l->probe_fd >= 0)
		close(l->probe_fd);
	free(l);
}

void link_reap_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	(void)fd;
	(void)what;
	struct link **pp = &n->links;
	while (*pp) {
		struct link *l = *pp;
		if (l->state == LS_DEAD) {
			*pp = l->next;
			if (l->pinned) {
				/* device threads may still look at it (they see it
				 * DEAD); its connection closes now */
				link_lock(l);
				conn_free(l->c);
				l->c = NULL;
				link_unlock(l);
				l->next = n->pinned;
				n->pinned = l;
			} else {
				link_free(l);
			}
		} else {
			pp = &l->next;
		}
	}
	if (!n->links && (n->phase == PH_CLOSING || n->phase == PH_FAILED))
		status_set_closed(n);
	if (!n->links && n->stopping)
		event_base_loopbreak(n->base);
}

/* ---- the fault point ---- */

void link_hold(struct link *l, uint64_t ns, bool reads)
{
	struct timeval tv = { .tv_sec = (time_t)(ns / 1000000000ull),
			      .tv_usec = (suseconds_t)(ns % 1000000000ull / 1000) };
	l->held = true;
	if (reads && !l->hold_reads) {
		l->hold_reads = true;
		event_del(l->ev_read);
		event_del(l->ev_resume);
	}
	link_disarm_write(l);
	event_add(l->ev_hold, &tv);
}

void link_halfopen(struct link *l, bool both)
{
	l->halfopen = true;
	l->held = true;
	if (both && !l->hold_reads) {
		l->hold_reads = true;
		event_del(l->ev_read);
		event_del(l->ev_resume);
	}
	link_disarm_write(l);
}

/* The fault specs' part of link_fault: a data frame this host sends. */
static enum link_fault link_fault_spec(struct link *l, const Meshrun__Frame *f)
{
	struct net *n = l->net;
	struct fault_hit h;
	pthread_mutex_lock(&n->fault_mu);
	bool hit = fault_decide(&n->faults, n->host_id, l->peer, f->chunk->byte_count, &h);
	pthread_mutex_unlock(&n->fault_mu);
	if (!hit)
		return LINK_FAULT_PASS;
	/* a delay fires at every frame: logged once, at its first */
	if (h.kind != FAULT_DELAY || h.first)
		status_log(n, "fault: injected %s on link %d-%d at frame %llu", fault_kind_name(h.kind),
			   n->host_id, l->peer, (unsigned long long)h.frame);
	switch (h.kind) {
	case FAULT_CLOSE:
		if (n->replay_cap) {
			/* with recovery the drill is a reset, as a middlebox
			 * would make one: the link breaks on its next read or
			 * write, redials and resends this frame */
			if (shutdown(l->c->fd, SHUT_RDWR))
				status_log(n, "fault: close on link %d-%d: shutdown: %s", n->host_id,
					   l->peer, strerror(errno));
			break;
		}
		l->fault_data_frame = h.frame;
		return LINK_FAULT_CLOSE;
	case FAULT_DELAY:
	case FAULT_BLACKHOLE:
		link_hold(l, h.hold_ns, h.kind == FAULT_BLACKHOLE);
		break;
	case FAULT_DROP:
		return LINK_FAULT_DROP;
	case FAULT_HALFOPEN:
		link_halfopen(l, h.both);
		break;
	case FAULT_CORRUPT:
		/* nothing else is written before this frame's header */
		if (!tls_conn_corrupt_next(l->c))
			status_log(n, "fault: corrupt on link %d-%d: not a TLS link, nothing done",
				   n->host_id, l->peer);
		break;
	default:
		break;
	}
	return LINK_FAULT_PASS;
}

enum link_fault link_fault(struct link *l, bool outgoing, const Meshrun__Frame *f)
{
	struct net *n = l->net;
	if (n->fault) {
		int a = n->fault(n->fault_ctx, l->peer, outgoing, f->link_seq - 1, f);
		if (a != LINK_FAULT_PASS && a != LINK_FAULT_CLOSE) {
			fprintf(stderr, "meshrun: net_params.fault returned %d, not an enum link_fault\n", a);
			assert(!"unknown fault action");
		}
		if (a != LINK_FAULT_PASS)
			return (enum link_fault)a;
	}
	if (n->faults.n && outgoing && l->peer >= 0 && f->body_case == MESHRUN__FRAME__BODY_CHUNK)
		return link_fault_spec(l, f);
	return LINK_FAULT_PASS;
}

enum link_fault link_fault_data(struct link *l, bool outgoing, const struct frame_data *d,
				uint64_t payload_len)
{
	struct net *n = l->net;
	if (!n->fault && !n->faults.n)
		return LINK_FAULT_PASS;
	Meshrun__Frame f;
	Meshrun__CollectiveChunk c;
	frame_data_view(d, payload_len, &f, &c);
	return link_fault(l, outgoing, &f);
}

void link_fault_close(struct link *l, uint64_t frame_index)
{
	if (l->fault_close)
		return;
	l->fault_close = true;
	if (l->fault_data_frame)
		snprintf(l->fault_msg, sizeof(l->fault_msg),
			 "closed by an injected fault at sent frame %llu (data frame %llu)",
			 (unsigned long long)frame_index, (unsigned long long)l->fault_data_frame);
	else
		snprintf(l->fault_msg, sizeof(l->fault_msg), "closed by an injected fault at sent frame %llu",
			 (unsigned long long)frame_index);
	/* the net thread fails it (recv_defer_cb) */
	event_active(l->ev_defer, EV_READ, 0);
}

/* ---- queueing ---- */

int link_send(struct link *l, Meshrun__Frame *f)
{
	if (l->state == LS_DEAD || l->state == LS_DRAIN)
		return -EPIPE;
	/* an Ack is unsequenced: never kept, never resent, no fault point */
	bool unseq = f->body_case == MESHRUN__FRAME__BODY_ACK;
	f->link_seq = unseq ? 0 : ++l->tx_seq;
	f->ack_seq = l->ack_sent = link_rx_done(l);
	l->rx_unacked_bytes = 0;
	if (!unseq && link_fault(l, true, f) == LINK_FAULT_CLOSE) {
		link_fault_close(l, f->link_seq - 1);
		return 0;
	}
	size_t len = frame_encoded_len(f);
	struct ctrl_frame *c = malloc(sizeof(*c) + len);
	if (!c)
		return -ENOMEM;
	c->next = NULL;
	c->len = frame_encode(f, 0, c->data);
	c->heartbeat = f->body_case == MESHRUN__FRAME__BODY_HEARTBEAT;
	c->unseq = unseq;
	c->pooled = false;
	c->pay = NULL;
	c->pay_len = 0;
	c->req = NULL;
	c->seq = f->link_seq;
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
	link_arm_write(l);
	return 0;
}

int link_queue_msg(struct link *l, struct xreq *req)
{
	struct send_msg *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->req = req;
	if (l->dq_tail)
		l->dq_tail->next = m;
	else
		l->dq_head = m;
	l->dq_tail = m;
	link_arm_write(l);
	return 0;
}

/* ---- closing and failure ---- */

void link_begin_close(struct link *l, uint64_t deadline)
{
	if (l->state == LS_DEAD || l->state == LS_CLOSING || l->state == LS_DRAIN)
		return;
	if (l->state == LS_NEW || l->state == LS_CONNECTING || l->state == LS_HANDSHAKE ||
	    l->state == LS_BROKEN || l->state == LS_RECONNECTING) {
		link_kill(l);
		return;
	}
	link_set_state(l, LS_CLOSING);
	l->deadline_ns = deadline;
	link_arm_write(l);
}

static void peer_desc(struct link *l, char *buf, size_t len)
{
	struct net *n = l->net;
	if (l->peer >= 0 && l->peer < n->num_hosts)
		snprintf(buf, len, "host %d (%s)", l->peer, l->addr);
	else
		snprintf(buf, len, "%s", l->addr);
}

void link_fail_all(struct net *n, int status, int rc, const char *msg)
{
	status = status < 0 ? status : NET_ERR;
	if (!status_record(n, status, msg))
		return;
	if (n->x)
		xport_fail(n->x, rc, msg);
	n->phase = PH_FAILED;
	uint64_t deadline = now_ns() + CLOSE_GRACE_NS;
	for (struct link *l = n->links; l; l = l->next) {
		if (l->state == LS_DEAD)
			continue;
		link_lock(l);
		link_release_reqs(l, rc);
		if (l->state == LS_UP) {
			Meshrun__Frame f = MESHRUN__FRAME__INIT;
			Meshrun__Abort a = MESHRUN__ABORT__INIT;
			a.host_id = (uint32_t)n->host_id;
			a.reason = (char *)msg;
			a.code = -status;      /* the class as a positive errno */
			f.body_case = MESHRUN__FRAME__BODY_ABORT;
			f.abort = &a;
			link_send(l, &f);
		}
		link_begin_close(l, deadline);
		link_unlock(l);
	}
	if (!n->links)
		status_set_closed(n);
	event_active(n->ev_reap, EV_READ, 0);
}

void link_lost(struct link *l, int rc, const char *reason)
{
	struct net *n = l->net;
	char who[200], during[96], msg[512];

	if (l->state == LS_DEAD)
		return;
	if (l->off_main) {
		link_defer(l, DEFER_LOST, rc, reason, NULL);
		return;
	}
	peer_desc(l, who, sizeof(who));
	bool quiet = l->state == LS_CLOSING || l->state == LS_DRAIN || status_failed(n);

	switch (l->role) {
	case ROLE_COORD_IN:
		if (!quiet && l->peer >= 0 && n->peers[l->peer].coord_in == l && !n->topology_done) {
			snprintf(msg, sizeof(msg), "lost host %d (%s) during rendezvous: %s",
				 l->peer, l->addr, reason);
			link_kill(l);
			link_fail_all(n, NET_ERR_PEER_LOST, rc, msg);
			return;
		}
		if (!quiet && l->peer < 0 && !l->refused)
			status_log_refused(n, "connection", l->addr, reason);
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
		link_fail_all(n, NET_ERR_PEER_LOST, rc, msg);
		return;
	case ROLE_LINK_IN:
		if (l->state != LS_UP && l->peer < 0) {
			if (!quiet && !l->refused)
				status_log_refused(n, "link", l->addr, reason);
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
	status_activity(n, during, sizeof(during));
	if (l->state == LS_UP || l->was_up)
		snprintf(msg, sizeof(msg), "lost %s: %s%s", who, reason, during);
	else
		snprintf(msg, sizeof(msg), "link to %s failed: %s", who, reason);
	link_kill(l);
	link_fail_all(n, NET_ERR_PEER_LOST, rc, msg);
}

void link_bad_frame(struct link *l, const char *reason)
{
	char msg[400];
	if (l->off_main) {
		link_defer(l, DEFER_BAD, -EPROTO, reason, NULL);
		return;
	}
	snprintf(msg, sizeof(msg), "bad frame: %.380s", reason);
	link_lost(l, -EPROTO, msg);
}

void link_check_finish(struct net *n)
{
	if (n->phase != PH_FINISHING)
		return;
	for (int h = 0; h < n->num_hosts; h++) {
		if (h == n->host_id)
			continue;
		if (!n->peers[h].done_rx)
			return;
		/* with recovery, our Done may still need resending: close
		 * only when every peer has acknowledged it */
		struct link *l = n->peers[h].l[0];
		if (n->replay_cap && l && l->done_seq && l->acked < l->done_seq)
			return;
	}
	n->phase = PH_CLOSING;
	if (n->ev_coord_l) {
		event_free(n->ev_coord_l);
		n->ev_coord_l = NULL;
	}
	uint64_t deadline = now_ns() + 2 * CLOSE_GRACE_NS;
	for (struct link *l = n->links; l; l = l->next) {
		link_lock(l);
		/* the peers wait for their Done to be acknowledged */
		if (n->replay_cap)
			link_send_ack(l);
		link_begin_close(l, deadline);
		link_unlock(l);
	}
	if (!n->links)
		status_set_closed(n);
	event_active(n->ev_reap, EV_READ, 0);
}

/* ---- recovery: breaking, reattaching, acknowledgements ---- */

bool link_break(struct link *l, const char *reason)
{
	struct net *n = l->net;
	uint64_t now = now_ns();

	if (!n->replay_cap || !l->was_up || (l->role != ROLE_LINK_IN && l->role != ROLE_LINK_OUT) ||
	    l->peer < 0 || n->peers[l->peer].done_rx || status_failed(n) || n->stopping ||
	    n->phase >= PH_CLOSING || l->fault_close)
		return false;
	if (l->state != LS_UP && l->state != LS_RECONNECTING && l->state != LS_HANDSHAKE &&
	    l->state != LS_HELLO)
		return false;
	bool first = l->state == LS_UP;
	if (first) {
		l->broken_at_ns = now;
		l->retry_delay_ns = 0;         /* the first redial at once */
		snprintf(l->broken_why, sizeof(l->broken_why), "%s", reason);
		if (l->probe_fd >= 0)
			close(l->probe_fd);
		l->probe_fd = -1;
		l->probe_at_ns = now + LINK_PROBE_AFTER_NS;
		status_log(n, "link to host %d (%s) broke: %s; %s", l->peer, l->addr, reason,
			   l->role == ROLE_LINK_OUT ? "redialing" : "waiting for its redial");
		/* a payload half read: its frame comes again, and the bytes
		 * that landed are skipped then (a sum must not add twice) */
		if (l->rx_in_frame) {
			l->rx_part_seq = l->rx_seq;
			l->rx_part_got = l->rx_got > l->rx_skip ? l->rx_got : l->rx_skip;
			l->rx_seq--;
			l->rx_in_frame = false;
		}
	}
	event_del(l->ev_read);
	event_del(l->ev_resume);
	link_disarm_write(l);
	stream_del(l);
	conn_free(l->c);
	l->c = NULL;
	l->conn_dead = l->rx_blocked = false;
	if (l->halfopen) {
		/* the half-open connection is gone; the next one passes */
		l->halfopen = l->held = l->hold_reads = false;
		event_del(l->ev_hold);
	}
	l->defer = DEFER_NONE;
	l->rx_stage = RX_PREFIX;
	l->rx_got = 0;
	l->rx_skip = 0;
	l->rx_dup = false;
	/* the frame being written is whole in the replay copies */
	l->tx_active = false;
	free(l->tx_ctrl);              /* unsequenced (Ack) or none */
	l->tx_ctrl = NULL;
	free(l->hello_out);
	l->hello_out = NULL;
	l->rp_next = NULL;
	l->rd_wants_write = l->wr_wants_read = false;
	l->deadline_ns = 0;
	l->retry_at_ns = now + l->retry_delay_ns;
	l->retry_delay_ns = l->retry_delay_ns * 2 > REDIAL_MAX_NS ? REDIAL_MAX_NS
			    : l->retry_delay_ns ? l->retry_delay_ns * 2 : REDIAL_MIN_NS;
	link_set_state(l, LS_BROKEN);
	/* the tick redials (it runs now, not at its next 50 ms) */
	if (first && l->role == ROLE_LINK_OUT)
		event_active(n->ev_tick, EV_TIMEOUT, 0);
	return true;
}

bool link_probe(struct link *l, uint64_t now)
{
	struct net *n = l->net;
	char err[200], msg[400];
	if (l->state != LS_BROKEN || l->role != ROLE_LINK_IN || l->peer < 0 ||
	    l->peer >= n->num_hosts || !n->peers[l->peer].addr[0])
		return true;
	const char *addr = n->peers[l->peer].addr;
	if (l->probe_fd < 0) {
		if (now < l->probe_at_ns)
			return true;
		int fd = conn_connect_start(addr, err, sizeof(err));
		l->probe_at_ns = now + LINK_PROBE_EVERY_NS;
		if (fd >= 0) {
			l->probe_fd = fd;
			return true;
		}
		if (fd != -ECONNREFUSED)
			return true;
	} else {
		struct pollfd p = { .fd = l->probe_fd, .events = POLLOUT };
		int e = poll(&p, 1, 0) == 1 ? conn_connect_result(l->probe_fd) : -EINPROGRESS;
		if (e == -EINPROGRESS && now < l->probe_at_ns)
			return true;
		close(l->probe_fd);
		l->probe_fd = -1;
		if (e != -ECONNREFUSED)
			return true;
	}
	snprintf(msg, sizeof(msg), "its link broke (%.150s) and its listener %.128s refuses "
		 "connections: the process is gone", l->broken_why, addr);
	link_lost(l, -EHOSTDOWN, msg);
	return false;
}

int link_attach_conn(struct link *l, struct conn *c)
{
	struct net *n = l->net;
	struct event *r = event_new(n->base, c->fd, EV_READ | EV_PERSIST, n->link_cb, l);
	struct event *w = event_new(n->base, c->fd, EV_WRITE | EV_PERSIST, n->link_cb, l);
	if (!r || !w) {
		if (r)
			event_free(r);
		if (w)
			event_free(w);
		conn_free(c);
		return -ENOMEM;
	}
	event_free(l->ev_read);
	event_free(l->ev_write);
	l->ev_read = r;
	l->ev_write = w;
	l->write_armed = false;
	l->c = c;
	link_user_timeout(l, c->fd);
	link_notsent_lowat(l, c->fd);
	return 0;
}

void link_acked(struct link *l, uint64_t ack)
{
	struct ctrl_frame *c;
	bool freed = false;
	if (ack <= l->acked)
		return;
	l->acked = ack;
	while ((c = l->rp_head) && c->seq <= ack) {
		l->rp_head = c->next;
		if (!l->rp_head)
			l->rp_tail = NULL;
		if (l->rp_next == c)
			l->rp_next = c->next;
		l->rp_bytes -= c->len + c->pay_len;
		/* the peer has the message's last fragment, so all of it: the
		 * caller's buffer is free */
		if (c->req)
			xport_complete(c->req, 0);
		if (c->pooled && l->rp_pool_n < RP_POOL_MAX) {
			c->next = l->rp_pool;
			l->rp_pool = c;
			l->rp_pool_n++;
		} else {
			free(c);
		}
		freed = true;
	}
	/* a sender waiting for room writes on */
	if (freed && l->state == LS_UP && l->dq_head)
		link_arm_write(l);
	if (l->done_seq && ack >= l->done_seq) {
		if (l->off_main) {
			l->defer_finish = true;
			event_active(l->ev_defer, EV_READ, 0);
		} else {
			link_check_finish(l->net);
		}
	}
}

void link_replay_from(struct link *l, uint64_t last_seq)
{
	link_acked(l, last_seq);
	l->rp_next = l->rp_head;
}

void link_send_ack(struct link *l)
{
	if (l->state != LS_UP || link_rx_done(l) <= l->ack_sent)
		return;
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Ack a = MESHRUN__ACK__INIT;
	f.body_case = MESHRUN__FRAME__BODY_ACK;
	f.ack = &a;
	link_send(l, &f);
}

void link_conn_failed(struct link *l, int rc, const char *reason)
{
	if (l->off_main) {
		link_defer(l, DEFER_CONN, rc, reason, NULL);
		return;
	}
	if (!link_break(l, reason))
		link_lost(l, rc, reason);
}
