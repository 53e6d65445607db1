/* Receiving: a link's events (connect, TLS handshake, readable, writable),
 * the read path that decrypts payloads straight into posted receive
 * buffers (or sums them on the way), and dispatching each frame to what
 * handles it; on UP data links the same read path runs on stream threads
 * and on device threads that poll (net/link.h says what they may do), and
 * the net thread takes over what they deferred. The top of the link code:
 * calls rendezvous.c, send.c, link.c and status.c in net/; called through
 * the callbacks net.c registers and by direct.c. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "net/net_int.h"
#include "net/rec_log.h"
#include "net/tls.h"

static size_t link_read(struct link *l, size_t budget);
static bool dispatch(struct link *l, Meshrun__Frame *f);

/* Writes what is queued. If writing failed (the peer closed or reset): a
 * peer that leaves on purpose says why first (Abort, Done), so read what
 * it sent before blaming it. */
void recv_write(struct link *l)
{
	if (!send_write(l))
		return;
	char why[256];
	snprintf(why, sizeof(why), "%s", l->c->err);
	if (l->state != LS_DRAIN && !l->rx_blocked)
		link_read(l, READ_BUDGET);
	if (l->state != LS_DEAD && l->state != LS_BROKEN)
		link_conn_failed(l, -EPIPE, why);
}

/* ---- receiving ---- */

static void on_recv_ready(struct link *l, const struct frame_rr *rr);

/* A data frame header: find the posted receive and aim the payload at it. */
static void on_chunk(struct link *l, const struct frame_data *c, uint64_t byte_count)
{
	struct net *n = l->net;
	char why[300];
	int src = (int)c->src, dst = (int)c->dst;

	l->rx_dst = NULL;
	if (l->state != LS_UP || status_failed(n))
		return;                 /* discard */
	struct wire_self self = net_wire_self(n);
	struct wire_rx_msg m = { .in_msg = l->rx_req != NULL, .src = l->rx_src,
				 .dst = l->rx_dst_dev, .tag = l->rx_tag, .next = l->rx_next,
				 .total = l->rx_total };
	if (wire_check_chunk(&self, l->peer, &m, c, why, sizeof(why))) {
		link_bad_frame(l, why);
		return;
	}
	if (c->flags & FRAME_DATA_RR) {
		on_recv_ready(l, &c->rr);
		if (l->state != LS_UP)
			return;
	}
	if (!l->rx_req) {
		const char *what;
		struct xreq *r = xport_remote_data(n->x, src, dst, c->tag, (size_t)c->msg_bytes,
						   (c->flags & FRAME_DATA_EAGER) != 0, &what);
		if (!r) {
			if (status_failed(n))
				return;
			snprintf(why, sizeof(why),
				 "data from device %d to device %d (tag 0x%llx, %llu bytes) %s",
				 src, dst, (unsigned long long)c->tag, (unsigned long long)c->msg_bytes,
				 what);
			link_bad_frame(l, why);
			return;
		}
		l->rx_req = r;
		l->rx_src = src;
		l->rx_dst_dev = dst;
		l->rx_tag = c->tag;
		l->rx_total = c->msg_bytes;
		l->rx_next = 0;
		l->rx_land = (struct xland){ 0 };
	}
	size_t avail;
	l->rx_dst = xreq_at(l->rx_req, (size_t)c->msg_offset, &avail);
	l->rx_at = c->msg_offset;
	l->rx_next += byte_count;
}

/* The payload of the current data frame (possibly empty) is in. true if
 * that completed its message. */
static bool chunk_payload_done(struct link *l)
{
	l->rx_dst = NULL;
	if (l->rx_req && l->rx_next == l->rx_total) {
		xport_complete(l->rx_req, 0);
		l->rx_req = NULL;
		return true;
	}
	return false;
}

static void on_recv_ready(struct link *l, const struct frame_rr *rr)
{
	struct net *n = l->net;
	char why[200];
	if (status_failed(n))
		return;
	struct wire_self self = net_wire_self(n);
	if (wire_check_recv_ready(&self, l->peer, rr, why, sizeof(why))) {
		link_bad_frame(l, why);
		return;
	}
	struct xreq *r = xport_remote_ready(n->x, (int)rr->src, (int)rr->dst, rr->tag,
					    (size_t)rr->bytes);
	if (!r)
		return;
	if (link_queue_msg(l, r))
		xport_complete(r, -ENOMEM);
}

/* One complete control frame arrived on l. true if f was taken (handed
 * to the net thread: a frame a stream or device thread may not act on),
 * else the caller frees it. */
