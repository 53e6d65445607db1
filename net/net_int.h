/* What the files of the net thread share (private to net/): struct net,
 * the per-peer table, tunables, and each file's entry points. Layering,
 * each file calling only those below it:
 *   net.c        lifecycle, commands from other threads, tick
 *   direct.c     the xport hooks: device threads send, post and poll directly
 *   recv.c       link events: handshake, reading, dispatching frames
 *   rendezvous.c rendezvous (both sides), dialing, link set-up, barrier
 *   send.c       control frames, the write path
 *   link.c       links: state, the lock, queues, teardown, failure, the
 *                fault point
 *   stream.c     stream threads: epoll on UP data links (a callback up)
 *   status.c     what the control thread sees; log lines */
#ifndef MESHRUN_NET_INT_H
#define MESHRUN_NET_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>

#include "net/fault.h"
#include "net/link.h"
#include "net/net.h"
#include "net/tls_conn.h"
#include "net/wire_check.h"

#define TICK_MS        50
/* how long a link whose last poller's request completed stays unread by
 * its stream thread (the poller will likely wait again at once) */
#define LINGER_NS      (1000ull * 1000)
/* how often a stream thread looks at its lingering links (ms): each look
 * is a wake-up, and a device thread that waits again and again keeps a
 * link lingering, so a look every millisecond cost 1-3 us of the stream
 * thread per 64 KiB op; a link its device thread left is read again
 * within LINGER_NS plus this */
#define LINGER_LOOK_MS 4
/* The net thread's tick ends a linger its stream thread has not ended
 * LINGER_LAPSE_NS after it ran out (a backstop, counted in
 * net_linger_lapses); one ended sooner is the stream thread's to end, so
 * a lapse is a look missed by a whole tick, never a tick that happened
 * to come between a linger's end and the next look. */
#define LINGER_LAPSE_NS ((uint64_t)TICK_MS * 1000 * 1000)
/* Bytes per read turn before yielding (the event loop, or the lock for a
 * stream thread). A write turn is net_params.max_send_bytes. Reading
 * gets the larger turn: on a link busy both ways, 1 MiB turns each way
 * (or 8 MiB each way) measured 15-20% slower than this; a receiver that
 * lets its socket fill seems to stall its sender. */
#define READ_BUDGET    (1u << 23)
/* Largest data fragment we write. Control frames (heartbeats, RecvReady,
 * Abort) go ahead of queued data at frame boundaries, so one waits behind
 * at most one fragment: 64 KiB is 65 ms at 8 Mbit/s, where 1 MiB was a
 * second. bench link and all_reduce at 16 MiB measured the same as 1 MiB
 * (within the noise of a shared machine). */
#define FRAG_MAX       LINK_FRAG_MAX
#define SMALL_PAYLOAD  (16384 - 256)   /* payloads copied into the header's record */
#define CLOSE_GRACE_NS (1000ull * 1000 * 1000)
/* Refused connections are logged one line per source address per
 * interval, with a count of the rest (status_log_refused). */
#define REFUSED_SOURCES 16
#define REFUSED_REASONS 4
#define REFUSED_LOG_NS (10ull * 1000 * 1000 * 1000)
#define RETRY_NS       (100ull * 1000 * 1000)
#define ACCEPT_MAX     64
#define REDIAL_MIN_NS  (50ull * 1000 * 1000)    /* redial backoff: the first redial is at once, then 50 ms */
#define REDIAL_MAX_NS  (1000ull * 1000 * 1000)  /* backoff doubles up to this */

enum phase {
	PH_INIT, PH_RENDEZVOUS, PH_LINKS, PH_BARRIER, PH_RUNNING, PH_FINISHING,
	PH_CLOSING, PH_FAILED,
};

/* TLS connections per host pair at most (link_streams) */
#define NET_MAX_STREAMS 16

