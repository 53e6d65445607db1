/* Sending: control frames built for each purpose, and the write path that
 * turns the link's queues (control frames first, then data fragments) into
 * connection writes. Fragments are encrypted straight from the send buffer;
 * small ones ride in their header's record. Calls only link.c and
 * status.c in net/. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net_int.h"

static const uint8_t zeros[64 * 1024];

int send_rr_post(struct link *l, const struct frame_rr *rr)
{
	if (l->rr_head == l->rr_n)
		l->rr_head = l->rr_n = 0;
	if (l->rr_n == l->rr_cap) {
		size_t cap = l->rr_cap ? 2 * l->rr_cap : 16;
		struct frame_rr *q = realloc(l->rr_q, cap * sizeof(*q));
		if (!q)
			return -ENOMEM;
		l->rr_q = q;
		l->rr_cap = cap;
	}
	l->rr_q[l->rr_n++] = *rr;
	atomic_store_explicit(&l->rr_pending, true, memory_order_relaxed);
	return 0;
}

void send_rr_flush(struct link *l)
{
	while (l->rr_head < l->rr_n) {
		const struct frame_rr *q = &l->rr_q[l->rr_head];
		Meshrun__Frame f = MESHRUN__FRAME__INIT;
		Meshrun__RecvReady rr = MESHRUN__RECV_READY__INIT;
		rr.src_device = q->src;
		rr.dst_device = q->dst;
		rr.tag = q->tag;
		rr.byte_count = q->bytes;
		f.body_case = MESHRUN__FRAME__BODY_RECV_READY;
		f.recv_ready = &rr;
		if (link_send(l, &f))
			break;         /* no memory: the tick tries again */
		l->rr_head++;
	}
	if (l->rr_head == l->rr_n)
		atomic_store_explicit(&l->rr_pending, false, memory_order_relaxed);
}

void send_refuse(struct link *l, const char *reason)
{
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Refuse r = MESHRUN__REFUSE__INIT;
	r.reason = (char *)reason;
	f.body_case = MESHRUN__FRAME__BODY_REFUSE;
	f.refuse = &r;
	link_send(l, &f);
}

void send_simple(struct link *l, int body)
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
	if (!link_send(l, &f) && body == MESHRUN__FRAME__BODY_DONE)
		l->done_seq = l->tx_seq;
}

void send_link_hello(struct link *l)
{
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__LinkHello h = MESHRUN__LINK_HELLO__INIT;
	h.host_id = (uint32_t)l->net->host_id;
	h.job_id = l->net->job_id;
	h.stream = (uint32_t)l->stream;
	f.body_case = MESHRUN__FRAME__BODY_LINK_HELLO;
	f.link_hello = &h;
	link_send(l, &f);
}

int send_resume_hello(struct link *l)
{
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__LinkHello h = MESHRUN__LINK_HELLO__INIT;
	h.host_id = (uint32_t)l->net->host_id;
	h.job_id = l->net->job_id;
	h.resume = true;
	h.last_seq = l->rx_seq;
	h.stream = (uint32_t)l->stream;
	f.body_case = MESHRUN__FRAME__BODY_LINK_HELLO;
	f.link_hello = &h;
	f.ack_seq = l->ack_sent = l->rx_seq;
	size_t len = frame_encoded_len(&f);
	struct ctrl_frame *c = calloc(1, sizeof(*c) + len);
	if (!c)
		return -ENOMEM;
	c->len = frame_encode(&f, 0, c->data);
	c->unseq = true;
	c->pay = NULL;
	c->pay_len = 0;
	c->req = NULL;
	free(l->hello_out);
	l->hello_out = c;
	link_arm_write(l);
	return 0;
}

/* Recovery: a sequenced frame being written is kept until acked. */
static void rp_keep(struct link *l, struct ctrl_frame *c)
{
	c->next = NULL;
	if (l->rp_tail)
		l->rp_tail->next = c;
	else
		l->rp_head = c;
	l->rp_tail = c;
	l->rp_bytes += c->len + c->pay_len;
}

static void tx_set(struct link *l, struct ctrl_frame *c, bool owned)
{
	l->tx_ctrl = owned ? c : NULL;
	l->tx_hdr = c->data;
	l->tx_hdr_len = c->len;
	l->tx_hdr_off = 0;
	/* a reference entry's payload: from the caller's buffer (zeros once
	 * its request was failed and let go) */
	l->tx_pay = c->pay;
	l->tx_pay_len = c->pay_len;
	l->tx_pay_off = 0;
	l->tx_pay_runs = c->pay ? c->pay_runs : NULL;
	l->tx_pay_at = c->pay_at;
	l->tx_active = true;
}