static bool dispatch(struct link *l, Meshrun__Frame *f)
{
	struct net *n = l->net;
	char why[600], text[480];
	int body = f->body_case;

	if (l->state == LS_CLOSING || l->state == LS_DRAIN) {
		if (body == MESHRUN__FRAME__BODY_REFUSE && l->role == ROLE_COORD_OUT &&
		    !n->topology_done)
			goto refused;
		return false;
	}
	if (l->off_main && l->state == LS_UP && body != MESHRUN__FRAME__BODY_HEARTBEAT &&
	    body != MESHRUN__FRAME__BODY_RECV_READY) {
		link_defer(l, DEFER_NONE, 0, NULL, f);
		return true;
	}
	if (l->state == LS_HELLO) {
		if (wire_check_hello_stage(l->role, body, why, sizeof(why))) {
			if (l->role == ROLE_COORD_IN || (l->role == ROLE_LINK_IN && l->peer < 0))
				rdv_refuse_conn(l, why);
			else
				link_bad_frame(l, why);
			return false;
		}
		switch (l->role) {
		case ROLE_COORD_IN:
			rdv_coord_on_hello(l, f->hello);
			return false;
		case ROLE_COORD_OUT:
			if (body == MESHRUN__FRAME__BODY_REFUSE)
				goto refused;
			if (body == MESHRUN__FRAME__BODY_ABORT) {
				rdv_coord_on_abort(l, f->abort);
				return false;
			}
			rdv_agent_on_topology(l, f->topology);
			return false;
		case ROLE_LINK_IN:
			rdv_accept_link_hello(l, f->link_hello);
			return false;
		case ROLE_LINK_OUT:
			if (body == MESHRUN__FRAME__BODY_REFUSE) {
				snprintf(why, sizeof(why), "host %d (%s) refused our link: %s", l->peer,
					 l->addr, wire_peer_text(f->refuse->reason, text, sizeof(text)));
				link_kill(l);
				link_fail_all(n, NET_ERR_REFUSED, -ECONNREFUSED, why);
				return false;
			}
			if (l->was_up) {
				rdv_link_resumed(l, f->link_hello);
				return false;
			}
			struct wire_self self = net_wire_self(n);
			if (wire_check_link_answer(&self, l->peer, l->addr, (unsigned)l->stream, false,
						   f->link_hello, why, sizeof(why))) {
				link_bad_frame(l, why);
				return false;
			}
			rdv_link_up(l, l->peer);
			return false;
		}
		return false;
	}
	/* LS_UP */
	if (wire_check_running(body, why, sizeof(why))) {
		link_bad_frame(l, why);
		return false;
	}
	switch (body) {
	case MESHRUN__FRAME__BODY_HEARTBEAT:
		return false;
	case MESHRUN__FRAME__BODY_RECV_READY: {
		const Meshrun__RecvReady *m = f->recv_ready;
		struct frame_rr rr = { .src = m->src_device, .dst = m->dst_device, .tag = m->tag,
				       .bytes = m->byte_count };
		on_recv_ready(l, &rr);
		return false;
	}
	case MESHRUN__FRAME__BODY_BARRIER:
		n->peers[l->peer].barrier_rx = true;
		rdv_check_barrier(n);
		return false;
	case MESHRUN__FRAME__BODY_DONE:
		n->peers[l->peer].done_rx = true;
		if (f->done->status) {
			snprintf(why, sizeof(why), "host %d finished with status %d", l->peer,
				 f->done->status);
			link_fail_all(n, wire_done_status(f->done->status), -ECONNABORTED, why);
			return false;
		}
		link_check_finish(n);
		return false;
	case MESHRUN__FRAME__BODY_ABORT: {
		int code = wire_done_status(f->abort->code);
		snprintf(why, sizeof(why), "host %d aborted the job: %s", l->peer,
			 wire_peer_text(f->abort->reason, text, sizeof(text)));
		/* the sender closes next; that is not news */
		n->peers[l->peer].done_rx = true;
		link_fail_all(n, code, -ECONNABORTED, why);
		return false;
	}
	}
	return false;

refused:
	snprintf(why, sizeof(why), "rendezvous refused by the coordinator (%s): %s", l->addr,
		 wire_peer_text(f->refuse->reason, text, sizeof(text)));
	link_kill(l);
	link_fail_all(n, NET_ERR_REFUSED, -ECONNREFUSED, why);
	return false;
}

/* Sequence numbers (wire_check_seq) and, with recovery, the ack_seq
 * every frame carries; an Ack; the peer's resume hello; a frame we have
 * already (dropped); the frame whose payload was half read when the link
 * broke (the rest of it is read). true if f was handled (and freed) here:
 * a bad number fails the link. */