struct peer {
	/* the data links, one per stream (link_streams; l[0] carries the
	 * barrier and the Done) */
	struct link *l[NET_MAX_STREAMS];
	/* the same as device threads see them: each set once, when it first
	 * comes UP, and never changed (it is pinned) */
	struct link *_Atomic dl[NET_MAX_STREAMS];
	char addr[128];                /* data address from Topology */
	uint32_t devices;
	bool joined;                   /* coordinator: Hello accepted */
	struct link *coord_in;         /* coordinator: its rendezvous connection */
	bool barrier_rx, done_rx;
	uint64_t retry_at[NET_MAX_STREAMS];
};

struct cmd;
struct stream_thr;

struct net {
	int host_id, num_hosts, devices_per_host;
	char coordinator[256], listen[256], certs_dir[4096];
	double connect_timeout_s, done_timeout_s;
	uint64_t hb_interval_ns, hb_timeout_ns;
	uint64_t silence_ns;           /* link_silence_s */
	uint8_t config_hash[32];
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	int (*fault)(void *ctx, int peer, bool outgoing, uint64_t frame_index,
		     const Meshrun__Frame *f);
	void *fault_ctx;
	struct fault_plan faults;      /* net_params.faults, with our counters */
	struct frame_limits lim;

	SSL_CTX *ctx;
	struct xport *x;
	struct event_base *base;
	struct event *ev_cmd, *ev_tick, *ev_reap, *ev_coord_l, *ev_data_l;
	/* every link's read/write event callback (recv_event_cb), its
	 * deferred-work callback (recv_defer_cb) and its stream threads'
	 * (recv_stream_cb), given here so that link.c and stream.c need not
	 * call up into recv.c */
	event_callback_fn link_cb, defer_cb;
	bool (*stream_cb)(struct link *l, uint32_t events);
	/* a stream thread's look, every LINGER_LOOK_MS while links linger */
	void (*stream_tick)(struct net *n, int stream);
	_Atomic int lingering;          /* links lingering (struct link) */
	struct stream_thr *streams;
	int nstreams;
	struct link *pinned;           /* dead pinned links, freed by net_free */
	uint64_t poll_spin_ns;         /* net_params.poll_spin_us */
	size_t max_send;               /* net_params.max_send_bytes */
	size_t p2p_handoff;            /* net_params.p2p_handoff_bytes */
	int notsent_lowat;             /* net_params.notsent_lowat_bytes (0: unset) */
	bool openssl_records;          /* net_params.openssl_records */
	enum aead_impl tls_cipher;     /* net_params.tls_cipher */
	pthread_mutex_t fault_mu;      /* the fault specs' counters */
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
	/* refused connections by source (status_log_refused), and the last
	 * one, which the rendezvous timeout names */
	struct refused_src {
		char host[64];           /* "" : a free slot */
		uint64_t since_ns;       /* its line was logged then */
		unsigned more;           /* refused since, not logged */
		struct {
			char text[160];
			unsigned n;
		} why[REFUSED_REASONS];  /* their reasons, counted */
		unsigned other;          /* those of yet other reasons */
	} refused[REFUSED_SOURCES];
	char last_refused[300];

	pthread_mutex_t mu;            /* guards the fields below */
	pthread_cond_t cv;
	int status;
	char msg[512];
	char security[160];            /* the first data link's (net_link_security) */
	bool ready, closed;
	struct cmd *cmd_head, *cmd_tail;

	_Atomic uint64_t bytes_sent;
	_Atomic uint64_t key_updates;
	uint64_t key_update_bytes;
	uint64_t replay_cap;           /* 0: no recovery */
	uint64_t reconnect_timeout_ns;
	_Atomic uint64_t reconnects, frames_resent;
	_Atomic uint64_t handoffs;      /* sends given to a stream thread (direct.c) */
	_Atomic uint64_t reads_before_send; /* bytes a large send's poster read first (recv.c) */
	_Atomic uint64_t polls_read_first;  /* large polls that read with output queued (recv.c) */
	_Atomic uint64_t linger_lapses; /* lingers the tick ended (net_linger_lapses) */
	_Atomic uint32_t last_op;
	_Atomic uint64_t last_step;
};

static inline uint64_t now_ns(void)
{
	return xport_now_ns();
}

