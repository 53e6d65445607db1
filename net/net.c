/* The net thread's frame (see net/net.h): its lifecycle (net_new, start,
 * finish, abort, free), the commands other threads hand it and the tick
 * (heartbeats, timeouts, retries, deadlines). The links themselves are
 * net/link.c, send.c, recv.c and rendezvous.c; the xport hooks, by which
 * device threads write and read them directly, are net/direct.c.
 *
 * Every connection is a struct link driven by two libevent events on its
 * non-blocking socket (read always armed, write armed while output is
 * queued). Payloads are decrypted straight into the posted receive buffer
 * and encrypted straight from the send buffer (no evbuffer, no staging copy
 * of plaintext); only the ciphertext is batched, by the socket BIO of
 * net/tls_conn.c. Links are never freed inside their own callbacks:
 * link_kill() marks them dead and the reap event frees them. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/thread.h>
#include <openssl/rand.h>

#include "net/net_int.h"
#include "net/tls.h"

enum cmd_kind { CMD_FINISH, CMD_ABORT, CMD_STOP };

struct cmd {
	struct cmd *next;
	enum cmd_kind kind;
	int status;
	char msg[];
};

/* ---- commands from other threads ---- */

static void push_cmd(struct net *n, struct cmd *c)
{
	pthread_mutex_lock(&n->mu);
	if (n->cmd_tail)
		n->cmd_tail->next = c;
	else
		n->cmd_head = c;
	n->cmd_tail = c;
	pthread_mutex_unlock(&n->mu);
	event_active(n->ev_cmd, EV_READ, 0);
}

static struct cmd *cmd_new(enum cmd_kind kind, const char *msg)
{
	size_t ml = msg ? strlen(msg) + 1 : 1;
	struct cmd *c = calloc(1, sizeof(*c) + ml);
	if (c) {
		c->kind = kind;
		memcpy(c->msg, msg ? msg : "", ml);
	}
	return c;
}

static struct link *peer_link(struct net *n, int host)
{
	if (host < 0 || host >= n->num_hosts)
		return NULL;
	struct link *l = n->peers[host].l[0];
	if (l && l->was_up && l->state != LS_CLOSING && l->state != LS_DRAIN && l->state != LS_DEAD)
		return l;              /* up, or recovering: frames queue for it */
	return l && l->state == LS_UP ? l : NULL;
}

/* Writes what an UP link has queued (a heartbeat, a Done) now, from the
 * net thread; the lock held. */
static void write_up(struct link *l)
{
	if (l->state == LS_UP && l->want_write && !l->held && !l->conn_dead && !l->fault_close)
		recv_write(l);
}

static void begin_stop(struct net *n)
{
	n->stopping = true;
	n->stop_deadline_ns = now_ns() + CLOSE_GRACE_NS;
	for (struct link *l = n->links; l; l = l->next) {
		link_lock(l);
		link_begin_close(l, n->stop_deadline_ns);
		link_unlock(l);
	}
	if (n->ev_coord_l) {
		event_free(n->ev_coord_l);
		n->ev_coord_l = NULL;
	}
	event_active(n->ev_reap, EV_READ, 0);
}

static void cmd_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	(void)fd;
	(void)what;
	pthread_mutex_lock(&n->mu);
	struct cmd *c = n->cmd_head;
	n->cmd_head = n->cmd_tail = NULL;
	pthread_mutex_unlock(&n->mu);

	while (c) {
		struct cmd *next = c->next;
		int fs = status_failed(n);
		switch (c->kind) {
		case CMD_FINISH:
			if (fs)
				break;
			n->phase = PH_FINISHING;
			n->finish_deadline_ns = now_ns() + sec_ns(n->done_timeout_s);
			for (int h = 0; h < n->num_hosts; h++) {
				struct link *l = peer_link(n, h);
				if (!l)
					continue;
				link_lock(l);
				send_simple(l, MESHRUN__FRAME__BODY_DONE);
				write_up(l);
				link_unlock(l);
			}
			link_check_finish(n);
			break;
		case CMD_ABORT:
			link_fail_all(n, c->status, -ECANCELED, c->msg);
			break;
		case CMD_STOP:
			begin_stop(n);
			break;
		}
		free(c);
		c = next;
	}
}

