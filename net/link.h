/* A link: one connection between this host and another as the net thread
 * drives it (rendezvous connections and data links alike). Its state, its
 * send queues and receive progress, its teardown, and what a broken link
 * means for the job. Private to net/.
 *
 * Threads. Every field below is under the link lock (link_lock; l->mu,
 * recursive). The net thread takes it for anything it does to a link. A
 * data link that is UP is also worked by other threads, each holding the
 * lock: device threads write their sends and RecvReadys on it directly
 * and, waiting for a receive, poll it (read, decrypt into the posted
 * buffer); its stream thread (net/stream.c) reads what nobody polls and
 * writes what the socket would not take at once. Those threads move only
 * data and the frames that ride with it (chunks, RecvReady, Ack,
 * Heartbeat); anything else they meet (another control frame, a failed
 * read or write, a bad frame, a fault that closes) they leave in the
 * link's defer_* fields and hand to the net thread (ev_defer), which does
 * it under the lock; meanwhile nobody reads (rx_blocked) or writes
 * (conn_dead) past it. Only the net thread changes a link's state, and
 * only it takes a second link's lock while holding one. */
#ifndef MESHRUN_LINK_H
#define MESHRUN_LINK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "net/conn.h"
#include "net/frame.h"
#include "net/net.h"
#include "net/xport.h"

struct net;

/* What the connection is for. */
enum link_role {
	ROLE_COORD_IN,      /* coordinator: an agent's rendezvous connection */
	ROLE_COORD_OUT,     /* agent: our connection to the coordinator */
	ROLE_LINK_IN,       /* data link a lower host id dialed */
	ROLE_LINK_OUT,      /* data link we dialed (to a higher host id) */
};

/* A link's life. State changes only in link_set_state(), and only along
 * these edges (its table in net/link.c):
 *
 *   NEW --------> CONNECTING     we dial (the socket connects)
 *   NEW --------> HANDSHAKE      we accepted
 *   CONNECTING -> HANDSHAKE      the socket connected
 *   HANDSHAKE --> HELLO          TLS is up; hellos go both ways
 *   HELLO ------> UP             a data link's hellos agree
 *   HELLO, UP --> CLOSING        we start an orderly close (close_notify)
 *   CLOSING ----> DRAIN          our side is shut; read the peer's goodbye
 *   any but DEAD -> DEAD         link_kill: freed by the reap event
 *
 * With recovery on (net_params.replay_buffer_bytes), a data link that was
 * UP and whose connection fails keeps its queues, sequence numbers and
 * replay copies and gets a new connection:
 *
 *   UP ----------> BROKEN        the connection failed (EOF, reset, TLS)
 *   BROKEN ------> RECONNECTING  the lower host id redials (backoff)
 *   RECONNECTING > HANDSHAKE     the socket connected
 *   BROKEN ------> HELLO         the higher id accepted the peer's redial
 *                                (handshake done on a connection of its own)
 *   RECONNECTING, HANDSHAKE, HELLO -> BROKEN   that attempt failed
 *   HELLO ------> UP             resume hellos agree; the frames after the
 *                                peer's last_seq are resent first
 *   BROKEN -----> CLOSING        the job ends while it is down
 *
 * A rendezvous connection never reaches UP: it closes after the hello and
 * the topology. Anything else is a programmer error (assert). */
enum link_state {
	LS_NEW,
	LS_CONNECTING,
	LS_HANDSHAKE,
	LS_HELLO,
	LS_UP,
	LS_CLOSING,
	LS_DRAIN,
	LS_DEAD,
	LS_BROKEN,
	LS_RECONNECTING,
	LS_COUNT
};

enum rxstage { RX_PREFIX, RX_HEADER, RX_PAYLOAD };

/* link_probe: the first probe of a broken link's peer, after the break,
 * and the next ones */
#define LINK_PROBE_AFTER_NS (250ull * 1000 * 1000)
#define LINK_PROBE_EVERY_NS (1000ull * 1000 * 1000)

/* A pooled replay copy's data: a data frame's header and largest payload
 * (LINK_FRAG_MAX); the pool keeps up to 16 MiB of them for reuse, so the
 * copies of a stream stop costing page faults. Only messages of one
 * fragment are copied (they complete at once); longer ones are kept by
 * reference (struct ctrl_frame.pay). */
#define LINK_FRAG_MAX (1u << 16)
#define RP_BLOCK (64 + 1024 + LINK_FRAG_MAX)
#define RP_POOL_MAX ((int)((16u << 20) / LINK_FRAG_MAX))