static bool recv_seq(struct link *l, Meshrun__Frame *f, int body, uint64_t link_seq,
		     uint64_t ack_seq)
{
	struct net *n = l->net;
	char why[300];
	bool acks = l->state == LS_UP || l->state == LS_CLOSING;
	struct wire_rx_seq s = { .replay = n->replay_cap > 0, .hello = l->state == LS_HELLO,
				 .acks = acks, .rx_seq = l->rx_seq, .tx_seq = l->tx_seq,
				 .part_seq = l->rx_part_seq };
	int k = wire_check_seq(&s, body, link_seq, ack_seq, why, sizeof(why));
	if (k == WIRE_SEQ_RESUME_HELLO) {
		if (!dispatch(l, f))
			frame_header_free(f);
		l->rx_got = 0;
		l->rx_stage = RX_PREFIX;
		return true;
	}
	if (k >= 0 && n->replay_cap && acks)
		link_acked(l, ack_seq);
	if (k < 0) {
		frame_header_free(f);
		link_bad_frame(l, why);
		return true;
	}
	if (k == WIRE_SEQ_GAP) {
		/* a frame went missing: the connection cannot be trusted, the
		 * redial's hello asks for everything after rx_seq again */
		frame_header_free(f);
		link_conn_failed(l, -EPROTO, why);
		return true;
	}
	if (k == WIRE_SEQ_SKIP) {
		/* an Ack, or a frame we have: its payload (if any) is skipped */
		frame_header_free(f);
		l->rx_dst = NULL;
		l->rx_got = 0;
		l->rx_stage = l->rx_p.payload_len ? RX_PAYLOAD : RX_PREFIX;
		l->rx_skip = l->rx_p.payload_len;
		l->rx_dup = l->rx_p.payload_len > 0;
		return true;
	}
	if (k == WIRE_SEQ_PART) {
		/* on_chunk ran for it before the break and its receive is set */
		l->rx_seq = link_seq;
		l->rx_in_frame = true;
		l->rx_skip = l->rx_part_got;
		l->rx_part_seq = 0;
		frame_header_free(f);
		l->rx_got = 0;
		l->rx_stage = RX_PAYLOAD;
		return true;
	}
	return false;
}

/* A data frame's header bytes are in: check, aim the payload. */
static void data_header_done(struct link *l)
{
	struct net *n = l->net;
	char why[300];
	struct frame_data d;
	uint64_t plen = l->rx_p.payload_len;
	if (frame_parse_data(l->rx_hdr, l->rx_p.header_len, plen, &n->lim, &d, why, sizeof(why))) {
		link_bad_frame(l, why);
		return;
	}
	if (recv_seq(l, NULL, MESHRUN__FRAME__BODY_CHUNK, d.link_seq, d.ack_seq))
		return;
	l->rx_seq = d.link_seq;
	if (link_fault_data(l, false, &d, plen) == LINK_FAULT_CLOSE) {
		snprintf(why, sizeof(why), "closed by an injected fault at received frame %llu",
			 (unsigned long long)(d.link_seq - 1));
		link_lost(l, -EPIPE, why);
		return;
	}
	if (n->replay_cap) {
		l->rx_unacked_bytes += l->rx_p.header_len + plen;
		l->rx_in_frame = plen > 0;
		/* the sender holds the caller's buffer until we say we have it */
		l->rx_ack_now = (d.flags & FRAME_DATA_ACK) != 0;
	}
	l->rx_dst = NULL;
	if (l->state == LS_UP) {
		on_chunk(l, &d, plen);
	} else if (l->state != LS_CLOSING && l->state != LS_DRAIN) {
		snprintf(why, sizeof(why), "unexpected chunk frame before the hello");
		if (l->role == ROLE_COORD_IN || (l->role == ROLE_LINK_IN && l->peer < 0))
			rdv_refuse_conn(l, why);
		else
			link_bad_frame(l, why);
	}
	if (l->state == LS_DEAD || l->state == LS_BROKEN)
		return;
	if (n->replay_cap && l->rx_unacked_bytes > n->replay_cap / 4)
		link_send_ack(l);
	l->rx_got = 0;
	if (plen) {
		l->rx_stage = RX_PAYLOAD;
	} else {
		l->rx_stage = RX_PREFIX;
		chunk_payload_done(l);
		if (l->rx_ack_now) {
			l->rx_ack_now = false;
			link_send_ack(l);
		}
	}
}