/* ---- the tick: heartbeats, timeouts, retries, deadlines ---- */

static void missing_hosts(struct net *n, bool (*missing)(struct net *, int), char *out, size_t len)
{
	size_t used = 0;
	int count = 0;
	out[0] = 0;
	for (int h = 0; h < n->num_hosts && used < len; h++) {
		if (h == n->host_id || !missing(n, h))
			continue;
		if (count++ == 8) {
			used += snprintf(out + used, len - used, ", ...");
			break;
		}
		used += snprintf(out + used, len - used, "%s%d", used ? ", " : "", h);
	}
}

static bool no_link(struct net *n, int h)
{
	for (int k = 0; k < n->nstreams; k++) {
		struct link *l = n->peers[h].l[k];
		if (!l || l->state != LS_UP)
			return true;
	}
	return false;
}
static bool no_barrier(struct net *n, int h) { return !n->peers[h].barrier_rx; }
static bool no_done(struct net *n, int h) { return !n->peers[h].done_rx; }

static void phase_timeout(struct net *n)
{
	char hosts[200], msg[512];
	double t = n->connect_timeout_s;
	switch (n->phase) {
	case PH_RENDEZVOUS:
		rdv_timeout(n, msg, sizeof(msg));
		break;
	case PH_LINKS:
		missing_hosts(n, no_link, hosts, sizeof(hosts));
		snprintf(msg, sizeof(msg), "link set-up timed out after %g s: no link to hosts %s", t, hosts);
		break;
	default:
		missing_hosts(n, no_barrier, hosts, sizeof(hosts));
		snprintf(msg, sizeof(msg), "start-up barrier timed out after %g s: waiting for hosts %s",
			 t, hosts);
		break;
	}
	link_fail_all(n, NET_ERR_TIMEOUT, -ETIMEDOUT, msg);
}

/* A broken link (or one reconnecting): it fails the job when it has been
 * down reconnect_timeout_s, or its peer silent heartbeat_timeout_s; the
 * host that dialed it first redials when its backoff is over. false if
 * it failed. */
static bool tick_broken(struct net *n, struct link *l, uint64_t now)
{
	char msg[300];
	if (now - l->broken_at_ns > n->reconnect_timeout_ns) {
		snprintf(msg, sizeof(msg), "link down for %.0f s (it broke: %.200s)",
			 (double)(now - l->broken_at_ns) / 1e9, l->broken_why);
		link_lost(l, -ETIMEDOUT, msg);
		return false;
	}
	if (now - l->last_rx_ns > n->hb_timeout_ns) {
		snprintf(msg, sizeof(msg), "no heartbeat for %.1f s (its link broke: %.200s)",
			 (double)(now - l->last_rx_ns) / 1e9, l->broken_why);
		link_lost(l, -ETIMEDOUT, msg);
		return false;
	}
	if (l->state == LS_BROKEN && l->role == ROLE_LINK_OUT && now >= l->retry_at_ns)
		rdv_redial(l);
	return link_probe(l, now);
}

/* A link up that has heard nothing for link_silence_s (heartbeats come
 * every heartbeat_interval_s): its connection may be half-open (a path
 * that drops packets without a RST, a stale NAT entry). With recovery on,
 * the connection is dropped as after a reset: the lower id redials with a
 * fresh TLS connection (identity pinned, job id, last frame received),
 * the higher id waits for it and probes the peer's listener. A peer that
 * answers resumes with replay; one that does not (a stopped process whose
 * kernel still accepts) is lost at heartbeat_timeout_s as before, since
 * the break keeps last_rx_ns. false if it broke the link. */
