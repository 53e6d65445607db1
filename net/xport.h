/* Point-to-point messages between devices of one job (gloo's pair/buffer
 * layer). Collectives are written only against this: isend/irecv with a
 * (src device, dst device, tag) key, and wait with a deadline.
 *
 * Receiver-driven: data moves only into a posted receive buffer. Between two
 * devices of one host a matched send is one memcpy. For a remote peer, a
 * posted receive makes the net thread send RecvReady to the sender's host;
 * the sender's data frame goes out only after that, and its payload is read
 * straight into the posted buffer.
 *
 * Except small messages (xport_set_eager): a send of at most max bytes
 * goes out at once, without waiting for the RecvReady, while the bytes
 * sent eagerly to that host and not yet answered by a RecvReady stay
 * within credit. The receiver lands it in the posted buffer, or, if none
 * is posted yet, stages it (at most credit bytes per sending host, checked
 * on arrival) until the receive comes. Every remote receive still sends its
 * RecvReady, and the one that answers an eager send returns its credit. So
 * unexpected data is bounded per host, and a send without credit just
 * waits for its RecvReady as a large one does.
 *
 * Device ids are global (mesh row-major ids); dev_host[] maps each to its
 * host. A send and its receive must agree on the byte count exactly.
 *
 * Thread model: any device/comm thread may call isend/irecv/wait; the net
 * thread calls the xport_remote_* functions. Every function is thread-safe. */
#ifndef MESHRUN_XPORT_H
#define MESHRUN_XPORT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct xport;

/* What a message belongs to; travels in the CollectiveChunk header and names
 * the operation in errors. tag = group<<48 | (seq & 0xffffffff)<<16 | chunk. */
struct xmeta {
	uint32_t op;      /* MESHRUN__COLL_OP__* */
	uint32_t group;   /* < 65536 */
	uint64_t seq;     /* collective sequence number within the group */
	uint64_t step;    /* training step, for error messages */
	uint32_t chunk;   /* < 65536, unique within (src, dst, group, seq) */
	uint64_t offset;  /* byte offset within the collective's buffer (info) */
};

static inline uint64_t xmeta_tag(const struct xmeta *m)
{
	return ((uint64_t)m->group << 48) | ((m->seq & 0xffffffffu) << 16) | m->chunk;
}

enum xreq_kind { XREQ_SEND, XREQ_RECV };

/* A message laid over runs (xport_isendv, xport_irecvv): its bytes are
 * [base, base + len) of the concatenation of runs run[0 .. n), run i
 * starting at byte off of the concatenation (increasing; run[0].off <=
 * base) and lying at at; the last run reaches base + len. The array is
 * the caller's and must stay unchanged until the wait returns. */
struct xrun {
	uint8_t *at;
	size_t off;
};

/* A request. Fields are read by the net layer; only xport.c writes them
 * (net_ctx excepted: the net layer's own word about a request it holds). */
struct xreq {
	enum xreq_kind kind;
	int src, dst;            /* global device ids */
	uint64_t tag;
	struct xmeta meta;
	void *buf;               /* recv: destination; send: source (const) */
	size_t len;
	/* or, if runs: the message over runs (struct xrun; buf NULL) */
	const struct xrun *runs;
	int nruns;
	size_t runs_base;
	const float *addend;     /* recv: NULL, or buf = data + addend (float32) */
	bool eager;              /* send: goes out without a RecvReady */
	uintptr_t net_ctx;       /* the net layer's, while it holds the request */
	/* xport_now_ns() times, for traces (all 0 unless xport_set_stamps
	 * turned them on): posted; handed to the net layer (a send: its
	 * receive was ready; a receive: its data began to arrive; 0: never);
	 * completed */
	uint64_t t_issued_ns, t_net_ns, t_done_ns;
	/* private to xport.c */
	int run_hint;            /* the run xreq_at found last (walks are in order) */
	int state;
	int rc;
	/* completion: XW_PENDING, XW_DONE, XW_ORPHAN, or the parker of the
	 * thread sleeping on it (net/xport.c) */
	_Atomic uintptr_t wait;
	struct xreq *next;       /* hash chain */
	struct xport *x;
};