/* Recovery, a message of several fragments: the fragment's header is kept
 * and its payload by reference to the caller's buffer; the message
 * completes when the peer acknowledges its last fragment, which asks for
 * a prompt ack (FRAME_DATA_ACK). */
static bool tx_chunk_ref(struct link *l, struct send_msg *m, struct frame_data *f, uint64_t cnt)
{
	struct xreq *r = m->req;
	bool last = m->off + cnt == r->len;
	if (last)
		f->flags |= FRAME_DATA_ACK;
	size_t hl = frame_encode_data(f, cnt, l->tx_stage);
	struct ctrl_frame *c = malloc(sizeof(*c) + hl);
	if (!c) {
		link_fault_close(l, f->link_seq - 1);
		snprintf(l->fault_msg, sizeof(l->fault_msg), "out of memory for a replay entry");
		return false;
	}
	memcpy(c->data, l->tx_stage, hl);
	c->len = hl;
	c->pooled = c->heartbeat = c->unseq = false;
	c->seq = f->link_seq;
	size_t avail;
	c->pay = xreq_at(r, m->off, &avail);
	c->pay_len = cnt;
	c->pay_runs = r->runs ? r : NULL;
	c->pay_at = m->off;
	c->req = last ? r : NULL;
	rp_keep(l, c);
	tx_set(l, c, false);
	m->off += cnt;
	l->tx_msg = NULL;
	if (last) {
		/* the message is done here; its request waits in the entry */
		l->dq_head = m->next;
		if (!l->dq_head)
			l->dq_tail = NULL;
		free(m);
	}
	return true;
}

/* Recovery: the next data fragment is copied whole (header and payload)
 * into a replay copy and written from there (a payload of more than
 * SMALL_PAYLOAD in records of its own, as pay); its message completes when
 * its last fragment is copied, as the caller's buffer is then free. Only
 * messages of one fragment (eager sends among them) are copied: they
 * complete inside the call that writes them; longer ones are kept by
 * reference (tx_chunk_ref). false if a fault closed the link. */
static bool tx_chunk_keep(struct link *l, struct send_msg *m, struct frame_data *f,
			  uint64_t cnt)
{
	struct xreq *r = m->req;
	if (r->len > LINK_FRAG_MAX)
		return tx_chunk_ref(l, m, f, cnt);
	size_t hl = frame_encode_data(f, cnt, l->tx_stage);
	struct ctrl_frame *c;
	bool pooled = hl + cnt <= RP_BLOCK && cnt > SMALL_PAYLOAD;
	if (pooled && l->rp_pool) {
		c = l->rp_pool;
		l->rp_pool = c->next;
		l->rp_pool_n--;
	} else {
		c = malloc(sizeof(*c) + (pooled ? RP_BLOCK : hl + cnt));
	}
	if (!c) {
		/* as if the link failed: recovery cannot keep this frame */
		link_fault_close(l, f->link_seq - 1);
		snprintf(l->fault_msg, sizeof(l->fault_msg), "out of memory for a replay copy");
		return false;
	}
	memcpy(c->data, l->tx_stage, hl);
	if (cnt)
		xreq_copy_out(r, m->off, c->data + hl, cnt);
	c->pooled = pooled;
	c->heartbeat = c->unseq = false;
	c->seq = f->link_seq;
	/* a payload of more than a small one goes in records of its own
	 * behind the header's (pay points into the copy, as the uncopied
	 * path writes it): in the header's record, the rest of that record
	 * would reach the peer's posted buffer through its record scratch,
	 * a copy of up to 16 KiB per message */
	bool apart = cnt > SMALL_PAYLOAD;
	c->len = apart ? hl : hl + cnt;
	c->pay = apart ? c->data + hl : NULL;
	c->pay_len = apart ? cnt : 0;
	c->pay_runs = NULL;
	c->req = NULL;
	rp_keep(l, c);
	tx_set(l, c, false);
	m->off += cnt;
	l->tx_msg = NULL;
	if (m->off == r->len) {
		l->dq_head = m->next;
		if (!l->dq_head)
			l->dq_tail = NULL;
		xport_complete(r, 0);
		free(m);
	}
	return true;
}