static bool tick_silence(struct net *n, struct link *l, uint64_t now)
{
	char msg[200];
	if (!n->replay_cap || !l->was_up || l->peer < 0 || n->peers[l->peer].done_rx ||
	    (l->role != ROLE_LINK_OUT && l->role != ROLE_LINK_IN) ||
	    now - l->last_rx_ns <= n->silence_ns)
		return true;
	snprintf(msg, sizeof(msg), "heard nothing for %.1f s (link_silence_s): taken for half-open",
		 (double)(now - l->last_rx_ns) / 1e9);
	link_conn_failed(l, -ETIMEDOUT, msg);
	return false;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	char msg[200];
	(void)fd;
	(void)what;

	status_flush_refused(n, false);
	uint64_t now = now_ns();
	for (struct link *l = n->links; l; l = l->next) {
		link_lock(l);
		/* other threads stamp last_rx_ns: the clock is read under the lock */
		now = now_ns();
		switch (l->state) {
		case LS_UP:
			if (l->peer >= 0 && !n->peers[l->peer].done_rx &&
			    now - l->last_rx_ns > n->hb_timeout_ns) {
				snprintf(msg, sizeof(msg), "no heartbeat for %.1f s",
					 (double)(now - l->last_rx_ns) / 1e9);
				link_lost(l, -ETIMEDOUT, msg);
				break;
			}
			if (!tick_silence(n, l, now))
				break;
			if (now - l->last_hb_ns >= n->hb_interval_ns) {
				l->last_hb_ns = now;
				if (!l->hb_queued)
					send_simple(l, MESHRUN__FRAME__BODY_HEARTBEAT);
			}
			/* an idle link still acknowledges what it got */
			if (n->replay_cap)
				link_send_ack(l);
			/* a RecvReady nobody's wait sent, and a linger the
			 * stream thread missed */
			if (atomic_load_explicit(&l->rr_pending, memory_order_relaxed))
				send_rr_flush(l);
			if (l->lingering && !l->pollers && now > l->linger_ns + LINGER_LAPSE_NS) {
				l->lingering = false;
				atomic_fetch_sub(&n->lingering, 1);
				atomic_fetch_add_explicit(&n->linger_lapses, 1, memory_order_relaxed);
			}
			write_up(l);
			break;
		case LS_BROKEN:
		case LS_RECONNECTING:
			tick_broken(n, l, now);
			break;
		case LS_HANDSHAKE:
		case LS_HELLO:
			if (l->was_up && !tick_broken(n, l, now))
				break;
			if (l->deadline_ns && now > l->deadline_ns)
				link_conn_failed(l, -ETIMEDOUT, "no hello in time");
			break;
		case LS_CLOSING:
		case LS_DRAIN:
			if (now > l->deadline_ns)
				link_kill(l);
			break;
		default:
			break;
		}
		link_unlock(l);
	}
	if (n->stopping) {
		if (now > n->stop_deadline_ns)
			for (struct link *l = n->links; l; l = l->next) {
				link_lock(l);
				link_kill(l);
				link_unlock(l);
			}
		return;
	}
	switch (n->phase) {
	case PH_RENDEZVOUS:
	case PH_LINKS:
	case PH_BARRIER:
		if (now > n->phase_deadline_ns) {
			phase_timeout(n);
			return;
		}
		if (n->phase == PH_RENDEZVOUS && n->host_id != 0 && !n->coord && n->coord_retry_at &&
		    now >= n->coord_retry_at) {
			n->coord_retry_at = 0;
			rdv_dial_addr(n, ROLE_COORD_OUT, 0, 0, n->coordinator);
		}
		if (n->phase == PH_LINKS)
			for (int h = n->host_id + 1; h < n->num_hosts; h++)
				for (int k = 0; k < n->nstreams; k++)
					if (!n->peers[h].l[k] && n->peers[h].retry_at[k] &&
					    now >= n->peers[h].retry_at[k])
						rdv_dial(n, h, k);
		break;
	case PH_FINISHING:
		link_check_finish(n);
		if (n->phase == PH_FINISHING && now > n->finish_deadline_ns) {
			char hosts[200], m2[400];
			missing_hosts(n, no_done, hosts, sizeof(hosts));
			snprintf(m2, sizeof(m2), "timed out after %g s waiting for hosts %s to finish",
				 n->done_timeout_s, hosts);
			link_fail_all(n, NET_ERR_TIMEOUT, -ETIMEDOUT, m2);
		}
		break;
	default:
		break;
	}
}

/* ---- the xport ---- */

void net_set_xport(struct net *n, struct xport *x)
{
	n->x = x;
}

/* ---- lifecycle ---- */

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;

static void evthread_init(void)
{
	evthread_rc = evthread_use_pthreads();
}