/* Header bytes are in: check, dispatch, set up the payload. */
static void header_done(struct link *l)
{
	struct net *n = l->net;
	char why[300];
	if (l->rx_p.data) {
		data_header_done(l);
		return;
	}
	Meshrun__Frame *f = frame_parse_header(l->rx_hdr, l->rx_p.header_len, l->rx_p.payload_len,
					       &n->lim, why, sizeof(why));
	if (!f) {
		link_bad_frame(l, why);
		return;
	}
	if (recv_seq(l, f, f->body_case, f->link_seq, f->ack_seq))
		return;
	l->rx_seq = f->link_seq;
	if (link_fault(l, false, f) == LINK_FAULT_CLOSE) {
		/* as if the read had failed */
		snprintf(why, sizeof(why), "closed by an injected fault at received frame %llu",
			 (unsigned long long)(f->link_seq - 1));
		frame_header_free(f);
		link_lost(l, -EPIPE, why);
		return;
	}
	if (n->replay_cap)
		l->rx_unacked_bytes += l->rx_p.header_len;
	if (!dispatch(l, f))
		frame_header_free(f);
	if (l->state == LS_DEAD || l->state == LS_BROKEN)
		return;
	/* much arrived without our sending: say so before the peer's replay
	 * copies fill */
	if (n->replay_cap && l->rx_unacked_bytes > n->replay_cap / 4)
		link_send_ack(l);
	l->rx_got = 0;
	l->rx_stage = RX_PREFIX;
}

/* Reads and handles frames until the socket has nothing more, the link
 * stops (a failure, a hold, a frame handed to the net thread) or budget
 * bytes are in. Returns the bytes read.
 * "Nothing more" without a last recv() that meets EAGAIN (a system call,
 * and OpenSSL's error path): when a read's recv() came back short
 * (conn.drained), OpenSSL holds no byte and those bytes completed a
 * message, the turn ends there, as the peer's next message comes when its
 * next op does. Within a message the next record is usually on its way
 * and lands while this one is decrypted, so the read goes on there: a
 * stream thread does not trade a recv() for a round through epoll. The
 * socket's next bytes fire the watch (EPOLLIN, armed again as the lock
 * goes), the net thread's EV_READ, or a poller's next round. (drained is
 * asked before the bytes act: what they set off may close the conn.) */
/* Where the current frame's payload goes next, and how much of it
 * (*want): skipped or discarded into scratch; through bounce (*via) when
 * it sums, or when it is a message over runs shorter than a record on
 * average (a read a record, landed run by run, not a read a run); else
 * straight into the posted receive (over longer runs: to the end of the
 * run, the next read the next). */
static uint8_t *payload_dst(struct link *l, uint8_t *scratch, size_t nscratch, uint8_t *bounce,
			    size_t nbounce, size_t *want, bool *via)
{
	size_t w = (size_t)(l->rx_p.payload_len - l->rx_got), avail = SIZE_MAX;
	uint8_t *dst = scratch;
	bool land = l->rx_dst && l->rx_req && l->state == LS_UP;
	if (l->rx_got < l->rx_skip) {
		/* landed before a break, or a frame we have */
		size_t skip = (size_t)(l->rx_skip - l->rx_got);
		avail = skip < nscratch ? skip : nscratch;
	} else if (land && (l->rx_req->addend ||
			    (l->rx_req->runs && l->rx_req->len / (size_t)l->rx_req->nruns < nbounce))) {
		*via = true;
		dst = bounce;
		avail = nbounce;
	} else if (land && l->rx_req->runs) {
		dst = xreq_at(l->rx_req, (size_t)(l->rx_at + l->rx_got), &avail);
	} else if (land) {
		dst = l->rx_dst + l->rx_got;
	} else {
		avail = nscratch;
	}
	*want = w < avail ? w : avail;
	return dst;
}