/* Hooks into the network layer for peers on other hosts. Called from the
 * posting (or waiting) thread, without xport locks held.
 *  recv_posted: send RecvReady{src,dst,tag,len} to the host of req->src
 *               (req is a copy, valid for the call only).
 *  send_ready:  write req (a data frame) to the host of req->dst, then call
 *               xport_complete(req, rc) once the caller's buffer is free
 *               again: its bytes were acknowledged by the peer, or copied.
 *               May write from the calling thread; must not block on the
 *               peer.
 *  poll:        optional (NULL: waiters only sleep). A thread waiting on
 *               the remote request req makes what progress it can on the
 *               link to req's peer host (reading, decrypting into posted
 *               buffers, writing what is queued) without blocking; true if
 *               anything moved. first: the first call of this wait.
 *  poll_end:    optional; the thread that called poll for req stops
 *               polling: done, req completed (the thread is likely to
 *               poll again soon); else it is about to sleep.
 *  flush:       optional; a thread is about to wait: what recv_posted
 *               held back (a RecvReady waiting to ride on a data frame)
 *               must go now.
 *  idle:        optional; a poll of req (of at least XPORT_IDLE_MIN_BYTES)
 *               found nothing to do: the thread sleeps until req's link has
 *               bytes to read (or room for what waits to be written), at
 *               most ns, in the kernel rather than spinning; false if it
 *               did not (the link is someone else's now, or bytes already
 *               wait in user space), and the waiter spins on. */
struct xport_remote_ops {
	void (*recv_posted)(void *ctx, struct xreq *req);
	void (*send_ready)(void *ctx, struct xreq *req);
	bool (*poll)(void *ctx, struct xreq *req, bool first);
	void (*poll_end)(void *ctx, struct xreq *req, bool done);
	void (*flush)(void *ctx);
	bool (*idle)(void *ctx, struct xreq *req, uint64_t ns);
	/* optional: flush's RecvReadys queued for the links' own threads
	 * to write (NULL: flush) */
	void (*flush_later)(void *ctx);
};

/* A waiter on a remote request of at least this many bytes whose poll
 * found nothing sleeps on its link's socket (xport_remote_ops.idle) for
 * the rest of its poll_spin_us instead of spinning on sched_yield and
 * empty recv()s: its next bytes are at least a record away, and a large
 * message's gaps (the peer encrypting the next burst) are long against a
 * wake-up. Smaller ones spin, for latency. */
#define XPORT_IDLE_MIN_BYTES (256u * 1024)

/* ndev_total devices; dev_host[d] is device d's host (copied). NULL ops:
 * a single-host job. Constructor: NULL on allocation failure. */
struct xport *xport_new(int host_id, int ndev_total, const int *dev_host,
			const struct xport_remote_ops *ops, void *ops_ctx);
void xport_free(struct xport *x);
int xport_host_of(const struct xport *x, int dev);
int xport_num_devices(const struct xport *x);
/* Sends posted by this host's devices so far (messages, any length). */
uint64_t xport_messages(struct xport *x);
/* Payload bytes of the sends to other hosts posted by device dev of this
 * host so far (DCN traffic before framing and TLS; counted once, when
 * posted, so a resend after a link reset does not count again). */
uint64_t xport_remote_bytes(struct xport *x, int dev);
/* Bytes copied between devices of this host so far (ICI traffic). */
uint64_t xport_local_bytes(struct xport *x);

/* Post a send/receive. On success *out is a request the caller must pass to
 * xport_wait exactly once. src (send) / dst (recv) must be a device of this
 * host. 0, or -EINVAL (bad ids), -ENOMEM, or the failure code after
 * xport_fail. buf must stay valid until the wait returns 0. */
int xport_isend(struct xport *x, int src, int dst, const struct xmeta *m,
		const void *buf, size_t len, struct xreq **out);