static void *net_thread(void *arg)
{
	struct net *n = arg;
	pthread_setname_np(pthread_self(), "mr-net");
	event_base_loop(n->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

struct net *net_new(const struct net_params *p, int *status, char *err, size_t errlen)
{
	struct net *n;
	char why[300];

	*status = NET_ERR;
	pthread_once(&evthread_once, evthread_init);
	if (evthread_rc) {
		snprintf(err, errlen, "net: libevent has no pthread support");
		return NULL;
	}
	n = calloc(1, sizeof(*n));
	if (!n) {
		snprintf(err, errlen, "net: out of memory");
		return NULL;
	}
	/* the inherited sockets are ours from here on, even on failure */
	n->data_lfd = p->data_fd;
	n->coord_lfd = p->host_id == 0 ? p->coord_fd : -1;
	if (p->host_id != 0 && p->coord_fd >= 0)
		close(p->coord_fd);
	n->host_id = p->host_id;
	n->num_hosts = p->num_hosts;
	n->devices_per_host = p->devices_per_host;
	snprintf(n->coordinator, sizeof(n->coordinator), "%s", p->coordinator ? p->coordinator : "");
	snprintf(n->listen, sizeof(n->listen), "%s", p->listen ? p->listen : "");
	snprintf(n->certs_dir, sizeof(n->certs_dir), "%s", p->certs_dir ? p->certs_dir : ".");
	n->hb_interval_ns = sec_ns(p->heartbeat_interval_s);
	n->hb_timeout_ns = sec_ns(p->heartbeat_timeout_s);
	n->silence_ns = p->link_silence_s > 0 ? sec_ns(p->link_silence_s)
					      : sec_ns(0.4 * p->heartbeat_timeout_s);
	n->connect_timeout_s = p->connect_timeout_s;
	n->done_timeout_s = p->done_timeout_s;
	memcpy(n->config_hash, p->config_hash, sizeof(n->config_hash));
	n->log = p->log;
	n->log_ctx = p->log_ctx;
	n->fault = p->fault;
	n->fault_ctx = p->fault_ctx;
	if (p->faults)
		n->faults = *p->faults;
	n->link_cb = recv_event_cb;
	n->defer_cb = recv_defer_cb;
	n->stream_cb = recv_stream_cb;
	n->stream_tick = recv_stream_tick;
	n->poll_spin_ns = p->poll_spin_us * 1000ull;
	n->max_send = p->max_send_bytes ? (size_t)p->max_send_bytes : NET_MAX_SEND_DEFAULT;
	n->p2p_handoff = (size_t)p->p2p_handoff_bytes;
	n->openssl_records = p->openssl_records;
	n->tls_cipher = p->tls_cipher;
	n->notsent_lowat = p->notsent_lowat_bytes > INT_MAX ? INT_MAX : (int)p->notsent_lowat_bytes;
	n->lim.max_payload = p->max_frame_bytes;
	n->key_update_bytes = p->key_update_bytes;
	n->replay_cap = p->replay_buffer_bytes;
	n->reconnect_timeout_ns = sec_ns(p->reconnect_timeout_s > 0 ? p->reconnect_timeout_s : 30);
	pthread_mutex_init(&n->mu, NULL);
	pthread_mutex_init(&n->fault_mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&n->cv, &ca);
	pthread_condattr_destroy(&ca);

	n->peers = calloc((size_t)(n->num_hosts > 0 ? n->num_hosts : 1), sizeof(*n->peers));
	n->base = event_base_new();
	if (!n->peers || !n->base) {
		snprintf(err, errlen, "net: out of memory");
		goto out_free;
	}
	n->ev_cmd = event_new(n->base, -1, EV_READ | EV_PERSIST, cmd_cb, n);
	n->ev_tick = event_new(n->base, -1, EV_PERSIST, tick_cb, n);
	n->ev_reap = event_new(n->base, -1, EV_READ | EV_PERSIST, link_reap_cb, n);
	if (!n->ev_cmd || !n->ev_tick || !n->ev_reap) {
		snprintf(err, errlen, "net: out of memory");
		goto out_free;
	}
	if (n->num_hosts > 1) {
		if (stream_start(n, p->link_streams > 0 ? p->link_streams : 1, err, errlen))
			goto out_free;
		n->ctx = tls_ctx_new(n->certs_dir, n->host_id, err, errlen);
		if (!n->ctx) {
			*status = NET_ERR_CONFIG;
			goto out_free;
		}
		/* the link listener exists before the Hello names its port */
		if (n->data_lfd >= 0) {
			conn_set_nonblock(n->data_lfd);
		} else if (conn_listen(n->listen, &n->data_lfd, why, sizeof(why))) {
			snprintf(err, errlen, "net: link listener: %s", why);
			*status = NET_ERR_CONFIG;
			goto out_free;
		}
		conn_sockname(n->data_lfd, true, n->data_addr, sizeof(n->data_addr));
		n->ev_data_l = event_new(n->base, n->data_lfd, EV_READ | EV_PERSIST, recv_accept_cb, n);
		if (n->host_id == 0) {
			if (n->coord_lfd >= 0) {
				conn_set_nonblock(n->coord_lfd);
			} else if (conn_listen(n->coordinator, &n->coord_lfd, why, sizeof(why))) {
				snprintf(err, errlen, "net: coordinator listener: %s", why);
				*status = NET_ERR_CONFIG;
				goto out_free;
			}
			n->ev_coord_l = event_new(n->base, n->coord_lfd, EV_READ | EV_PERSIST, recv_accept_cb, n);
		}
	}
	*status = NET_OK;
	return n;

out_free:
	net_free(n);
	return NULL;
}

/* Runs on the net thread once the loop starts. */
static void start_cb(evutil_socket_t fd, short what, void *arg)
{
	struct net *n = arg;
	(void)fd;
	(void)what;
	n->phase_deadline_ns = now_ns() + sec_ns(n->connect_timeout_s) +
			       (n->host_id ? sec_ns(RDV_AGENT_GRACE_S) : 0);
	if (n->num_hosts == 1) {
		n->phase = PH_RUNNING;
		status_set_ready(n);
		return;
	}
	n->phase = PH_RENDEZVOUS;
	if (n->host_id == 0) {
		uint64_t id;
		RAND_bytes((unsigned char *)&id, sizeof(id));
		n->job_id = id;
		n->peers[0].joined = true;
		n->peers[0].devices = (uint32_t)n->devices_per_host;
		char h[128];
		int port, cport;
		/* a wildcard link listener is reached at the coordinator's host */
		if (!conn_split_addr(n->data_addr, h, sizeof(h), &port) &&
		    (!strcmp(h, "0.0.0.0") || !strcmp(h, "::")) &&
		    !conn_split_addr(n->coordinator, h, sizeof(h), &cport))
			snprintf(n->peers[0].addr, sizeof(n->peers[0].addr),
				 strchr(h, ':') ? "[%s]:%d" : "%s:%d",
				 h[0] && strcmp(h, "0.0.0.0") ? h : "127.0.0.1", port);
		else
			snprintf(n->peers[0].addr, sizeof(n->peers[0].addr), "%s", n->data_addr);
		n->joined = 1;
		event_add(n->ev_coord_l, NULL);
	} else {
		rdv_dial_addr(n, ROLE_COORD_OUT, 0, 0, n->coordinator);
	}
}

int net_start(struct net *n, char *err, size_t errlen)
{
	struct timeval tv = { .tv_sec = 0, .tv_usec = TICK_MS * 1000 };
	event_add(n->ev_cmd, NULL);
	event_add(n->ev_reap, NULL);
	event_add(n->ev_tick, &tv);
	if (event_base_once(n->base, -1, EV_TIMEOUT, start_cb, n, NULL)) {
		snprintf(err, errlen, "net: unable to start");
		return NET_ERR;
	}
	if (pthread_create(&n->thread, NULL, net_thread, n)) {
		snprintf(err, errlen, "net: unable to start the network thread");
		return NET_ERR;
	}
	n->thread_started = true;
	pthread_mutex_lock(&n->mu);
	while (!n->ready && !n->status)
		pthread_cond_wait(&n->cv, &n->mu);
	int s = n->status;
	if (s)
		snprintf(err, errlen, "%s", n->msg);
	pthread_mutex_unlock(&n->mu);
	return s;
}

int net_finish(struct net *n, char *err, size_t errlen)
{
	struct cmd *c = cmd_new(CMD_FINISH, NULL);
	if (!c) {
		snprintf(err, errlen, "net: out of memory");
		return NET_ERR;
	}
	push_cmd(n, c);
	pthread_mutex_lock(&n->mu);
	while (!n->closed && !n->status)
		pthread_cond_wait(&n->cv, &n->mu);
	int s = n->status;
	if (s)
		snprintf(err, errlen, "%s", n->msg);
	pthread_mutex_unlock(&n->mu);
	return s;
}

void net_abort(struct net *n, int status, const char *msg)
{
	struct cmd *c = n->thread_started ? cmd_new(CMD_ABORT, msg) : NULL;
	if (!c)
		status_record(n, status, msg);
	else
		c->status = status;
	/* queued before the xport wakes anyone: a sibling device that fails
	 * because of this abort queues its own after it, and the first
	 * failure recorded is this one */
	if (c)
		push_cmd(n, c);
	if (n->x)
		xport_fail(n->x, -ECANCELED, msg);
}

int net_failed(struct net *n, char *err, size_t errlen)
{
	pthread_mutex_lock(&n->mu);
	int s = n->status;
	if (s && err)
		snprintf(err, errlen, "%s", n->msg);
	pthread_mutex_unlock(&n->mu);
	return s;
}

uint64_t net_bytes_sent(struct net *n)
{
	return atomic_load_explicit(&n->bytes_sent, memory_order_relaxed);
}

uint64_t net_reconnects(struct net *n)
{
	return n ? atomic_load_explicit(&n->reconnects, memory_order_relaxed) : 0;
}

uint64_t net_reads_before_send(struct net *n)
{
	return n ? atomic_load_explicit(&n->reads_before_send, memory_order_relaxed) : 0;
}

uint64_t net_polls_read_first(struct net *n)
{
	return n ? atomic_load_explicit(&n->polls_read_first, memory_order_relaxed) : 0;
}

uint64_t net_handoffs(struct net *n)
{
	return n ? atomic_load_explicit(&n->handoffs, memory_order_relaxed) : 0;
}

uint64_t net_linger_lapses(struct net *n)
{
	return n ? atomic_load_explicit(&n->linger_lapses, memory_order_relaxed) : 0;
}

uint64_t net_frames_resent(struct net *n)
{
	return n ? atomic_load_explicit(&n->frames_resent, memory_order_relaxed) : 0;
}

void net_link_security(struct net *n, char *buf, size_t len)
{
	pthread_mutex_lock(&n->mu);
	snprintf(buf, len, "%s", n->security);
	pthread_mutex_unlock(&n->mu);
}

uint64_t net_key_updates(struct net *n)
{
	return atomic_load_explicit(&n->key_updates, memory_order_relaxed);
}

void net_free(struct net *n)
{
	if (!n)
		return;
	if (n->thread_started) {
		struct cmd *c = cmd_new(CMD_STOP, NULL);
		if (c)
			push_cmd(n, c);
		else
			event_base_loopbreak(n->base);
		pthread_join(n->thread, NULL);
	}
	/* the stream threads first: they may still hold a link */
	stream_stop(n);
	status_flush_refused(n, true);
	while (n->links) {
		struct link *l = n->links;
		n->links = l->next;
		if (l->state != LS_DEAD)
			link_set_state(l, LS_DEAD);
		link_release_reqs(l, -ECANCELED);
		link_free(l);
	}
	while (n->pinned) {
		struct link *l = n->pinned;
		n->pinned = l->next;
		link_free(l);
	}
	while (n->cmd_head) {
		struct cmd *c = n->cmd_head;
		n->cmd_head = c->next;
		free(c);
	}
	if (n->ev_cmd)
		event_free(n->ev_cmd);
	if (n->ev_tick)
		event_free(n->ev_tick);
	if (n->ev_reap)
		event_free(n->ev_reap);
	if (n->ev_coord_l)
		event_free(n->ev_coord_l);
	if (n->ev_data_l)
		event_free(n->ev_data_l);
	if (n->coord_lfd >= 0)
		close(n->coord_lfd);
	if (n->data_lfd >= 0)
		close(n->data_lfd);
	if (n->base)
		event_base_free(n->base);
	tls_ctx_free(n->ctx);
	free(n->peers);
	pthread_mutex_destroy(&n->mu);
	pthread_mutex_destroy(&n->fault_mu);
	pthread_cond_destroy(&n->cv);
	free(n);
}