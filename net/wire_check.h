/* The pure half of the control-message handlers: what a frame that came
 * off a link may say, given what this host knows. Each check reads a body
 * (already unpacked by frame_parse_header) and a small view of this host's
 * state, touches no link, socket or job, and returns 0 or a negative errno
 * with a one-line reason naming the frame and the field. The handlers in
 * recv.c and rendezvous.c call these and then only apply the result; the
 * fuzz target tests/fuzz/fuzz_control.c calls the same functions.
 *
 * Errors: -EBADMSG the peer sent something this host must not take (the
 * handler refuses that connection or calls it a bad frame); -EINVAL the
 * hosts were started with different configs (the rendezvous fails for
 * everyone). */
#ifndef MESHRUN_WIRE_CHECK_H
#define MESHRUN_WIRE_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/frame.h"
#include "net/link.h"
#include "proto/meshrun.pb-c.h"

#define WIRE_HASH_LEN 32

/* What this host knows that the checks read. */
struct wire_self {
	int host_id, num_hosts, devices_per_host;
	const uint8_t *config_hash;    /* WIRE_HASH_LEN bytes */
	uint64_t job_id;               /* 0 until the topology came */
	size_t addr_max;               /* an address must be shorter than this */
	const struct xport *x;         /* which host each device lives on */
	int streams;                   /* links per host pair (link_streams) */
};

/* ---- sequence numbers (every frame, before its body) ---- */

/* What a link knows of its receive side. */
struct wire_rx_seq {
	bool replay;                   /* recovery on: acks, resumes, duplicates */
	bool hello;                    /* the link waits for a hello (LS_HELLO) */
	bool acks;                     /* the link takes acks (LS_UP, LS_CLOSING) */
	uint64_t rx_seq;               /* last link_seq received */
	uint64_t tx_seq;               /* last link_seq sent */
	uint64_t part_seq;             /* half-read when the link broke (0: none) */
};

enum wire_seq {
	WIRE_SEQ_NEXT,                 /* the next frame: check and dispatch it */
	WIRE_SEQ_RESUME_HELLO,         /* the peer's resume hello (unsequenced) */
	WIRE_SEQ_SKIP,                 /* an Ack, or a frame we have: drop it */
	WIRE_SEQ_PART,                 /* the rest of the half-read frame */
	WIRE_SEQ_GAP,                  /* recovery: frames before it never came */
};

/* The class of a frame (its body: MESHRUN__FRAME__BODY_CHUNK for a data
 * frame; its link_seq and ack_seq) on a link in state s (>= 0, enum
 * wire_seq), or -EBADMSG when its link_seq is not the next one, or (with
 * recovery, on a link that takes acks) its ack_seq acknowledges a frame
 * never sent. */
int wire_check_seq(const struct wire_rx_seq *s, int body, uint64_t link_seq, uint64_t ack_seq,
		   char *err, size_t errlen);

/* ---- which body the link's stage allows ---- */

/* Before the hello (LS_HELLO): the body a connection of this role may
 * open with (a hello, or a Refuse on a connection we dialed). 0 or
 * -EBADMSG. */
int wire_check_hello_stage(enum link_role role, int body, char *err, size_t errlen);
/* On a running link (LS_UP). 0 or -EBADMSG. */
int wire_check_running(int body, char *err, size_t errlen);

/* ---- rendezvous ---- */

/* The coordinator's record of the Hello's host id (read only when that id
 * is in range). */
struct wire_join {
	bool topology_done;            /* the Topology went out */
	bool joined;                   /* that id's Hello was accepted */
	const char *joined_from;       /* from where (NULL: unknown) */
};

/* The coordinator's checks of an agent's Hello, after the certificate was
 * pinned to its host id: -EBADMSG refuses that agent alone (id, late,
 * duplicate, address), -EINVAL fails the rendezvous (version, host count,
 * config hash, devices per host). */
int wire_check_hello(const struct wire_self *s, const struct wire_join *j,
		     const Meshrun__Hello *h, char *err, size_t errlen);
/* An agent's checks of the Topology (host count, one entry per host in
 * order, each with an address that fits). 0 or -EBADMSG. */
int wire_check_topology(const struct wire_self *s, const Meshrun__Topology *t, char *err,
			size_t errlen);

/* ---- data links ---- */

/* The acceptor's checks of a LinkHello before the certificate: the job
 * id, that the lower host id dials, and a stream index below streams.
 * 0 or -EBADMSG. */
int wire_check_link_hello(const struct wire_self *s, const Meshrun__LinkHello *h, char *err,
			  size_t errlen);

/* What the acceptor has of the LinkHello's host. */
struct wire_link_view {
	bool exists;                   /* a link to that host */
	bool resumable;                /* recovery on, it ran and is UP or BROKEN */
	uint64_t tx_seq;               /* the last link_seq it sent */
};

/* A resume from host `host` after its frame last_seq: it cannot have
 * received more than the tx_seq frames this side sent (a replay from
 * there would skip frames it never had). 0 or -EBADMSG. */
int wire_check_resume_seq(unsigned host, uint64_t last_seq, uint64_t tx_seq, char *err,
			  size_t errlen);
/* The acceptor's check after the certificate: a resume needs a link that
 * can resume (and wire_check_resume_seq), a new link needs none yet. 0 or
 * -EBADMSG. */
int wire_check_link_join(const struct wire_link_view *v, const Meshrun__LinkHello *h,
			 char *err, size_t errlen);
/* The dialer's check of the answer from host peer (at addr) on its
 * connection number stream: that host, this job, that stream, and for a
 * redial (was_up) a resume. 0 or -EBADMSG. */
int wire_check_link_answer(const struct wire_self *s, int peer, const char *addr,
			   unsigned stream, bool was_up, const Meshrun__LinkHello *h, char *err,
			   size_t errlen);

/* ---- data ---- */

/* The message a link is receiving in fragments (in_msg false: none). */
struct wire_rx_msg {
	bool in_msg;
	int src, dst;
	uint64_t tag, next, total;
};

/* A data frame from host peer (frame_parse_data checked its lengths):
 * devices on this link, and a fragment that starts a message or continues
 * the current one in order. 0 or -EBADMSG. Whether a receive waits for it
 * is the transport's (xport). */
int wire_check_chunk(const struct wire_self *s, int peer, const struct wire_rx_msg *m,
		     const struct frame_data *c, char *err, size_t errlen);
/* A RecvReady from host peer (a control frame's, or one riding on a data
 * frame): a send from this host to the peer's. 0 or -EBADMSG. */
int wire_check_recv_ready(const struct wire_self *s, int peer, const struct frame_rr *rr,
			  char *err, size_t errlen);

/* Text a peer sent (NULL: none), for a log line: copied into out with
 * control characters (newlines among them) as '?', cut to outlen - 1
 * bytes. Returns out. */
const char *wire_peer_text(const char *s, char *out, size_t outlen);

/* The failure class an Abort's code or a Done's status carries (a
 * positive errno) as a net status: -code, or NET_ERR when out of range. */
int wire_done_status(int32_t code);

#endif