/* A control frame encoded and queued. */
struct ctrl_frame {
	struct ctrl_frame *next;
	size_t len;
	bool heartbeat;
	bool unseq;            /* Ack or resume hello: link_seq 0, never kept */
	bool pooled;           /* a data frame's replay copy of RP_BLOCK bytes */
	uint64_t seq;          /* its link_seq */
	/* A replay entry kept by reference: data holds the header only, and
	 * the payload is pay_len bytes of the caller's send buffer, which
	 * stays the caller's until the send completes. The entry of a
	 * message's last fragment holds its request (req), completed when
	 * the peer acknowledges that frame (acks are cumulative) or failed
	 * by link_release_reqs; after either, pay and req are NULL and the
	 * buffer is never touched again. A data frame's replay copy of a
	 * payload larger than SMALL_PAYLOAD has pay point into its own data,
	 * behind the header, so the payload goes in records of its own. */
	const uint8_t *pay;
	uint64_t pay_len;
	/* a message over runs (struct xrun): pay is where its byte pay_at
	 * lies, and the payload is read from pay_runs' runs */
	const struct xreq *pay_runs;
	uint64_t pay_at;
	struct xreq *req;
	uint8_t data[];
};

/* A data message (a send the peer asked for, or an eager one) queued. */
struct send_msg {
	struct send_msg *next;
	struct xreq *req;      /* NULL once completed */
	uint64_t off;          /* next fragment */
};

/* What the net thread must do for a link another thread worked on. */
enum link_defer {
	DEFER_NONE,
	DEFER_CONN,            /* the connection failed: link_conn_failed */
	DEFER_BAD,             /* the peer sent a bad frame: link_bad_frame */
	DEFER_LOST,            /* link_lost */
};

struct link {
	struct net *net;
	struct link *next;             /* n->links list */
	pthread_mutex_t mu;            /* the link lock (see the top of this file) */
	int depth;                     /* the holder's recursion depth */
	_Atomic int kick;              /* the stream thread found mu taken */
	_Atomic int lockers;           /* threads blocked in link_lock */
	bool pinned;                   /* device threads hold it: freed by net_free only */
	bool off_main;                 /* the lock holder is not the net thread */
	/* its stream thread, while the link is UP (net/stream.c) */
	int stream;
	bool watched;                  /* its socket is in the stream thread's set */
	/* on its stream thread's list of links owed another turn (only
	 * that thread touches these) */
	bool again_queued;
	struct link *again_next;
	uint32_t armed;                /* the events armed there (0: quiet) */
	bool want_write;               /* output the socket would not take waits */
	int pollers;                   /* device threads polling it now */
	/* the last poller's request completed: it will likely poll again at
	 * once, so the stream thread stays quiet until linger_ns (it looks
	 * every LINGER_LOOK_MS meanwhile, recv_stream_tick) */
	bool lingering;
	uint64_t linger_ns;
	/* RecvReadys posted but not yet framed: the next data frame to the
	 * peer carries one, and the poster's next wait sends the rest alone
	 * (send_rr_flush) */
	struct frame_rr *rr_q;
	size_t rr_head, rr_n, rr_cap;
	_Atomic bool rr_pending;
	/* handed to the net thread (ev_defer) */
	struct event *ev_defer;
	Meshrun__Frame *defer_frame;   /* a control frame to dispatch */
	enum link_defer defer;
	int defer_rc;
	char defer_why[256];
	bool defer_finish;             /* link_check_finish: an ack covered our Done */
	bool rx_blocked;               /* nobody reads until the net thread has been */
	bool conn_dead;                /* nobody writes: the connection failed */
	enum link_role role;
	enum link_state state;         /* only link_set_state() writes it */
	int peer;                      /* host id, -1 until known */
	char addr[128];
	struct conn *c;
	struct event *ev_read, *ev_write;
	struct event *ev_resume;       /* zero timeout: read on after the next poll */
	bool write_armed, rd_wants_write, wr_wants_read;
	bool refused;                  /* a refusal was logged already */
	uint64_t deadline_ns;          /* handshake/hello or close deadline */
	uint64_t last_rx_ns, last_hb_ns;
	/* link_seq of the last frame sent and received complete; ack_sent is
	 * the highest ack_seq we sent, acked the highest the peer sent. */
	uint64_t tx_seq, rx_seq;
	uint64_t ack_sent, acked, rx_unacked_bytes;