static size_t link_read(struct link *l, size_t budget)
{
	struct net *n = l->net;
	size_t total = 0;
	/* discarded payloads, never read: one per thread */
	static _Thread_local uint8_t scratch[64 * 1024];
	/* payloads of receives that sum, on their way to the sum: small
	 * enough to stay in L1, a TLS record's worth */
	static _Thread_local _Alignas(64) uint8_t bounce[16 * 1024];
	char why[300];

	/* a fault that closed the link while we read: stop, the event fails it */
	while (l->state != LS_DEAD && l->state != LS_BROKEN && !l->fault_close && !l->hold_reads &&
	       !l->rx_blocked && !l->conn_dead) {
		if (!budget) {
			/* Yield through the poll, not around it: re-activating
			 * ourselves here would run again before epoll and the
			 * timers, so a link that never runs dry would starve its
			 * own writes, the other links and the heartbeats. Bytes
			 * left in the socket fire EV_READ again (level-triggered);
			 * bytes already in user space do not, so a zero timeout
			 * brings us back after the next poll. (Another thread's
			 * caller looks at conn_pending itself.) */
			if (!l->off_main && conn_pending(l->c)) {
				static const struct timeval now_tv = { 0, 0 };
				event_add(l->ev_resume, &now_tv);
			}
			break;
		}
		uint8_t *dst;
		size_t want;
		bool via = false;
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
			dst = payload_dst(l, scratch, sizeof(scratch), bounce, sizeof(bounce), &want, &via);
			break;
		}
		ssize_t r = conn_read(l->c, dst, want);
		if (r == -EAGAIN) {
			if (l->c->want == CONN_WANT_WRITE) {
				l->rd_wants_write = true;
				link_arm_write(l);
			}
			break;
		}
		if (r == 0) {
			link_conn_failed(l, -EPIPE, l->rx_stage == RX_PREFIX && !l->rx_got
					  ? "connection closed by peer"
					  : "connection closed by peer in the middle of a frame");
			return total;
		}
		if (r < 0) {
			char err[256];
			snprintf(err, sizeof(err), "%s", l->c->err);
			/* before the hello: the peer may refuse our certificate
			 * only now (TLS 1.3 checks the client's after its Finished) */
			if (l->state != LS_HELLO || !rdv_handshake_failed(l, (int)r, err))
				link_conn_failed(l, -EPIPE, err);
			return total;
		}
		if (!total)     /* heard from the peer: one clock read a turn */
			l->last_rx_ns = now_ns();
		bool drained = l->c->drained && !conn_pending(l->c), msg_done = false;
		if (via)
			xport_land_stream(l->rx_req, &l->rx_land, bounce, (size_t)r);
		l->rx_got += (size_t)r;
		total += (size_t)r;
		budget = (size_t)r >= budget ? 0 : budget - (size_t)r;
		switch (l->rx_stage) {
		case RX_PREFIX:
			if (l->rx_got < FRAME_PREFIX_LEN)
				break;
			if (frame_parse_prefix(l->rx_prefix, &n->lim, &l->rx_p, why, sizeof(why))) {
				link_bad_frame(l, why);
				return total;
			}
			if (l->rx_hdr_cap < l->rx_p.header_len) {
				uint8_t *b = realloc(l->rx_hdr, l->rx_p.header_len);
				if (!b) {
					link_lost(l, -ENOMEM, "out of memory");
					return total;
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
				l->rx_skip = 0;
				l->rx_in_frame = false;
				if (l->rx_dup)
					l->rx_dup = false;     /* a frame we had: nothing lands */
				else
					msg_done = chunk_payload_done(l);
				if (l->rx_ack_now ||
				    (n->replay_cap && l->rx_unacked_bytes > n->replay_cap / 4))
					link_send_ack(l);
				l->rx_ack_now = false;
				l->rx_stage = RX_PREFIX;
				l->rx_got = 0;
			}
			break;
		}
		if (drained && msg_done)
			break;
		/* a stream thread that completed a sleeper's receive (its
		 * wake-up held): after a small message the sleeper reads what
		 * follows itself, into its posted buffers, once it runs; the
		 * rest of the turn would only keep it waiting, and keep the
		 * lock it will want at its next post (recv_stream_cb). After a
		 * large one (a waiter that sleeps in the kernel between its
		 * records, XPORT_IDLE_MIN_BYTES) the turn goes on: it is woken
		 * now, as the next segment is likely on its way here */
		if (msg_done && xport_wakes_held()) {
			if (l->rx_total < XPORT_IDLE_MIN_BYTES)
				break;
			xport_wake_held();
		}
	}
	if (l->state == LS_BROKEN || l->conn_dead)
		return total;
	if (l->state != LS_DEAD && l->wr_wants_read) {
		l->wr_wants_read = false;
		recv_write(l);
	}
	/* reading may have made OpenSSL write (alerts, key updates) */
	if (l->state != LS_DEAD && l->state != LS_DRAIN && l->state != LS_BROKEN && !l->conn_dead &&
	    conn_flush(l->c) == -EAGAIN)
		link_arm_write(l);
	return total;
}

/* ---- handshake and events ---- */

