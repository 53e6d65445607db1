/* Plain TCP as a connection type, the shared part of every type, and
 * socket helpers (addresses, listen, connect, accept); see net/conn.h. TLS
 * is its own type in net/tls_conn.c. */
#include "net/conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void conn_tune(int fd);
static void conn_congestion(int fd, const struct sockaddr *sa);

/* the congestion control of our sockets (conn_congestion) */
#define CONN_TCP_CONGESTION "cubic"

const char *conn_strerror(int e)
{
	static _Thread_local char buf[128];
	snprintf(buf, sizeof(buf), "%s", strerror(e));
	if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
		buf[0] = (char)(buf[0] - 'A' + 'a');
	return buf;
}

/* ---- plain TCP ---- */

static int tcp_handshake(struct conn *c)
{
	c->want = CONN_WANT_NONE;
	return 0;
}

static ssize_t tcp_read(struct conn *c, void *buf, size_t len)
{
	ssize_t n = recv(c->fd, buf, len, 0);
	c->drained = n >= 0 && (size_t)n < len;
	if (n >= 0)
		return n;
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
		c->want = CONN_WANT_READ;
		return -EAGAIN;
	}
	int rc = -errno;
	snprintf(c->err, sizeof(c->err), "%s", conn_strerror(errno));
	return rc;
}

static ssize_t tcp_write(struct conn *c, const void *buf, size_t len)
{
	ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
	if (n >= 0)
		return n;
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
		c->want = CONN_WANT_WRITE;
		return -EAGAIN;
	}
	int rc = -errno;
	snprintf(c->err, sizeof(c->err), "%s", conn_strerror(errno));
	return rc;
}

static int tcp_flush(struct conn *c)
{
	(void)c;
	return 0;
}

static bool tcp_pending(struct conn *c)
{
	(void)c;
	return false;
}

static int tcp_shutdown(struct conn *c)
{
	shutdown(c->fd, SHUT_WR);
	return 0;
}

static void tcp_free(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}


static int tcp_peer_host(struct conn *c, char *err, size_t errlen)
{
	(void)c;
	snprintf(err, errlen, "a plain tcp connection carries no host identity");
	return -ENOTSUP;
}

static void tcp_set_key_update(struct conn *c, uint64_t bytes, _Atomic uint64_t *count)
{
	(void)c;
	(void)bytes;
	(void)count;
}

static const struct conn_type conn_type_tcp = {
	.name = "tcp",
	.handshake = tcp_handshake,
	.read = tcp_read,
	.write = tcp_write,
	.flush = tcp_flush,
	.pending = tcp_pending,
	.shutdown = tcp_shutdown,
	.peer_host = tcp_peer_host,
	.set_key_update = tcp_set_key_update,
	.free = tcp_free,
};

void conn_init(struct conn *c, const struct conn_type *type, int fd)
{
	c->type = type;
	c->fd = fd;
	conn_sockname(fd, false, c->peer_addr, sizeof(c->peer_addr));
}

struct conn *conn_new_tcp(int fd)
{
	struct conn *c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return NULL;
	}
	conn_init(c, &conn_type_tcp, fd);
	return c;
}

void conn_free(struct conn *c)
{
	if (c)
		c->type->free(c);
}

/* ---- sockets ---- */

int conn_split_addr(const char *addr, char *host, size_t hostlen, int *port)
{
	const char *colon = strrchr(addr, ':');
	const char *h = addr;
	size_t hl;
	char *end;
	if (!colon || !colon[1])
		return -EINVAL;
	hl = (size_t)(colon - addr);
	if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl >= hostlen)
		return -EINVAL;
	long p = strtol(colon + 1, &end, 10);
	if (*end || p < 0 || p > 65535)
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = 0;
	*port = (int)p;
	return 0;
}

static int resolve(const char *addr, bool passive, struct addrinfo **out, char *err, size_t errlen)
{
	char host[256], port[16];
	int p;
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	if (conn_split_addr(addr, host, sizeof(host), &p)) {
		snprintf(err, errlen, "bad address '%s' (want host:port)", addr);
		return -EINVAL;
	}
	snprintf(port, sizeof(port), "%d", p);
	if (passive)
		hints.ai_flags = AI_PASSIVE;
	bool any = !host[0] || !strcmp(host, "*");
	int g = getaddrinfo(any ? NULL : host, port, &hints, out);
	if (g) {
		snprintf(err, errlen, "unable to resolve '%s': %s", addr, gai_strerror(g));
		return -EINVAL;
	}
	return 0;
}

