/* The network thread of one host: a libevent loop on its own pthread that
 * owns every DCN byte. It runs the rendezvous (host 0 is the coordinator),
 * opens one mutually authenticated TLS 1.3 link per host pair (the lower id
 * dials), holds a barrier, then carries xport traffic (receiver-driven:
 * RecvReady, then a CollectiveChunk whose payload is read straight into the
 * posted buffer), heartbeats every link, turns a dead or silent peer into an
 * xport_fail() plus Abort to the others, and ends with a Done exchange so a
 * clean exit is never taken for a lost peer.
 *
 * net knows nothing of configs or jobs: the agent fills struct net_params.
 * Thread model: net_new/net_start/net_finish/net_abort/net_free from one
 * control thread; the xport hooks from any device thread, which write and
 * read the links themselves (net/direct.c, net/link.h).
 *
 * A send's buffer across a reconnect: the caller's buffer belongs to the
 * net from send_ready until xport_complete. With recovery, a message of
 * one data frame is copied and completes at once; a longer one is resent
 * from the caller's buffer after a reconnect, so it completes only when
 * the peer acknowledged its last frame (a reset before that resends it
 * from the buffer; the caller must not touch it). A failure completes it
 * with an error and the net never reads the buffer again. Without
 * recovery a send completes when its last byte went to the connection. */
#ifndef MESHRUN_NET_H
#define MESHRUN_NET_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/aead.h"
#include "net/xport.h"
#include "proto/meshrun.pb-c.h"

/* wire 2: Abort.code and Done carry errno classes; wire 3: links resume
 * (LinkHello.resume/last_seq, Ack, ack_seq read); wire 4: data frames
 * have a fixed binary header (frame version 2) that may carry a RecvReady */
#define NET_VERSION "meshrun 0.3 wire 4"

#define NET_MAX_SEND_DEFAULT (1u << 20)
/* A point-to-point message's records go to send() every this many bytes
 * (struct conn.push), not every max_send_bytes: the peer opens them while
 * the rest is sealed (docs/collectives.md, "One large message's time") */
#define NET_P2P_PUSH_BYTES (256u << 10)

/* Failure classes: 0 or a negative errno, as every library call reports
 * them (the CLI turns them into exit codes). Between hosts, Abort.code
 * carries the class as a positive errno. */
enum net_status {
	NET_OK = 0,
	NET_ERR = -EIO,                  /* generic failure: I/O errors */
	NET_ERR_CONFIG = -EINVAL,        /* certificates, addresses */
	NET_ERR_PEER_LOST = -EHOSTDOWN,  /* a peer died, fell silent or broke its link */
	NET_ERR_REFUSED = -ECONNREFUSED, /* rendezvous refused */
	NET_ERR_TIMEOUT = -ETIMEDOUT,    /* a start-up or finish deadline passed */
	/* a TLS handshake at start-up failed: a certificate failed
	 * verification (another cluster's CA, ours refused), or what answers
	 * at the address does not speak TLS (a foreign listener) */
	NET_ERR_TLS = -EKEYREJECTED,
};

/* What a link does with a frame at its fault point (net_params.fault).
 * The reliability work will add drop, delay, corrupt and black-hole. */
enum link_fault {
	LINK_FAULT_PASS = 0,   /* the frame goes on as usual */
	LINK_FAULT_CLOSE,      /* the link fails exactly as on a read error; a
				* sent frame is not sent */
	LINK_FAULT_DROP,       /* a sent data frame is not written, silently:
				* counted as sent (kept for replay), so the
				* receiver sees a gap in link_seq (fault specs
				* only, not net_params.fault) */
};