static void link_handshake(struct link *l)
{
	struct net *n = l->net;
	char why[300];
	int rc = conn_handshake(l->c);
	if (rc == -EAGAIN) {
		if (l->c->want == CONN_WANT_WRITE)
			link_arm_write(l);
		else
			link_disarm_write(l);
		return;
	}
	link_disarm_write(l);
	if (rc < 0) {
		char err[256];
		snprintf(err, sizeof(err), "%s", l->c->err);
		if (!rdv_handshake_failed(l, rc, err))
			link_conn_failed(l, -EPROTO, err);
		return;
	}
	link_set_state(l, LS_HELLO);
	switch (l->role) {
	case ROLE_COORD_OUT:
		if (!tls_peer_is_host(l->c, 0, why, sizeof(why))) {
			char msg[512];
			snprintf(msg, sizeof(msg), "coordinator %s: %s", l->addr, why);
			link_kill(l);
			link_fail_all(n, NET_ERR_REFUSED, -EPROTO, msg);
			return;
		}
		rdv_send_hello(l);
		break;
	case ROLE_LINK_OUT:
		if (l->was_up) {
			/* a redial: the same pinning, and a failed check is one
			 * failed attempt (logged), not the job's end */
			if (!tls_peer_is_host(l->c, l->peer, why, sizeof(why))) {
				status_log(n, "redial of host %d (%s): %s", l->peer, l->addr, why);
				link_conn_failed(l, -EPROTO, why);
				return;
			}
			if (send_resume_hello(l))
				link_conn_failed(l, -ENOMEM, "out of memory");
			break;
		}
		if (!tls_peer_is_host(l->c, l->peer, why, sizeof(why))) {
			char msg[512];
			snprintf(msg, sizeof(msg), "link to host %d (%s): %s", l->peer, l->addr, why);
			link_kill(l);
			link_fail_all(n, NET_ERR_REFUSED, -EPROTO, msg);
			return;
		}
		send_link_hello(l);
		break;
	default:
		break;
	}
	/* records may already sit in OpenSSL's buffer */
	link_read(l, READ_BUDGET);
}

static void link_connected(struct link *l)
{
	struct net *n = l->net;
	int rc = conn_connect_result(l->c->fd);
	if (rc && l->was_up) {
		/* nobody listens there any more: the peer is gone */
		if (rc == -ECONNREFUSED)
			link_lost(l, -EPIPE, l->broken_why);
		else
			link_conn_failed(l, rc, conn_strerror(-rc));
		return;
	}
	if (rc) {
		/* not listening yet (or gone): retry until the phase deadline */
		snprintf(n->coord_err, sizeof(n->coord_err), "%s", conn_strerror(-rc));
		if (l->role == ROLE_COORD_OUT)
			n->coord_retry_at = now_ns() + RETRY_NS;
		else
			n->peers[l->peer].retry_at[l->stream] = now_ns() + RETRY_NS;
		link_kill(l);
		return;
	}
	link_set_state(l, LS_HANDSHAKE);
	event_add(l->ev_read, NULL);
	link_handshake(l);
}

static void event_locked(struct link *l, short what)
{
	if (l->state != LS_DEAD && l->fault_close) {
		/* as if the read had failed (link_fault_close woke us) */
		link_lost(l, -EPIPE, l->fault_msg);
		return;
	}
	switch (l->state) {
	case LS_DEAD:
	case LS_BROKEN:
	case LS_UP:            /* its stream thread's (a stale event) */
		return;
	case LS_CONNECTING:
	case LS_RECONNECTING:
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
		link_read(l, READ_BUDGET);
	if ((what & EV_WRITE) && l->state != LS_DEAD) {
		if (l->rd_wants_write) {
			l->rd_wants_write = false;
			link_read(l, READ_BUDGET);
		}
		if (l->state != LS_DEAD && l->state != LS_UP)
			recv_write(l);
	}
}

void recv_event_cb(evutil_socket_t fd, short what, void *arg)
{
	struct link *l = arg;
	(void)fd;
	link_lock(l);
	event_locked(l, what);
	link_unlock(l);
}

/* What another thread left for the net thread (link_defer), in order: the
 * frame it met (so an Abort or Done is read before its link is blamed),
 * the finish check, the failure; then the net thread reads on where it
 * stopped and gives the link back to its stream thread. */
static void defer_locked(struct link *l)
{
	struct net *n = l->net;
	if (l->state == LS_DEAD)
		return;
	if (l->fault_close) {
		link_lost(l, -EPIPE, l->fault_msg);
		return;
	}
	Meshrun__Frame *f = l->defer_frame;
	l->defer_frame = NULL;
	if (f) {
		if (!dispatch(l, f))
			frame_header_free(f);
		if (l->state == LS_DEAD || l->state == LS_BROKEN)
			return;
	}
	if (l->defer_finish) {
		l->defer_finish = false;
		link_check_finish(n);
	}
	if (l->defer != DEFER_NONE) {
		char why[256];
		enum link_defer what = l->defer;
		int rc = l->defer_rc;
		snprintf(why, sizeof(why), "%s", l->defer_why);
		l->defer = DEFER_NONE;
		if (what == DEFER_CONN)
			link_conn_failed(l, rc, why);
		else if (what == DEFER_BAD)
			link_bad_frame(l, why);
		else
			link_lost(l, rc, why);
		return;
	}
	l->rx_blocked = false;
	if (l->state != LS_UP)
		return;
	/* records may sit in OpenSSL's buffer, where no epoll sees them */
	link_read(l, READ_BUDGET);
	if (l->state == LS_UP && l->want_write && !l->held)
		recv_write(l);
}

void recv_defer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct link *l = arg;
	(void)fd;
	(void)what;
	link_lock(l);
	defer_locked(l);
	link_unlock(l);
}