/* The calling thread is the net thread (its event loop). */
static inline bool net_on_main(const struct net *n)
{
	return n->thread_started && pthread_equal(pthread_self(), n->thread);
}

/* What the control-message checks (wire_check.h) read of this host. */
static inline struct wire_self net_wire_self(const struct net *n)
{
	return (struct wire_self){ .host_id = n->host_id, .num_hosts = n->num_hosts,
				   .devices_per_host = n->devices_per_host,
				   .config_hash = n->config_hash, .job_id = n->job_id,
				   .addr_max = sizeof(n->peers[0].addr), .x = n->x,
				   .streams = n->nstreams };
}

static inline uint64_t sec_ns(double s)
{
	return s <= 0 ? 0 : (uint64_t)(s * 1e9);
}

/* ---- status.c: shared with the control thread; the operator's log ---- */

/* One line for the operator ("host <id>: " first): net_params.log or stderr. */
void status_log(struct net *n, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* A refused connection (what: "connection", "link", "agent") from addr:
 * one line per source address (the address without its port) per
 * REFUSED_LOG_NS; the others in that interval are counted and said in one
 * line when it ends (status_flush_refused). Net thread only. */
void status_log_refused(struct net *n, const char *what, const char *addr, const char *reason);
/* The counts of sources whose interval has passed (all: every one, at
 * the end). */
void status_flush_refused(struct net *n, bool all);
/* " during all_reduce step 3", or "" before any traffic. */
void status_activity(struct net *n, char *buf, size_t len);
void status_set_ready(struct net *n);
void status_set_closed(struct net *n);
/* First failure wins; true if this call recorded it. A status that is not
 * negative is recorded as NET_ERR. */
bool status_record(struct net *n, int status, const char *msg);
/* NET_OK, or the recorded failure's status. */
int status_failed(struct net *n);

/* ---- stream.c: the stream threads ---- */

/* Starts count stream threads. 0 or a negative errno with err. */
int stream_start(struct net *n, int count, char *err, size_t errlen);
/* Stops and joins them. */
void stream_stop(struct net *n);
/* Puts l's socket in its stream thread's set, quiet (under the lock).
 * 0 or a negative errno. */
int stream_add(struct link *l);
/* Arms it for events (EPOLLIN / EPOLLOUT), once. */
void stream_arm(struct link *l, uint32_t events);
/* Takes it out again (before its socket closes). */
void stream_del(struct link *l);
/* l has just begun to linger (n->lingering raised): if its stream thread
 * sleeps with no timeout, its timer wakes it at its next look
 * (LINGER_LOOK_MS), so it ends the linger (recv_stream_tick) and arms the
 * link again. */
void stream_linger(struct link *l);
/* The events word of a turn a link's stream callback asked for again
 * (it returned true): no epoll event, the budget ran out with records
 * left in OpenSSL's buffer. */
#define STREAM_AGAIN 0x80000000u

/* ---- send.c: control frames and the write path ---- */

void send_refuse(struct link *l, const char *reason);
/* A Heartbeat, Barrier or Done frame. */
void send_simple(struct link *l, int body);
void send_link_hello(struct link *l);
/* The resume hello (unsequenced, written before anything queued). */
int send_resume_hello(struct link *l);
/* Writes queued frames until the socket is full or the budget is spent.
 * 0, or -EPIPE when writing failed (l->c->err says why): the caller reads
 * what the peer sent before blaming it, then fails the link. */
int send_write(struct link *l);
/* Queues a RecvReady to ride on the next data frame to l's peer. 0 or
 * -ENOMEM. */
int send_rr_post(struct link *l, const struct frame_rr *rr);
/* Frames every RecvReady still waiting for a data frame as a control
 * frame of its own (queued; the caller writes). */
void send_rr_flush(struct link *l);

/* ---- rendezvous.c: rendezvous, dialing, link set-up, barrier ---- */

/* Refuses one connection (logged, Refuse sent, closed); the rendezvous
 * goes on. */
/* A host other than the coordinator gives up on start-up this much later
 * than connect_timeout_s, so the coordinator's deadline fires first and
 * its verdict (who never said hello) reaches every host that is there. */
#define RDV_AGENT_GRACE_S 5
/* The rendezvous deadline passed (PH_RENDEZVOUS): the line that says who
 * is missing into msg; on the coordinator, also sent to every agent that
 * joined (an Abort on its rendezvous connection). */
void rdv_timeout(struct net *n, char *msg, size_t len);
/* A connection this host dialed at start-up failed in its handshake, or
 * in a read before the hello came (rc, err from the connection):
 * certificates that do not verify (here or there) or an address that
 * does not speak TLS fail the job as NET_ERR_TLS naming the address; a
 * coordinator connection closed then is retried. false when it is not
 * one of these (the caller fails the link as before). */
bool rdv_handshake_failed(struct link *l, int rc, const char *err);
/* An agent's coordinator connection got an Abort before the topology
 * (rdv_timeout's): the job fails with its class and reason. */
void rdv_coord_on_abort(struct link *l, const Meshrun__Abort *a);
void rdv_refuse_conn(struct link *l, const char *reason);
void rdv_coord_on_hello(struct link *l, const Meshrun__Hello *h);
void rdv_send_hello(struct link *l);
void rdv_agent_on_topology(struct link *l, const Meshrun__Topology *t);
void rdv_accept_link_hello(struct link *l, const Meshrun__LinkHello *h);
/* Recovery: the tick redials a broken link we dialed first. */
void rdv_redial(struct link *l);
/* Our resumed link's peer answered with its resume hello. */
void rdv_link_resumed(struct link *l, const Meshrun__LinkHello *h);
/* A data link's hellos agree: it is UP and carries peer's traffic. */
void rdv_link_up(struct link *l, int peer);
void rdv_check_barrier(struct net *n);
/* Opens a connection to addr (the coordinator, or connection number
 * stream to peer's link listener); a failure to start it is retried from
 * the tick. */
void rdv_dial_addr(struct net *n, enum link_role role, int peer, int stream, const char *addr);
void rdv_dial(struct net *n, int peer, int stream);
/* A TLS connection for a link, renewing its sending key as configured.
 * Takes fd; NULL on allocation failure. */
struct conn *rdv_conn_new(struct net *n, int fd, bool server);

/* ---- recv.c: link events ---- */

/* Writes what l has queued (the lock held); a failed write reads what the
 * peer sent before blaming it, then fails the connection. */
void recv_write(struct link *l);
/* The read/write event callback of every link (arg: the link). */
void recv_event_cb(evutil_socket_t fd, short what, void *arg);
/* The net thread's turn for what another thread deferred (link_defer). */
void recv_defer_cb(evutil_socket_t fd, short what, void *arg);
/* A stream thread's events on an UP data link (or STREAM_AGAIN): true if
 * it wants another turn after the thread's other links. */
bool recv_stream_cb(struct link *l, uint32_t events);
/* A stream thread's look at its lingering links (every LINGER_LOOK_MS while
 * any lingers): one whose linger ran out is armed again. */
void recv_stream_tick(struct net *n, int stream);
/* A device thread waiting on link l (lock held): writes what is queued,
 * reads what came (at most budget bytes), writes again; true if anything
 * moved. large (a request of XPORT_IDLE_MIN_BYTES or more): reads first,
 * then one write turn. */
bool recv_poll(struct link *l, size_t budget, bool large);
/* A device thread about to seal a large send on l (lock held): reads
 * what waits first, at most a write turn's bytes, into posted buffers. */
void recv_before_send(struct link *l);
/* A device thread whose recv_poll of l found nothing (lock not held):
 * sleeps in ppoll() on l's socket until it has bytes to read, or room for
 * what waits to be written, at most ns; false at once (no sleep) if the
 * lock is taken, l is not UP or whole records wait in user space. */
bool recv_idle(struct link *l, uint64_t ns);
/* The listeners' callback (arg: the net). */
void recv_accept_cb(evutil_socket_t lfd, short what, void *arg);

#endif