/* A message over runs: the next write of the frame's payload (*len
 * bytes left in it, cut to what is written). A run holding a record
 * (16 KiB) or the rest of the frame is written where it lies, to its
 * end; shorter ones are gathered a record's worth at a time (a record a
 * row of 128 floats cost the cipher, and the peer, three times the
 * packed message's work). On a retry the same bytes are gathered again
 * (the TLS conn accepts a moved buffer of the same content). */
static const uint8_t *runs_src(struct link *l, size_t *len)
{
	static _Thread_local uint8_t gather[16 * 1024];
	size_t avail, at = (size_t)(l->tx_pay_at + l->tx_pay_off);
	const uint8_t *src = xreq_at(l->tx_pay_runs, at, &avail);
	if (avail >= *len)
		return src;
	if (avail >= sizeof(gather)) {
		*len = avail;
		return src;
	}
	if (*len > sizeof(gather))
		*len = sizeof(gather);
	xreq_copy_out(l->tx_pay_runs, at, gather, *len);
	return gather;
}

static void tx_frame_done(struct link *l);

/* Picks the next frame to write: control frames first, then the next
 * fragment of the first queued message. false if there is nothing. A
 * data frame whose fault says drop is taken (and kept for replay) but not
 * written: the next frame is picked instead. */
static bool tx_next(struct link *l)
{
	struct net *n = l->net;
	bool keep = n->replay_cap > 0;
	struct ctrl_frame *c = l->hello_out;
	l->tx_push = 0;
	if (c) {
		l->hello_out = NULL;
		tx_set(l, c, true);
		return true;
	}
	/* resuming: nothing else goes out before the hellos agree */
	if (keep && l->was_up && l->state == LS_HELLO)
		return false;
	if ((c = l->rp_next)) {
		l->rp_next = c->next;
		tx_set(l, c, false);
		atomic_fetch_add_explicit(&n->frames_resent, 1, memory_order_relaxed);
		return true;
	}
	c = l->cq_head;
	if (c && keep && !c->unseq) {
		l->cq_head = c->next;
		if (!l->cq_head)
			l->cq_tail = NULL;
		if (c->heartbeat)
			l->hb_queued--;
		rp_keep(l, c);
		tx_set(l, c, false);
		return true;
	}
	if (c) {
		l->cq_head = c->next;
		if (!l->cq_head)
			l->cq_tail = NULL;
		tx_set(l, c, true);
		return true;
	}
	struct send_msg *m = l->dq_head;
	if (!m || l->state != LS_UP)
		return false;
	struct xreq *r = m->req;
	uint64_t left = r->len - m->off;
	/* a pipeline's activation or gradient: pushed in pieces (net.h) */
	if (r->meta.op == MESHRUN__COLL_OP__COLL_P2P)
		l->tx_push = NET_P2P_PUSH_BYTES;
	uint64_t cnt = left < FRAG_MAX ? left : FRAG_MAX;
	if (cnt > l->net->lim.max_payload)
		cnt = l->net->lim.max_payload;
	/* recovery: room for its replay copy, or wait for acks */
	if (keep && l->rp_head && l->rp_bytes + cnt + 1024 > n->replay_cap)
		return false;

	struct frame_data f = {
		.tag = r->tag, .msg_bytes = r->len, .msg_offset = m->off, .step = r->meta.step,
		.src = (uint32_t)r->src, .dst = (uint32_t)r->dst, .op = r->meta.op,
		.flags = r->eager ? FRAME_DATA_EAGER : 0,
	};
	if (l->rr_head < l->rr_n) {
		/* a posted receive's RecvReady rides along */
		f.rr = l->rr_q[l->rr_head++];
		f.flags |= FRAME_DATA_RR;
		if (l->rr_head == l->rr_n)
			atomic_store_explicit(&l->rr_pending, false, memory_order_relaxed);
	}
	f.link_seq = ++l->tx_seq;
	f.ack_seq = l->ack_sent = link_rx_done(l);
	l->rx_unacked_bytes = 0;
	enum link_fault fa = link_fault_data(l, true, &f, cnt);
	if (fa == LINK_FAULT_CLOSE) {
		link_fault_close(l, f.link_seq - 1);
		return false;
	}
	if (keep) {
		if (!tx_chunk_keep(l, m, &f, cnt))
			return false;
		if (fa != LINK_FAULT_DROP)
			return true;
		tx_frame_done(l);
		return tx_next(l);
	}
	size_t hl = frame_encode_data(&f, cnt, l->tx_stage);
	l->tx_hdr = l->tx_stage;
	l->tx_hdr_off = 0;
	if (cnt <= SMALL_PAYLOAD) {
		/* one record for header and payload */
		if (cnt)
			xreq_copy_out(r, m->off, l->tx_stage + hl, cnt);
		l->tx_hdr_len = hl + cnt;
		l->tx_pay = NULL;
		l->tx_pay_len = 0;
	} else {
		size_t avail;
		l->tx_hdr_len = hl;
		l->tx_pay = xreq_at(r, m->off, &avail);
		l->tx_pay_len = cnt;
		l->tx_pay_runs = r->runs ? r : NULL;
		l->tx_pay_at = m->off;
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
	if (fa == LINK_FAULT_DROP) {
		tx_frame_done(l);
		return tx_next(l);
	}
	return true;
}

/* The frame's last byte went to the connection. Without recovery, a data
 * message whose last fragment this was completes now, when its bytes
 * leave, not when the peer has them: nothing is kept to send again. With
 * recovery the frame is a replay copy (tx_ctrl NULL) and its message
 * completed when it was copied. */
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



/* Nothing is left to write: flush, and in CLOSING finish our side. 0 to
 * stop writing for now, -EPIPE if writing failed. */
static int tx_idle(struct link *l)
{
	struct net *n = l->net;
	int frc = conn_flush(l->c);
	if (frc == -EAGAIN) {
		link_arm_write(l);
		return 0;
	}
	if (frc < 0)
		return -EPIPE;
	if (l->state == LS_CLOSING) {
		int rc = conn_shutdown(l->c);
		if (rc == -EAGAIN) {
			if (l->c->want == CONN_WANT_READ)
				l->wr_wants_read = true;
			return 0;
		}
		link_disarm_write(l);
		/* after a failure nobody waits for the peer's goodbye */
		if (status_failed(n) || n->stopping)
			link_kill(l);
		else
			link_set_state(l, LS_DRAIN);
		return 0;
	}
	link_disarm_write(l);
	return 0;
}

int send_write(struct link *l)
{
	struct net *n = l->net;
	size_t budget = n->max_send;

	while (budget) {
		if (l->state == LS_DEAD || l->state == LS_DRAIN || l->fault_close || l->conn_dead)
			return 0;
		if (l->held) {
			/* an injected delay or black hole: ev_hold re-arms us */
			link_disarm_write(l);
			return 0;
		}
		if (!l->tx_active) {
			if (!tx_next(l))
				return l->fault_close ? 0 : tx_idle(l);
			/* a delay, black hole or half-open fault at this frame
			 * holds it (the check above) */
			if (l->held)
				continue;
		}
		const uint8_t *src;
		size_t len;
		bool hdr = l->tx_hdr_off < l->tx_hdr_len;
		if (hdr) {
			src = l->tx_hdr + l->tx_hdr_off;
			len = l->tx_hdr_len - l->tx_hdr_off;
		} else if (l->tx_pay_off < l->tx_pay_len) {
			len = (size_t)(l->tx_pay_len - l->tx_pay_off);
			if (l->tx_pay && l->tx_pay_runs) {
				src = runs_src(l, &len);
			} else if (l->tx_pay) {
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
		/* more follows this write at once: the rest of this frame, or
		 * another frame (a full record, 16 KiB, per write) */
		l->c->more = len > 16384 || (hdr && l->tx_pay_len > 0) ||
			     (!hdr && l->tx_pay_len - l->tx_pay_off > len) || l->cq_head ||
			     l->dq_head || l->rp_next || l->hello_out;
		l->c->push = l->tx_push;
		ssize_t w = conn_write(l->c, src, len);
		if (w == -EAGAIN) {
			conn_flush(l->c);
			if (l->c->want == CONN_WANT_READ) {
				l->wr_wants_read = true;
				link_disarm_write(l);
			} else {
				link_arm_write(l);
			}
			return 0;
		}
		if (w < 0)
			return -EPIPE;
		if (hdr)
			l->tx_hdr_off += (size_t)w;
		else
			l->tx_pay_off += (uint64_t)w;
		atomic_fetch_add_explicit(&n->bytes_sent, (uint64_t)w, memory_order_relaxed);
		budget = (size_t)w >= budget ? 0 : budget - (size_t)w;
	}
	/* budget spent: the write event stays armed and the loop comes back */
	int frc = conn_flush(l->c);
	if (frc < 0 && frc != -EAGAIN)
		return -EPIPE;
	link_arm_write(l);
	return 0;
}
