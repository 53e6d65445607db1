/* A connection as a table of functions (Valkey connection.h): plain TCP for
 * framing tests, and TLS (net/tls_conn.h) for everything between hosts. A
 * type overrides the byte-moving calls (handshake, read, write, flush,
 * pending, shutdown) and answers what callers may ask of it (the peer's
 * host identity, key renewal), so the link code never knows which it
 * holds. Sockets are non-blocking; a call that cannot progress returns
 * -EAGAIN and sets c->want to the readiness it waits for.
 * Contract for every call: on an error other than -EAGAIN the caller must
 * close the connection (conn_free); c->err says why. */
#ifndef MESHRUN_CONN_H
#define MESHRUN_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum conn_want { CONN_WANT_NONE = 0, CONN_WANT_READ = 1, CONN_WANT_WRITE = 2 };

struct conn;

struct conn_type {
	const char *name;
	/* 0 once the handshake is done; -EAGAIN (see want); -EKEYREJECTED
	 * when a certificate failed verification (the peer's here, or ours
	 * there); -EPROTO (not TLS, or TLS gone wrong), -ECONNRESET etc. */
	int (*handshake)(struct conn *c);
	/* > 0 bytes read; 0 at the peer's orderly close; -EAGAIN; < 0 error.
	 * May write anywhere in [buf, buf + len), also past the bytes it
	 * returns (TLS records of our own decrypt there before their tag is
	 * checked, net/tls_rec.h); what it returns is verified. */
	ssize_t (*read)(struct conn *c, void *buf, size_t len);
	/* > 0 bytes written (possibly fewer than len); -EAGAIN; < 0 error.
	 * After -EAGAIN, retry with the same len (the buffer may move). */
	ssize_t (*write)(struct conn *c, const void *buf, size_t len);
	/* Hands written bytes still buffered in user space to the kernel.
	 * 0 when none are left; -EAGAIN (socket full); < 0 error. Call it
	 * when a burst of writes is over. */
	int (*flush)(struct conn *c);
	/* true if bytes already taken off the socket wait in user space (TLS
	 * records, the socket BIO's buffer): a read would make progress that
	 * no readiness event will announce. */
	bool (*pending)(struct conn *c);
	/* Starts an orderly close of the sending side (TLS close_notify, then
	 * shutdown(SHUT_WR)). 0 when done; -EAGAIN; < 0 error. */
	int (*shutdown)(struct conn *c);
	/* After the handshake: the host id (>= 0) the peer's certificate
	 * names, or a negative errno with err saying why (no certificate, no
	 * meshrun-host-<id> identity; plain TCP carries none). */
	int (*peer_host)(struct conn *c, char *err, size_t errlen);
	/* Renews the sending key after every `bytes` written (0: never),
	 * counting each renewal in *count (NULL: not counted; the counter may
	 * be shared by many connections and read from other threads). A type
	 * without keys ignores it. */
	void (*set_key_update)(struct conn *c, uint64_t bytes, _Atomic uint64_t *count);
	/* Closes the socket and frees the connection. */
	void (*free)(struct conn *c);
};

/* The part every type shares; a type embeds it first (net/tls_conn.c). */
struct conn {
	const struct conn_type *type;
	int fd;
	enum conn_want want;
	/* a hint for the next write: more bytes follow at once, so the type
	 * may hold back a partial segment (MSG_MORE) until they do; when no
	 * more follow, conn_flush pushes whatever is held */
	bool more;
	/* while more follow, a type that holds written bytes back for one
	 * large send() still sends them once this many wait, so the peer can
	 * open the first while we seal the rest (0: its own size; set per
	 * write by the link, net/send.c) */
	size_t push;
	/* the last conn_read's recv() off the socket came back short of what
	 * was asked: the socket held no more then. With nothing buffered in
	 * user space (conn_pending), the next read would likely meet EAGAIN,
	 * so a reader may end its turn without that system call (net/recv.c
	 * link_read). false after a read that made no recv() (OpenSSL's
	 * records); with records of our own (net/tls_rec.h), a read served
	 * from records already in user space repeats what the latest recv()
	 * said */
	bool drained;
	char peer_addr[64];       /* "ip:port" of the other end */
	char err[256];
};

/* For connection types: fills the shared part for a socket. */
void conn_init(struct conn *c, const struct conn_type *type, int fd);

/* Wraps a connected (or connecting) non-blocking socket in plain TCP. Takes
 * ownership of fd, even on failure; NULL on allocation failure. */
struct conn *conn_new_tcp(int fd);

static inline int conn_handshake(struct conn *c) { return c->type->handshake(c); }
static inline ssize_t conn_read(struct conn *c, void *buf, size_t len)
{
	return c->type->read(c, buf, len);
}
static inline ssize_t conn_write(struct conn *c, const void *buf, size_t len)
{
	return c->type->write(c, buf, len);
}
static inline int conn_flush(struct conn *c) { return c->type->flush(c); }
static inline bool conn_pending(struct conn *c) { return c->type->pending(c); }
static inline int conn_shutdown(struct conn *c) { return c->type->shutdown(c); }
static inline int conn_peer_host(struct conn *c, char *err, size_t errlen)
{
	return c->type->peer_host(c, err, errlen);
}
/* AES-GCM must not encrypt more than about 2^24.5 full records under one
 * key (RFC 8446 section 5.5): TLS renews its sending key (a TLS 1.3
 * KeyUpdate, the peer keeps its own) after every `bytes` written. */
static inline void conn_set_key_update(struct conn *c, uint64_t bytes, _Atomic uint64_t *count)
{
	c->type->set_key_update(c, bytes, count);
}
/* Closes the socket and frees c; NULL is fine. */
void conn_free(struct conn *c);

/* ---- sockets ---- */
/* Splits "host:port" or "[v6]:port". 0 or -EINVAL. */
int conn_split_addr(const char *addr, char *host, size_t hostlen, int *port);
/* A non-blocking listening socket on addr (port 0: any). 0 or -errno. */
int conn_listen(const char *addr, int *fd_out, char *err, size_t errlen);
/* Starts a non-blocking connect to addr. fd, or -errno with err. The
 * connection is established when the socket turns writable and
 * conn_connect_result() returns 0. */
int conn_connect_start(const char *addr, char *err, size_t errlen);
/* 0, or -errno of a finished non-blocking connect. */
int conn_connect_result(int fd);
/* Accepts one connection as non-blocking; fd, -EAGAIN, or -errno. */
int conn_accept(int lfd, char *peer, size_t peerlen);
/* "ip:port" of the local (local=true) or remote end of fd. */
void conn_sockname(int fd, bool local, char *out, size_t outlen);
int conn_set_nonblock(int fd);
/* strerror(e) in the lower case of our messages (thread-local buffer). */
const char *conn_strerror(int e);

#endif