/* A stream thread's turn on an UP link: read what came (a budget's
 * worth), write what waits. If the budget ran out with records left in
 * OpenSSL's buffer, where epoll does not see them, it asks for another
 * turn (returns true), which the stream thread gives after its other
 * links' events (stream.c), so a link that always has a budget's worth
 * to read cannot hold the thread. Device threads polling the link read
 * it themselves, and a link held, blocked or failed is left alone: its
 * owner arms the watch again (link_watch) when that ends. */
static bool stream_cb(struct link *l, uint32_t events);

/* MESHRUN_STREAM_WAKE=now: the stream thread wakes a sleeper at once,
 * under the link's lock, and reads on (as before small15), for A/B */
static int wake_late = -1;

bool recv_stream_cb(struct link *l, uint32_t events)
{
	if (wake_late < 0) {
		const char *e = getenv("MESHRUN_STREAM_WAKE");
		wake_late = !(e && !strcmp(e, "now"));
	}
	uint64_t t0 = rec_log_on() ? rec_log_now() : 0;
	/* a sleeper whose request this turn completes is woken after the
	 * link's lock is let go, and the turn ends there (link_read) */
	if (wake_late)
		xport_hold_wakes();
	bool again = stream_cb(l, events);
	if (wake_late)
		xport_release_wakes();
	if (t0)
		rec_mark(REC_STREAM, 0, events, t0);
	return again;
}

static bool stream_cb(struct link *l, uint32_t events)
{
	bool again = false;
	if (events & STREAM_AGAIN) {
		/* a thread waiting in link_lock (the net thread's tick with a
		 * heartbeat to write, a device thread's send) goes first: the
		 * mutex is not fair, and relocking at once would win every
		 * time against a waiter still being woken, so a link that
		 * always has a budget's worth to read would starve it. The
		 * lock is taken, not tried: the records this turn is for are
		 * in OpenSSL's buffer, and no event would bring us back */
		sched_yield();
		while (atomic_load_explicit(&l->lockers, memory_order_relaxed))
			sched_yield();
		link_lock(l);
		events = 0;
	} else if (!link_trylock(l)) {
		/* The holder may be the thread whose arming woke us: on its
		 * core the wake-up preempts it with the lock still held, and
		 * a kick would have it arm again as it lets go, be preempted
		 * again, and so on (an epoll_ctl and two context switches a
		 * round, no byte read; ~45 rounds per 64 KiB all_gather on a
		 * busy machine). One yield lets a preempted holder finish
		 * first; on another core it returns at once. */
		sched_yield();
		if (!link_trylock(l)) {
			/* the holder sees kick when it lets go (link_unlock) */
			atomic_store(&l->kick, 1);
			if (!link_trylock(l))
				return false;
		}
		l->armed = 0;     /* the one shot is spent */
	} else {
		l->armed = 0;
	}
	if (l->state == LS_UP && l->watched && !l->conn_dead && !l->pollers) {
		if ((events & EPOLLOUT) || l->want_write || l->rd_wants_write) {
			if (l->rd_wants_write) {
				l->rd_wants_write = false;
				link_read(l, READ_BUDGET);
			}
			if (l->state == LS_UP && !l->held && !l->conn_dead)
				recv_write(l);
		}
		/* another turn only if the budget ran out with records left
		 * in OpenSSL's buffer; a read that met an empty socket
		 * (EAGAIN) stops here even when a partial record waits there
		 * (SSL_has_pending counts it): the socket's next bytes fire
		 * the armed watch, and meanwhile the thread's other links get
		 * their turn */
		if (l->state == LS_UP && !l->rx_blocked && !l->hold_reads && !l->conn_dead)
			again = (link_read(l, READ_BUDGET) >= READ_BUDGET || xport_wakes_held()) &&
				l->state == LS_UP &&
				!l->conn_dead && conn_pending(l->c);
	}
	link_unlock(l);
	return again;
}