	/* recovery (net->replay_cap > 0): every sequenced frame written is kept
	 * here, whole, until the peer acknowledges it; rp_next is the next
	 * one to send again after a reconnect */
	struct ctrl_frame *rp_head, *rp_tail, *rp_next;
	struct ctrl_frame *rp_pool;    /* acked data copies, reused (no page faults) */
	int rp_pool_n;                 /* at most RP_POOL_MAX */
	uint64_t rp_bytes;
	bool was_up;                   /* reached UP once: a break is recoverable */
	uint64_t done_seq;             /* our Done's link_seq (0: not sent) */
	struct ctrl_frame *hello_out;  /* resume hello: goes before anything */
	uint64_t broken_at_ns, retry_at_ns, retry_delay_ns;
	char broken_why[200];          /* what broke it (for the final failure) */
	/* the higher id of a broken link probes the peer's listener (link_probe) */
	int probe_fd;                  /* a connect in flight, or -1 */
	uint64_t probe_at_ns;          /* the next probe starts; the one in flight ends */
	/* a frame whose payload was half read when the link broke: when it
	 * comes again, its first rx_skip bytes are skipped (they landed) */
	uint64_t rx_part_seq, rx_part_got, rx_skip;
	bool rx_in_frame;              /* frame rx_seq's payload is still coming */
	bool rx_dup;                   /* the payload coming is a frame we have */
	bool rx_ack_now;               /* the frame coming asked for a prompt ack */
	/* a sent frame's fault said close: the link fails from its own event
	 * callback (as on a read error), and writes nothing more before that */
	bool fault_close;
	char fault_msg[96];
	uint64_t fault_data_frame;     /* a fault spec's close: its data frame */
	/* an injected delay or black hole: nothing is written (nor read, if
	 * hold_reads) until ev_hold fires */
	struct event *ev_hold;
	bool held, hold_reads;
	/* an injected half-open connection: held (and hold_reads, both ways)
	 * with no timer, until the connection is replaced (link_break) */
	bool halfopen;

	/* receive */
	enum rxstage rx_stage;
	uint8_t rx_prefix[FRAME_PREFIX_LEN];
	struct frame_prefix rx_p;
	size_t rx_got;
	uint8_t *rx_hdr;
	size_t rx_hdr_cap;
	uint8_t *rx_dst;               /* payload destination, NULL: discard */
	uint64_t rx_at;                /* its byte in the message (over runs) */
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
	/* a message over runs: the payload is tx_pay_runs' bytes from
	 * tx_pay_at on, written a run at a time (the conn coalesces them) */
	const struct xreq *tx_pay_runs;
	uint64_t tx_pay_at;
	struct ctrl_frame *tx_ctrl;
	struct send_msg *tx_msg;
	bool tx_msg_last;
	size_t tx_push;                /* conn.push for the frame: NET_P2P_PUSH_BYTES or 0 */
	uint8_t *tx_stage;             /* header (+ small payload) of a data frame */
};

/* The highest link_seq received complete (what ack_seq says). */
static inline uint64_t link_rx_done(const struct link *l)
{
	return l->rx_seq - (l->rx_in_frame ? 1 : 0);
}

/* ---- the link lock ---- */

void link_lock(struct link *l);
/* false if another thread holds it, or a thread waits for it in
 * link_lock: a polling thread that takes the lock again and again would
 * otherwise keep the net thread (heartbeats) from it for as long as
 * bytes trickle in (the mutex is not fair). */
bool link_trylock(struct link *l);
/* Unlocks; and if the stream thread found the lock taken meanwhile
 * (l->kick), arms its watch again so what it came for is not lost. The
 * stream thread yields once before it kicks (recv_stream_cb): that
 * arming fires at once while bytes wait, and on the holder's own core the
 * wake-up preempts the holder with the lock held, so kick after kick
 * would keep the two threads trading the core without reading a byte. */
void link_unlock(struct link *l);
/* Arms the stream thread's watch as the link's state asks: reading unless
 * a device thread polls it, reading is blocked or held; writing while
 * output waits. Under the lock; nothing for a link that is not UP. */
void link_watch(struct link *l);
/* For threads other than the net thread, under the lock: record what the
 * net thread must do (the first failure wins), stop reading and, for a
 * failure, writing, and wake the net thread. Takes f (a control frame
 * to dispatch), if any. */
void link_defer(struct link *l, enum link_defer what, int rc, const char *why,
		Meshrun__Frame *f);

/* ---- creation, state, teardown ---- */

/* A link on connection c (taken, even on failure), in state NEW, with its
 * events set up (not armed) and on n's list. NULL on allocation failure. */
struct link *link_new(struct net *n, enum link_role role, struct conn *c, int peer,
		      const char *addr);
/* The one place a link's state changes. An edge not in the table above is
 * a programmer error: assert, with both states named. */
void link_set_state(struct link *l, enum link_state to);
void link_arm_write(struct link *l);
void link_disarm_write(struct link *l);
/* Lets go of every request the link holds: each completes with rc. After
 * this the link never touches a user buffer again. */
void link_release_reqs(struct link *l, int rc);
/* Marks l dead (idempotent): events off, requests released, unhooked from
 * the peer table; the reap event frees it. Never frees inside a callback. */
void link_kill(struct link *l);
/* Recovery: detaches l's connection (closed) and puts an UP or
 * reconnecting link into BROKEN with its queues and replay copies kept.
 * false if l cannot recover (recovery off, never up, job ending): the
 * caller fails it as before. */