int xport_irecv(struct xport *x, int src, int dst, const struct xmeta *m,
		void *buf, size_t len, struct xreq **out);

/* A receive that sums on arrival, for float32 messages: the data never lands
 * raw; buf[i] = received[i] + addend[i], computed as the bytes come in (on
 * the net thread, or by the local sender's copy). addend may be buf itself
 * (accumulate in place); otherwise it must not overlap buf, and it must
 * stay unchanged until the wait returns. len must be a multiple of 4
 * (-EINVAL otherwise). One pass over buf instead of landing and summing. */
int xport_irecv_add(struct xport *x, int src, int dst, const struct xmeta *m,
		    float *buf, const float *addend, size_t len, struct xreq **out);

/* The same over runs (struct xrun): one message whose bytes lie in the
 * runs, written and landed run by run with no staging copy. A receive
 * with sum adds the data into the runs (buf = data + buf: in place),
 * as xport_irecv_add with addend == buf. */
int xport_isendv(struct xport *x, int src, int dst, const struct xmeta *m,
		 const struct xrun *runs, int nruns, size_t base, size_t len, struct xreq **out);
int xport_irecvv(struct xport *x, int src, int dst, const struct xmeta *m,
		 const struct xrun *runs, int nruns, size_t base, size_t len, bool sum,
		 struct xreq **out);
/* The run of run[0 .. nrun) that holds byte p of their concatenation:
 * the last one starting at or before it (empty runs are passed over);
 * hint (or -1): a run to try first, and the one after it. */
int xruns_find(const struct xrun *run, int nrun, int hint, size_t p);
/* Where byte off of r's message lies, and *avail (> 0 for off < len)
 * bytes from there are contiguous. */
uint8_t *xreq_at(const struct xreq *r, size_t off, size_t *avail);
/* Copies len bytes of r's message from byte off into dst. */
void xreq_copy_out(const struct xreq *r, size_t off, void *dst, size_t len);

/* Sends of at most max_bytes to a remote device go out without waiting for
 * the receiver's RecvReady, while at most credit_bytes sent eagerly to a
 * host are unanswered; as many bytes from each host may be staged here.
 * Every host of a job must set the same values. max_bytes 0 (the default):
 * every send waits for its RecvReady. */
void xport_set_eager(struct xport *x, size_t max_bytes, size_t credit_bytes);

/* Whether requests are stamped with their times (struct xreq, and
 * xport_last_times): on only while a trace records them, so an untraced
 * run reads no clock per request. Off by default. Any thread may call
 * it; a request takes what it finds at each stamp. */
void xport_set_stamps(struct xport *x, bool on);

/* How long a thread waiting on a remote request polls its link (the
 * poll hook) without progress before it sleeps; 0 (the default): it
 * sleeps at once. */
void xport_set_poll_spin(struct xport *x, uint64_t spin_ns);
/* The cores this host's threads may use (default: the creating thread's
 * affinity; the agent sets the CPUs the machine's agents share, which a
 * bound agent's affinity is only its share of). A waiter whose yield ran
 * another thread stops polling only if the machine has more runnable
 * threads than this; tests set it. */
void xport_set_cores(struct xport *x, int ncores);

/* Held wake-ups: between xport_hold_wakes and xport_release_wakes (they
 * nest), a receive this thread completes whose waiter sleeps is marked
 * done, but its waiter is woken only at the release (sends wake at once). A link's stream
 * thread holds them over its turn, so the device thread it wakes does not
 * preempt it on their shared core while it still holds the link's lock
 * (the woken thread then blocked on that lock at its next post: two more
 * context switches, and under load the lock's holder preempted for
 * milliseconds). xport_wakes_held: how many this thread holds now;
 * xport_wakes_deferred: how many were ever held, on x. */
void xport_hold_wakes(void);
void xport_release_wakes(void);
/* Wakes what this thread holds now; the hold goes on. */
void xport_wake_held(void);
int xport_wakes_held(void);
uint64_t xport_wakes_deferred(struct xport *x);

