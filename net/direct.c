/* The xport hooks (net/xport.h) as device threads call them: a send is
 * encrypted and written by the thread that issues it, under its link's
 * lock, when the link is UP; a posted receive's RecvReady likewise; and a
 * thread that waits on a remote request polls that request's link (reads,
 * decrypts into posted buffers, writes what is queued) before it sleeps.
 * Whatever the socket will not take at once is left queued, for the next
 * thread that holds the lock or the link's stream thread (net/link.h).
 * A point-to-point send above p2p_handoff_bytes is only queued: the
 * stream thread seals and writes it while the device thread goes on
 * (its buffer stays the caller's until the send completes, as always).
 * Calls recv.c, send.c, link.c and status.c in net/. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "net/net_int.h"

/* bytes a polling thread reads per turn before it looks at its request */
#define POLL_BUDGET (256u * 1024)

/* The stream (of link_streams) that carries the messages of tag, and
 * their RecvReadys, acks and the polls of their waiters: a collective's
 * segments (chunk indices) go round the streams. */
static int stream_of(const struct net *n, uint64_t tag)
{
	return n->nstreams > 1 ? (int)(((tag >> 16) + (tag & 0xffff)) % (uint64_t)n->nstreams) : 0;
}

/* Host h's data link for tag as device threads see it (pinned), or NULL. */
static struct link *dlink(struct net *n, int h, uint64_t tag)
{
	if (h < 0 || h >= n->num_hosts || h == n->host_id)
		return NULL;
	return atomic_load_explicit(&n->peers[h].dl[stream_of(n, tag)], memory_order_acquire);
}

/* The link takes data frames: up, or recovering (they queue meanwhile). */
static bool takes_data(const struct link *l)
{
	return l->was_up && l->state != LS_CLOSING && l->state != LS_DRAIN &&
	       l->state != LS_DEAD;
}

static void note_op(struct net *n, const struct xreq *r)
{
	if (r->meta.op) {
		atomic_store_explicit(&n->last_step, r->meta.step, memory_order_relaxed);
		atomic_store_explicit(&n->last_op, r->meta.op, memory_order_relaxed);
	}
}

/* Writes what l has queued now, from this thread, if it may. */
static void write_now(struct link *l)
{
	if (l->state == LS_UP && !l->held && !l->conn_dead && !l->fault_close)
		recv_write(l);
}

/* The RecvReady waits to ride on the next data frame to that host (a
 * device that posts a receive usually sends to the same peer next); the
 * poster's next flush (its wait, xport_test, xport_flush) sends it
 * alone if no data frame is queued to take it (op_flush). */
static void op_recv_posted(void *ctx, struct xreq *r)
{
	struct net *n = ctx;
	note_op(n, r);
	struct link *l = dlink(n, xport_host_of(n->x, r->src), r->tag);
	if (!l)
		return;        /* failed, or a test's net without links */
	link_lock(l);
	struct frame_rr rr = { .src = (uint32_t)r->src, .dst = (uint32_t)r->dst, .tag = r->tag,
			       .bytes = r->len };
	if (!status_failed(n) && takes_data(l) && send_rr_post(l, &rr))
		link_lost(l, -ENOMEM, "out of memory queueing a frame");
	link_unlock(l);
}

/* Sends the queued RecvReadys, each link's from this thread, except on a
 * link with a message queued and not yet begun: its first header
 * (written by whichever thread writes it, the stream thread for a
 * handed-off send) carries one, and writing here would seal that data
 * on this thread (a RecvReady posted just before a handed-off send to
 * its host). */
static void flush_rr(struct net *n, bool later)
{
	for (int h = 0; h < n->num_hosts; h++) {
		for (int k = 0; k < n->nstreams && h != n->host_id; k++) {
			struct link *l = atomic_load_explicit(&n->peers[h].dl[k], memory_order_acquire);
			if (!l || !atomic_load_explicit(&l->rr_pending, memory_order_relaxed))
				continue;
			link_lock(l);
			if (!(l->dq_head && !l->dq_head->off && l->state == LS_UP && !l->held)) {
				send_rr_flush(l);
				if (later)
					link_arm_write(l);   /* link_unlock arms the stream thread */
				else
					write_now(l);
			}
			link_unlock(l);
		}
	}
}