void recv_stream_tick(struct net *n, int stream)
{
	uint64_t now = now_ns();
	for (int h = 0; h < n->num_hosts; h++) {
		struct link *l = h == n->host_id ? NULL :
			atomic_load_explicit(&n->peers[h].dl[stream], memory_order_acquire);
		/* a look without the lock first: a link its device thread is
		 * polling, or whose linger has time left, is not taken from it */
		if (!l || !l->lingering || l->pollers || now < l->linger_ns)
			continue;
		link_lock(l);
		if (l->lingering && !l->pollers && now >= l->linger_ns) {
			l->lingering = false;
			atomic_fetch_sub(&n->lingering, 1);
			/* link_unlock arms the watch; records may wait in
			 * OpenSSL's buffer, where epoll does not see them */
			if (l->state == LS_UP && conn_pending(l->c))
				recv_poll(l, READ_BUDGET, false);
		}
		link_unlock(l);
	}
}

/* MESHRUN_POLL_ORDER=write: a waiter on a large message writes a turn
 * before it reads, and a large send seals without reading first (as
 * before net16), for A/B */
static int read_first = -1;

static bool reads_first(void)
{
	if (read_first < 0) {
		const char *e = getenv("MESHRUN_POLL_ORDER");
		read_first = !(e && !strcmp(e, "write"));
	}
	return read_first;
}

/* One read turn of l (lock held): at most budget bytes, into posted
 * buffers; the bytes read (0 when the link may not be read). */
static size_t read_turn(struct link *l, size_t budget)
{
	if (l->state != LS_UP || l->conn_dead || l->rx_blocked || l->hold_reads)
		return 0;
	return link_read(l, budget);
}

/* One write turn of what is queued on l (lock held); whether any byte
 * left. */
static bool write_turn(struct link *l)
{
	if (l->state != LS_UP || l->conn_dead || !l->want_write || l->held)
		return false;
	uint64_t before = atomic_load_explicit(&l->net->bytes_sent, memory_order_relaxed);
	recv_write(l);
	return atomic_load_explicit(&l->net->bytes_sent, memory_order_relaxed) != before;
}

void recv_before_send(struct link *l)
{
	size_t got = reads_first() ? read_turn(l, l->net->max_send) : 0;
	if (got)
		atomic_fetch_add_explicit(&l->net->reads_before_send, got, memory_order_relaxed);
}

bool recv_poll(struct link *l, size_t budget, bool large)
{
	if (l->state != LS_UP || l->conn_dead)
		return false;
	if (large && reads_first()) {
		/* what the peer sent first, then one write turn: a write turn
		 * first and another after the read sealed 2 MiB per 256 KiB
		 * opened, so both hosts sealed their whole send window while
		 * the other's bytes waited in the socket (a 16 MiB permute's
		 * receive queues at 0.6 MiB on average, up to 7.5) */
		bool queued = l->want_write;
		size_t got = read_turn(l, budget);
		if (got && queued)
			atomic_fetch_add_explicit(&l->net->polls_read_first, 1, memory_order_relaxed);
		bool wrote = write_turn(l);
		return got || wrote;
	}
	bool moved = write_turn(l);
	moved |= read_turn(l, budget) > 0;
	write_turn(l);
	return moved;
}

bool recv_idle(struct link *l, uint64_t ns)
{
	if (!link_trylock(l))
		return false;     /* another thread is working on it */
	/* a link that is not UP may have no connection at all (recovery) */
	bool ok = l->state == LS_UP && l->c && !l->conn_dead && !l->rx_blocked &&
		  !l->hold_reads && !conn_pending(l->c);
	struct pollfd p = { .fd = ok ? l->c->fd : -1, .events = POLLIN };
	if (l->want_write && !l->held)
		p.events |= POLLOUT;
	link_unlock(l);
	if (!ok)
		return false;
	/* without the lock: should the connection be replaced meanwhile
	 * (recovery), this wakes early or at ns, and the next poll sees it */
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull),
			       .tv_nsec = (long)(ns % 1000000000ull) };
	ppoll(&p, 1, &ts, NULL);
	return true;
}


void recv_accept_cb(evutil_socket_t lfd, short what, void *arg)
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
			status_log(n, "accept failed: %s", conn_strerror(-fd));
			return;
		}
		struct conn *c = rdv_conn_new(n, fd, true);
		struct link *l = c ? link_new(n, coord ? ROLE_COORD_IN : ROLE_LINK_IN, c, -1, peer) : NULL;
		if (!l) {
			status_log(n, "out of memory accepting %s", peer);
			continue;
		}
		link_set_state(l, LS_HANDSHAKE);
		l->deadline_ns = now_ns() + sec_ns(n->connect_timeout_s);
		event_add(l->ev_read, NULL);
		link_handshake(l);
		/* that may have brought up the last link and closed the listener */
		if (coord ? !n->ev_coord_l : n->data_lfd != lfd)
			return;
	}
}