int conn_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int conn_listen(const char *addr, int *fd_out, char *err, size_t errlen)
{
	struct addrinfo *ai, *a;
	int rc = resolve(addr, true, &ai, err, errlen);
	if (rc)
		return rc;
	rc = -EADDRNOTAVAIL;
	for (a = ai; a; a = a->ai_next) {
		int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		int one = 1;
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		conn_congestion(fd, a->ai_addr);
		if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 128) || conn_set_nonblock(fd)) {
			rc = -errno;
			close(fd);
			continue;
		}
		freeaddrinfo(ai);
		*fd_out = fd;
		return 0;
	}
	freeaddrinfo(ai);
	snprintf(err, errlen, "unable to listen on '%s': %s", addr, conn_strerror(-rc));
	return rc;
}

int conn_connect_start(const char *addr, char *err, size_t errlen)
{
	struct addrinfo *ai;
	int rc = resolve(addr, false, &ai, err, errlen);
	if (rc)
		return rc;
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
			ai->ai_protocol);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "unable to make a socket: %s", conn_strerror(errno));
		freeaddrinfo(ai);
		return rc;
	}
	conn_congestion(fd, ai->ai_addr);
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS) {
		rc = -errno;
		snprintf(err, errlen, "unable to connect to '%s': %s", addr, conn_strerror(errno));
		close(fd);
		freeaddrinfo(ai);
		return rc;
	}
	freeaddrinfo(ai);
	conn_tune(fd);
	return fd;
}

int conn_connect_result(int fd)
{
	int e = 0;
	socklen_t l = sizeof(e);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l))
		return -errno;
	return -e;
}

int conn_accept(int lfd, char *peer, size_t peerlen)
{
	int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0)
		return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? -EAGAIN : -errno;
	conn_tune(fd);
	if (peer)
		conn_sockname(fd, false, peer, peerlen);
	return fd;
}

void conn_sockname(int fd, bool local, char *out, size_t outlen)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	int r = local ? getsockname(fd, (struct sockaddr *)&ss, &l)
		      : getpeername(fd, (struct sockaddr *)&ss, &l);
	if (r) {
		snprintf(out, outlen, "?");
		return;
	}
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &s->sin_addr, ip, sizeof(ip));
		port = ntohs(s->sin_port);
		snprintf(out, outlen, "%s:%d", ip, port);
	} else if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof(ip));
		port = ntohs(s->sin6_port);
		snprintf(out, outlen, "[%s]:%d", ip, port);
	} else {
		snprintf(out, outlen, "?");
	}
}

/* Whether sa is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x). */
static bool is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	return false;
}

/* TCP_CONGESTION on every socket we listen on or dial on loopback, before
 * connect() or listen() (an accepted socket inherits its listener's; set
 * later, a BBR socket keeps BBR's pacing): CONN_TCP_CONGESTION, else
 * "reno" (which every user may set; cubic needs CAP_NET_ADMIN unless
 * net.ipv4.tcp_allowed_congestion_control lists it), else the kernel's.
 * Why: where the kernel's is BBR, it paces every socket with an hrtimer
 * per burst, and on loopback, with nothing to pace, a 16 MiB permute's
 * CPU on the 2-vCPU bench machine was 0.71-0.78x with cubic (issue 19,
 * bench/results/transport.md, tcp19). Sockets on any other address keep
 * the kernel's choice: on a real network it is the administrator's.
 * MESHRUN_TCP_CC=NAME picks another on loopback (an A/B hook; "kernel":
 * leave it). */
static void conn_congestion(int fd, const struct sockaddr *sa)
{
	const char *cc = getenv("MESHRUN_TCP_CC");
	if (!is_loopback(sa) || (cc && !strcmp(cc, "kernel")))
		return;
	if (!cc || !*cc)
		cc = CONN_TCP_CONGESTION;
	if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)))
		setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4);
}

/* TCP_NODELAY on every data socket. */
static void conn_tune(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}