static void op_flush(void *ctx)
{
	flush_rr(ctx, false);
}

/* op_flush, the writing left to the link's stream thread (a device
 * thread about to compute: no socket write and no wake-up of the peer
 * from it). */
static void op_flush_later(void *ctx)
{
	flush_rr(ctx, true);
}

static void op_send_ready(void *ctx, struct xreq *r)
{
	struct net *n = ctx;
	note_op(n, r);
	struct link *l = dlink(n, xport_host_of(n->x, r->dst), r->tag);
	if (!l) {
		xport_complete(r, status_failed(n) ? -ECANCELED : -EPIPE);
		return;
	}
	link_lock(l);
	int fs = status_failed(n);
	if (fs || !takes_data(l) || link_queue_msg(l, r)) {
		link_unlock(l);
		xport_complete(r, fs ? -ECANCELED : -EPIPE);
		return;
	}
	if (n->p2p_handoff && r->len > n->p2p_handoff && r->meta.op == MESHRUN__COLL_OP__COLL_P2P &&
	    l->state == LS_UP) {
		link_arm_write(l);      /* link_unlock arms the stream thread */
		atomic_fetch_add_explicit(&n->handoffs, 1, memory_order_relaxed);
	} else {
		if (r->len >= XPORT_IDLE_MIN_BYTES)
			recv_before_send(l);
		write_now(l);
	}
	link_unlock(l);
}

static bool op_poll(void *ctx, struct xreq *r, bool first)
{
	struct net *n = ctx;
	int peer = r->kind == XREQ_SEND ? r->dst : r->src;
	struct link *l = dlink(n, xport_host_of(n->x, peer), r->tag);
	if (!l)
		return false;
	if (first) {
		/* while it polls, its stream thread leaves the link alone */
		link_lock(l);
		l->pollers++;
		if (l->lingering) {
			l->lingering = false;
			atomic_fetch_sub(&n->lingering, 1);
		}
		r->net_ctx = (uintptr_t)l;
	} else if (!link_trylock(l)) {
		return false;     /* another thread is working on it */
	}
	bool moved = recv_poll(l, POLL_BUDGET, r->len >= XPORT_IDLE_MIN_BYTES);
	link_unlock(l);
	return moved;
}

static void op_poll_end(void *ctx, struct xreq *r, bool done)
{
	struct net *n = ctx;
	struct link *l = (struct link *)r->net_ctx;
	if (!l)
		return;
	r->net_ctx = 0;
	link_lock(l);
	if (--l->pollers == 0 && done && l->state == LS_UP) {
		/* it will likely wait again at once: what came meanwhile is
		 * read now, and the stream thread is not armed just to be
		 * quieted again by the next poll (it lingers) */
		recv_poll(l, POLL_BUDGET, false);
		l->linger_ns = now_ns() + LINGER_NS;
		if (!l->lingering) {
			l->lingering = true;
			atomic_fetch_add(&n->lingering, 1);
			stream_linger(l);
		}
	}
	/* else link_unlock arms the stream thread again */
	link_unlock(l);
}

static bool op_idle(void *ctx, struct xreq *r, uint64_t ns)
{
	(void)ctx;
	struct link *l = (struct link *)r->net_ctx;   /* set by the first op_poll */
	return l && recv_idle(l, ns);
}

static const struct xport_remote_ops ops = {
	.recv_posted = op_recv_posted,
	.send_ready = op_send_ready,
	.poll = op_poll,
	.poll_end = op_poll_end,
	.flush = op_flush,
	.idle = op_idle,
	.flush_later = op_flush_later,
};

const struct xport_remote_ops *net_xport_ops(void)
{
	return &ops;
}