bool link_break(struct link *l, const char *reason);
/* The higher id of a broken link waits for the peer's redial; a peer
 * whose process is gone never redials. From the tick: while l is BROKEN
 * and accepted (ROLE_LINK_IN), a TCP connect to the peer's own recorded
 * listen address (its Topology address), once the first redial has had
 * LINK_PROBE_AFTER_NS to come and then every LINK_PROBE_EVERY_NS; a
 * refused connect (ECONNREFUSED: nothing listens) loses the peer at once
 * (link_lost, -EHOSTDOWN) instead of at the heartbeat timeout. A connect
 * that is accepted or unanswered says nothing (a live peer logs a
 * "refused link" line for it: it closed before its handshake). false when
 * l failed. */
bool link_probe(struct link *l, uint64_t now);
/* A broken link's next connection c (taken): new events, armed to read. */
int link_attach_conn(struct link *l, struct conn *c);
/* The peer's ack_seq: frees replay copies up to it. */
void link_acked(struct link *l, uint64_t ack);
/* On resuming: the peer has every frame up to last_seq; resend the rest. */
void link_replay_from(struct link *l, uint64_t last_seq);
/* Queues an Ack (unsequenced) if frames arrived since our last ack_seq. */
void link_send_ack(struct link *l);
/* Frees a link that is off n's list. */
void link_free(struct link *l);
/* The reap event: frees dead links; reports closed/stops the loop when
 * none are left. */
void link_reap_cb(evutil_socket_t fd, short what, void *arg);

/* ---- queueing ---- */

/* Queues a control frame, filling its sequence numbers; it passes the
 * fault point here. 0, -EPIPE (link dead or draining), -ENOMEM or
 * -EMSGSIZE. A fault that closes the link drops the frame and returns 0:
 * the link fails from its event callback. */
int link_send(struct link *l, Meshrun__Frame *f);
/* Queues a data message for req (the link completes it). 0 or -ENOMEM
 * (req untouched). */
int link_queue_msg(struct link *l, struct xreq *req);

/* ---- the fault point ---- */

/* Every frame passes here once, sent (f's header encoded, link_seq set)
 * or received (header decoded and its sequence number checked), and the
 * link honours the action returned: net_params.fault, or PASS. Not the
 * unsequenced ones (Ack, resume LinkHello); a frame resent after a
 * reconnect, or received again, does not pass a second time. Then the
 * data frames this host sends meet its fault specs (net/fault.h): close
 * is returned like the callback's; delay and blackhole hold the link
 * here (link_hold) and corrupt arms the connection, and PASS is returned:
 * the frame goes out as usual when the hold ends. Each one is logged.
 * A CLOSE returned here is never recovered: the link fails the job (a
 * close spec with recovery on is a reset instead: the link redials). */
enum link_fault link_fault(struct link *l, bool outgoing, const Meshrun__Frame *f);
/* link_fault for a data frame: it passes as its protobuf view (body chunk,
 * frame_data_view), built only when a callback or spec may look. */
enum link_fault link_fault_data(struct link *l, bool outgoing, const struct frame_data *d,
				uint64_t payload_len);
/* For a sent frame whose fault said close: flags the link (fault_close)
 * and wakes its event callback, which fails it. */
void link_fault_close(struct link *l, uint64_t frame_index);

/* Writes nothing for ns (and reads nothing, if reads) on l; the socket
 * stays open. A hold already running is extended. */
void link_hold(struct link *l, uint64_t ns, bool reads);
/* An injected half-open connection: l writes nothing more on its socket
 * (and reads nothing, if both) until the connection is replaced. */
void link_halfopen(struct link *l, bool both);

/* ---- ending: closing, failure ---- */

/* Starts an orderly close (CLOSING) with a deadline; a link that is not
 * talking frames yet is killed instead. */
void link_begin_close(struct link *l, uint64_t deadline);
/* A link broke (EOF, I/O error, bad frame, silence). Whether that fails
 * the job depends on what the link was for. */
void link_lost(struct link *l, int rc, const char *reason);
/* The connection failed (EOF, reset, TLS error): a recoverable data link
 * goes BROKEN and is redialed; anything else is link_lost. */
void link_conn_failed(struct link *l, int rc, const char *reason);
/* The peer sent something it must not: the link is lost with "bad frame". */
void link_bad_frame(struct link *l, const char *reason);
/* Fails the net (first failure wins): records status and msg, fails the
 * xport with rc, sends Abort on every running link and closes them all. */
void link_fail_all(struct net *n, int status, int rc, const char *msg);
/* In the finish phase, once every peer's Done is in: closes every link. */
void link_check_finish(struct net *n);

#endif