/* Waits until req completes or deadline_ns (CLOCK_MONOTONIC; 0 = no wait,
 * just test) passes. Returns 0 and frees req; -EAGAIN if deadline_ns was 0
 * and it is still pending (req stays valid); -ETIMEDOUT, or the failure code
 * after xport_fail, with detail in err — then req is abandoned (freed when
 * the net layer lets go of it) and the transport must be considered failed.
 * A remote request is polled for (see xport_set_poll_spin), then slept on;
 * its completion wakes exactly this thread, and only if it sleeps. */
int xport_wait(struct xreq *req, uint64_t deadline_ns, char *err, size_t errlen);
/* xport_wait(req, 0, ...) after sending what a posted receive held back
 * (the flush hook): a receive tested this way, and not waited for yet,
 * still gets its data. 0 (req freed), -EAGAIN (pending), or a failure
 * as xport_wait's. */
int xport_test(struct xreq *req, char *err, size_t errlen);
/* xport_test without the flush: a receive's RecvReady stays queued, to
 * ride on the next data frame to its host (a send the caller makes
 * next), or to go with the next flush. */
int xport_peek(struct xreq *req, char *err, size_t errlen);
/* Sends the RecvReadys of posted receives still queued (the flush hook):
 * each alone, except on a link with a data frame queued, whose next
 * header carries them. */
void xport_flush(struct xport *x);
/* The same, but the RecvReadys are written by the links' stream threads
 * (the caller does not write to a socket; they go a wake-up later). */
void xport_flush_later(struct xport *x);
/* The times (struct xreq's t_*_ns) of the request the calling thread's
 * last xport_wait or xport_test returned 0 for (and freed). */
struct xtimes {
	uint64_t issued_ns, net_ns, done_ns;
};
struct xtimes xport_last_times(void);

/* Fails every pending and future request with rc and message msg (e.g.
 * "lost host 2 (127.0.0.1:7002): no heartbeat for 4.0 s"). First call wins. */
void xport_fail(struct xport *x, int rc, const char *msg);
/* 0, or the failure code with the message copied into err. */
int xport_failed(struct xport *x, char *err, size_t errlen);

/* ---- for the net thread ---- */
/* RecvReady arrived from a peer: returns the matching local send (now owned
 * by the caller until xport_complete) or NULL if none is posted yet (the
 * readiness is remembered and send_ready fires at post time). -EMSGSIZE
 * style mismatches are returned as a send completed with an error and NULL. */
struct xreq *xport_remote_ready(struct xport *x, int src, int dst, uint64_t tag, size_t len);
/* A data frame header arrived: returns the posted receive it belongs to (the
 * caller reads len bytes into req->buf, or for a receive with an addend
 * passes them through xport_land, then xport_complete). For eager data with
 * no receive posted, a staging request to read it into the same way; its
 * xport_complete hands the data to the receive. NULL, with the reason in
 * *why, if none is posted (and the data is not eager), the length differs,
 * or eager data exceeds the credit: a protocol error, close the link. */
struct xreq *xport_remote_data(struct xport *x, int src, int dst, uint64_t tag, size_t len,
			       bool eager, const char **why);
/* Puts len received bytes at byte offset off of receive r: a copy, or for a
 * receive with an addend, data + addend. off and len multiples of 4 then;
 * data needs no alignment. */
void xport_land(struct xreq *r, size_t off, const void *data, size_t len);
/* The payload of receive r as a byte stream in pieces of any length (TLS
 * records need not split it at float boundaries): lands every whole float
 * at once and keeps the bytes of a split one for the next piece. Start each
 * message with a zeroed struct xland. */
struct xland {
	uint64_t off;                  /* where the next whole float lands */
	uint8_t carry[sizeof(float)];
	size_t ncarry;
};
void xport_land_stream(struct xreq *r, struct xland *s, const void *data, size_t len);
/* Completes a request handed to the net layer: from here on the net layer
 * must not touch req (its waiter may free it at once). */
void xport_complete(struct xreq *req, int rc);

uint64_t xport_now_ns(void);

#endif