struct net_params {
	int host_id, num_hosts, devices_per_host;
	const char *coordinator;     /* host 0's rendezvous address host:port */
	const char *listen;          /* this host's link listener (port 0: any) */
	int coord_fd;                /* -1, or an inherited listening socket for
				      * the coordinator (host 0); net takes it */
	int data_fd;                 /* -1, or an inherited link listener; taken */
	const char *certs_dir;
	double heartbeat_interval_s;
	double heartbeat_timeout_s;
	double connect_timeout_s;    /* rendezvous + links + barrier */
	double done_timeout_s;       /* waiting for the other hosts' Done */
	uint64_t max_frame_bytes;
	/* every link renews its TLS sending key after this many bytes sent
	 * (0: never); AES-GCM's limit is about 2^24.5 records per key */
	uint64_t key_update_bytes;
	/* Link recovery: a data link that breaks (EOF, reset, TLS error) while
	 * its peer is alive is redialed by the lower host id and resumed:
	 * each side resends what the other had not received. Frames are kept
	 * until acknowledged, at most this many bytes per link (a sender
	 * waits when it is full). 0: no recovery, a broken link fails the
	 * job at once. */
	uint64_t replay_buffer_bytes;
	double reconnect_timeout_s;  /* a link not back by then fails the job */
	/* a link up that hears nothing this long is taken for half-open and
	 * its connection dropped (recovery on); 0: 0.4 x heartbeat_timeout_s */
	double link_silence_s;
	/* A device thread waiting on a remote request polls its link this
	 * long before it sleeps (net_xport_ops' poll; the xport must be told,
	 * xport_set_poll_spin). Only recorded here. */
	uint64_t poll_spin_us;
	/* A writer's turn: the bytes one thread writes on a link before it
	 * pushes them to the wire and looks again (0: NET_MAX_SEND_DEFAULT). */
	uint64_t max_send_bytes;
	/* A point-to-point send (COLL_P2P) of more bytes than this is queued
	 * for the link's stream thread to seal and write; the issuing thread
	 * returns at once (0: it writes what it can itself). */
	uint64_t p2p_handoff_bytes;
	/* after OpenSSL's handshake, OpenSSL keeps writing and reading the
	 * records (false: our record layer does, net/tls_rec.h) */
	bool openssl_records;
	/* who seals and opens our records' AES-GCM (net/aead.h): ipsec-mb
	 * where this build has it (AEAD_IMPL_AUTO, the default 0), or OpenSSL */
	enum aead_impl tls_cipher;
	/* TCP_NOTSENT_LOWAT on every link's socket (0: not set) */
	uint64_t notsent_lowat_bytes;
	/* TLS connections per host pair, each driven by its own stream thread
	 * (0 or 1: one). */
	int link_streams;
	uint8_t config_hash[32];
	/* one line per event worth telling the operator (refused connections);
	 * NULL: stderr */
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	/* The fault point: NULL (every frame passes), or called on the net
	 * thread once for every frame on every link, sent (after its header
	 * is encoded) or received (after its header is decoded and its
	 * sequence number checked), before anything acts on it (recovery's
	 * unsequenced Ack and resume LinkHello excepted; a frame resent after a
	 * reconnect passes once, when first sent). peer is the
	 * other host (-1 on an accepted connection before its hello);
	 * frame_index counts the frames of that direction on that one link
	 * from 0 (the rendezvous connection and the data link to a host count
	 * apart). Returns an enum link_fault, which the link honours.
	 * Ownership: fault_ctx is the caller's and must outlive the net; f is
	 * lent for the call only (do not keep or change it; a data frame comes
	 * as its CollectiveChunk view). The callback runs on whichever thread
	 * writes or reads the frame (the net thread, a stream thread, or a
	 * device thread sending or polling directly), with that link's lock
	 * held: calls for one link never overlap, calls for two links may. It
	 * must be quick, must not block and must not call any net_* function.
	 * For tests and fault drills. */
	int (*fault)(void *ctx, int peer, bool outgoing, uint64_t frame_index,
		     const Meshrun__Frame *f);
	void *fault_ctx;
	/* Fault specs (net/fault.h) this host applies to the data frames it
	 * sends, after the callback above; NULL: none. Copied. */
	const struct fault_plan *faults;
};

struct net;
struct fault_plan;

/* Loads the TLS context and opens the listeners. NULL with *status (an
 * enum net_status) and err on failure. Strings in p are copied; the
 * inherited sockets in p are taken, even on failure. */
struct net *net_new(const struct net_params *p, int *status, char *err, size_t errlen);

/* The hooks to pass to xport_new(..., net_xport_ops(), net). */
const struct xport_remote_ops *net_xport_ops(void);
/* Must be called before net_start; x must outlive the net. */
void net_set_xport(struct net *n, struct xport *x);

/* Starts the thread and blocks until rendezvous, links and barrier are done.
 * NET_OK, or a status with the one-line reason in err. */
int net_start(struct net *n, char *err, size_t errlen);

/* Clean end: sends Done to every peer, waits (done_timeout_s) for Done from
 * all, closes the links in order. NET_OK or a status with err. */
int net_finish(struct net *n, char *err, size_t errlen);

/* A local failure: fails the xport (waking every waiter), sends Abort with
 * status (an enum net_status; anything not negative counts as NET_ERR) and
 * msg to every peer and closes the links. First failure wins. */
void net_abort(struct net *n, int status, const char *msg);

/* NET_OK, or the first failure's status with its message in err (may be
 * NULL). */
int net_failed(struct net *n, char *err, size_t errlen);

/* Plaintext bytes written to all links so far (frames and payloads). */
uint64_t net_bytes_sent(struct net *n);
/* TLS 1.3 KeyUpdates sent on all links so far. */
uint64_t net_key_updates(struct net *n);
/* Links resumed after breaking, and frames sent again on resuming. */
uint64_t net_reconnects(struct net *n);
uint64_t net_frames_resent(struct net *n);
/* Point-to-point sends handed to a stream thread (p2p_handoff_bytes). */
uint64_t net_handoffs(struct net *n);
/* Bytes a device thread read from a link just before sealing a large
 * send on it (recv_before_send, net/recv.c). */
uint64_t net_reads_before_send(struct net *n);
/* Polls of a waiter on a large message that read bytes while output
 * waited queued on the link: read before that write (recv_poll). */
uint64_t net_polls_read_first(struct net *n);
/* Lingering links the net thread's tick had to end, their stream thread
 * not having come back for them (0 when stream_linger works). */
uint64_t net_linger_lapses(struct net *n);

/* What protects this host's links, for a log line (tls_conn_describe of
 * the first data link that came up, e.g. "TLS 1.3 TLS_AES_128_GCM_SHA256,
 * meshrun's records, AES-GCM by ipsec-mb (avx512)"); "" before any link
 * (or on one host). */
void net_link_security(struct net *n, char *buf, size_t len);

/* Flushes what can be flushed within about a second, closes every link,
 * stops the thread and frees n. NULL is fine. */
void net_free(struct net *n);

#endif
