/* Getting a job onto the wire: the rendezvous (host 0 collects every
 * agent's Hello and answers with the Topology; agents dial it), then one
 * data link per host pair (the lower id dials, LinkHello both ways) and the
 * start-up barrier. Calls send.c, link.c and status.c in net/. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/net_int.h"
#include "net/tls.h"
#include "net/tls_conn.h"

static void start_links(struct net *n);
static void check_links(struct net *n);

/* ---- rendezvous: coordinator side ---- */

_Static_assert(sizeof(((struct net *)0)->config_hash) == WIRE_HASH_LEN, "config hash size");

/* Refuses one connection; the rendezvous goes on. */
void rdv_refuse_conn(struct link *l, const char *reason)
{
	struct net *n = l->net;
	status_log_refused(n, l->role == ROLE_COORD_IN ? "agent" : "link", l->addr, reason);
	l->refused = true;
	l->peer = -1;
	send_refuse(l, reason);
	link_begin_close(l, now_ns() + CLOSE_GRACE_NS);
}

/* A mismatch that no waiting can fix: refuse everyone and fail. */
static void rendezvous_fail(struct net *n, struct link *l, const char *reason)
{
	char msg[600];
	snprintf(msg, sizeof(msg), "rendezvous failed: %s", reason);
	rdv_refuse_conn(l, reason);
	for (int h = 1; h < n->num_hosts; h++) {
		struct link *o = n->peers[h].coord_in;
		if (o && o != l && o->state != LS_DEAD)
			send_refuse(o, msg);
	}
	link_fail_all(n, NET_ERR_REFUSED, -ECONNREFUSED, msg);
}

static void send_topology(struct net *n)
{
	Meshrun__HostInfo *infos = calloc((size_t)n->num_hosts, sizeof(*infos));
	Meshrun__HostInfo **ptrs = calloc((size_t)n->num_hosts, sizeof(*ptrs));
	if (!infos || !ptrs) {
		free(infos);
		free(ptrs);
		link_fail_all(n, NET_ERR, -ENOMEM, "out of memory sending the topology");
		return;
	}
	for (int h = 0; h < n->num_hosts; h++) {
		Meshrun__HostInfo init = MESHRUN__HOST_INFO__INIT;
		infos[h] = init;
		infos[h].host_id = (uint32_t)h;
		infos[h].data_address = n->peers[h].addr;
		infos[h].devices = n->peers[h].devices;
		ptrs[h] = &infos[h];
	}
	Meshrun__Topology t = MESHRUN__TOPOLOGY__INIT;
	t.n_hosts = (size_t)n->num_hosts;
	t.hosts = ptrs;
	t.job_id = n->job_id;
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	f.body_case = MESHRUN__FRAME__BODY_TOPOLOGY;
	f.topology = &t;
	for (int h = 1; h < n->num_hosts; h++) {
		struct link *l = n->peers[h].coord_in;
		if (!l)
			continue;
		link_send(l, &f);
		link_begin_close(l, now_ns() + sec_ns(n->connect_timeout_s));
	}
	free(infos);
	free(ptrs);
	n->topology_done = true;
	start_links(n);
}

void rdv_coord_on_hello(struct link *l, const Meshrun__Hello *h)
{
	struct net *n = l->net;
	char why[400];
	int id = (int)h->host_id;

	if (l->peer >= 0) {
		link_bad_frame(l, "second hello on one connection");
		return;
	}
	if (!tls_peer_is_host(l->c, id, why, sizeof(why))) {
		rdv_refuse_conn(l, why);
		return;
	}
	struct wire_self self = net_wire_self(n);
	struct wire_join j = { .topology_done = n->topology_done };
	if (id > 0 && id < n->num_hosts) {
		j.joined = n->peers[id].joined;
		j.joined_from = n->peers[id].coord_in ? n->peers[id].coord_in->addr : NULL;
	}
	int rc = wire_check_hello(&self, &j, h, why, sizeof(why));
	if (rc == -EINVAL) {
		rendezvous_fail(n, l, why);
		return;
	}
	if (rc) {
		rdv_refuse_conn(l, why);
		return;
	}
	l->peer = id;
	l->deadline_ns = 0;
	n->peers[id].joined = true;
	n->peers[id].coord_in = l;
	n->peers[id].devices = h->devices;
	snprintf(n->peers[id].addr, sizeof(n->peers[id].addr), "%s", h->data_address);
	n->joined++;
	if (n->joined == n->num_hosts)
		send_topology(n);
}

/* "2, 5" for the host ids with (or, !joined, without) a hello so far. */
static void hosts_text(const struct net *n, bool joined, char *out, size_t len)
{
	size_t used = 0;
	int count = 0;
	out[0] = 0;
	for (int h = 0; h < n->num_hosts && used < len; h++) {
		if (n->peers[h].joined != joined)
			continue;
		if (count++ == 16) {
			snprintf(out + used, len - used, ", ...");
			break;
		}
		used += (size_t)snprintf(out + used, len - used, "%s%d", used ? ", " : "", h);
	}
}

void rdv_timeout(struct net *n, char *msg, size_t len)
{
	double t = n->connect_timeout_s;
	if (n->host_id != 0) {
		/* the coordinator's verdict did not come: it is the one missing */
		snprintf(msg, len, "rendezvous timed out after %g s: no topology from the coordinator "
			 "at %.200s%s%.200s%s", t + RDV_AGENT_GRACE_S, n->coordinator,
			 n->coord_err[0] ? " (last error: " : "", n->coord_err,
			 n->coord_err[0] ? ")" : "");
		return;
	}
	char missing[160], here[160];
	hosts_text(n, false, missing, sizeof(missing));
	hosts_text(n, true, here, sizeof(here));
	int used = snprintf(msg, len, "rendezvous timed out after %g s: host%s %s never said hello "
			    "to the coordinator at %.200s (here: host%s %s)", t,
			    strchr(missing, ',') ? "s" : "", missing, n->coordinator,
			    strchr(here, ',') ? "s" : "", here);
	/* a host that tried and was turned away says why it is missing */
	if (n->last_refused[0] && used > 0 && (size_t)used < len)
		snprintf(msg + used, len - (size_t)used, "; the last refused: %s", n->last_refused);
	/* every host that is here hears who is missing, as a timeout */
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Abort a = MESHRUN__ABORT__INIT;
	a.host_id = 0;
	a.reason = msg;
	a.code = ETIMEDOUT;
	f.body_case = MESHRUN__FRAME__BODY_ABORT;
	f.abort = &a;
	for (int h = 1; h < n->num_hosts; h++) {
		struct link *l = n->peers[h].coord_in;
		if (l && l->state != LS_DEAD)
			link_send(l, &f);
	}
}

void rdv_coord_on_abort(struct link *l, const Meshrun__Abort *a)
{
	struct net *n = l->net;
	char why[600], text[480];
	snprintf(why, sizeof(why), "the coordinator (%s) ended the rendezvous: %s", l->addr,
		 wire_peer_text(a->reason, text, sizeof(text)));
	link_kill(l);
	link_fail_all(n, wire_done_status(a->code), -ECONNABORTED, why);
}

bool rdv_handshake_failed(struct link *l, int rc, const char *err)
{
	struct net *n = l->net;
	char msg[512];
	if (l->was_up || (l->role != ROLE_COORD_OUT && l->role != ROLE_LINK_OUT) ||
	    (l->role == ROLE_COORD_OUT && n->topology_done))
		return false;
	if (rc == -EKEYREJECTED || rc == -EPROTO) {
		/* nobody was lost: a certificate or the address is wrong */
		if (l->role == ROLE_COORD_OUT)
			snprintf(msg, sizeof(msg), "the coordinator at %s: %s%s", l->addr, err,
				 rc == -EKEYREJECTED ? " (are certs_dir's ca.pem and host certificate this cluster's?)"
						     : " (is a meshrun coordinator listening there?)");
		else
			snprintf(msg, sizeof(msg), "host %d at %s: %s", l->peer, l->addr, err);
		link_kill(l);
		link_fail_all(n, NET_ERR_TLS, rc, msg);
		return true;
	}
	if (l->role == ROLE_COORD_OUT && !n->topology_done) {
		/* closed during the handshake: tried again until the deadline */
		snprintf(n->coord_err, sizeof(n->coord_err), "%s", err);
		n->coord_retry_at = now_ns() + RETRY_NS;
		link_kill(l);
		return true;
	}
	return false;
}

/* ---- rendezvous: agent side ---- */

void rdv_send_hello(struct link *l)
{
	struct net *n = l->net;
	char addr[200], lhost[128], dhost[128];
	int lport, dport;

	/* a wildcard listener reports the address we reach the coordinator from */
	snprintf(addr, sizeof(addr), "%s", n->data_addr);
	if (!conn_split_addr(n->data_addr, dhost, sizeof(dhost), &dport) &&
	    (!strcmp(dhost, "0.0.0.0") || !strcmp(dhost, "::") || !dhost[0])) {
		char local[160];
		conn_sockname(l->c->fd, true, local, sizeof(local));
		if (!conn_split_addr(local, lhost, sizeof(lhost), &lport))
			snprintf(addr, sizeof(addr), strchr(lhost, ':') ? "[%s]:%d" : "%s:%d",
				 lhost, dport);
	}
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__Hello h = MESHRUN__HELLO__INIT;
	h.host_id = (uint32_t)n->host_id;
	h.num_hosts = (uint32_t)n->num_hosts;
	h.devices = (uint32_t)n->devices_per_host;
	h.data_address = addr;
	h.config_hash.data = n->config_hash;
	h.config_hash.len = sizeof(n->config_hash);
	h.version = (char *)NET_VERSION;
	f.body_case = MESHRUN__FRAME__BODY_HELLO;
	f.hello = &h;
	link_send(l, &f);
}

void rdv_agent_on_topology(struct link *l, const Meshrun__Topology *t)
{
	struct net *n = l->net;
	char msg[400];
	struct wire_self self = net_wire_self(n);
	if (wire_check_topology(&self, t, msg, sizeof(msg))) {
		link_fail_all(n, NET_ERR, -EPROTO, msg);
		return;
	}
	for (size_t i = 0; i < t->n_hosts; i++) {
		const Meshrun__HostInfo *h = t->hosts[i];
		snprintf(n->peers[i].addr, sizeof(n->peers[i].addr), "%s", h->data_address);
		n->peers[i].devices = h->devices;
	}
	n->job_id = t->job_id;
	n->topology_done = true;
	link_begin_close(l, now_ns() + CLOSE_GRACE_NS);
	start_links(n);
}

/* ---- data links: dialing, set-up, the start-up barrier ---- */

/* Every link's TLS connection, dialed or accepted, has the records
 * configured (tls_records) and renews its sending key as configured. NULL on allocation failure. */
struct conn *rdv_conn_new(struct net *n, int fd, bool server)
{
	struct conn *c = tls_conn_new(n->ctx, fd, server);
	if (c) {
		tls_conn_set_records(c, !n->openssl_records, n->max_send, n->tls_cipher);
		conn_set_key_update(c, n->key_update_bytes, &n->key_updates);
	}
	return c;
}

void rdv_dial_addr(struct net *n, enum link_role role, int peer, int stream, const char *addr)
{
	char err[256];
	int fd = conn_connect_start(addr, err, sizeof(err));
	if (fd < 0) {
		snprintf(n->coord_err, sizeof(n->coord_err), "%s", err);
		if (role == ROLE_COORD_OUT)
			n->coord_retry_at = now_ns() + RETRY_NS;
		else
			n->peers[peer].retry_at[stream] = now_ns() + RETRY_NS;
		return;
	}
	struct conn *c = rdv_conn_new(n, fd, false);
	struct link *l = c ? link_new(n, role, c, peer, addr) : NULL;
	if (!l) {
		link_fail_all(n, NET_ERR, -ENOMEM, "out of memory opening a connection");
		return;
	}
	link_set_state(l, LS_CONNECTING);
	l->write_armed = true;
	l->stream = stream;
	event_add(l->ev_write, NULL);
	if (role == ROLE_COORD_OUT)
		n->coord = l;
	else
		n->peers[peer].l[stream] = l;
}

void rdv_dial(struct net *n, int peer, int stream)
{
	n->peers[peer].retry_at[stream] = 0;
	rdv_dial_addr(n, ROLE_LINK_OUT, peer, stream, n->peers[peer].addr);
}

static void start_links(struct net *n)
{
	n->phase = PH_LINKS;
	if (n->ev_data_l)
		event_add(n->ev_data_l, NULL);
	for (int h = n->host_id + 1; h < n->num_hosts; h++)
		for (int k = 0; k < n->nstreams; k++)
			rdv_dial(n, h, k);
	check_links(n);
}

void rdv_check_barrier(struct net *n)
{
	if (n->phase != PH_BARRIER)
		return;
	for (int h = 0; h < n->num_hosts; h++)
		if (h != n->host_id && !n->peers[h].barrier_rx)
			return;
	n->phase = PH_RUNNING;
	status_set_ready(n);
}

static void check_links(struct net *n)
{
	if (n->phase != PH_LINKS)
		return;
	for (int h = 0; h < n->num_hosts; h++)
		for (int k = 0; k < n->nstreams && h != n->host_id; k++)
			if (!n->peers[h].l[k] || n->peers[h].l[k]->state != LS_UP)
				return;
	/* every link is up: no one else may dial us, unless links recover
	 * (a broken link's peer redials this listener) */
	if (n->ev_data_l && !n->replay_cap) {
		event_free(n->ev_data_l);
		n->ev_data_l = NULL;
	}
	if (n->data_lfd >= 0 && !n->replay_cap) {
		close(n->data_lfd);
		n->data_lfd = -1;
	}
	n->phase = PH_BARRIER;
	for (int h = 0; h < n->num_hosts; h++) {
		struct link *l = n->peers[h].l[0];
		if (h == n->host_id)
			continue;
		link_lock(l);
		send_simple(l, MESHRUN__FRAME__BODY_BARRIER);
		link_unlock(l);
	}
	rdv_check_barrier(n);
}

void rdv_link_up(struct link *l, int peer)
{
	struct net *n = l->net;
	l->peer = peer;
	l->pinned = true;
	link_set_state(l, LS_UP);
	l->was_up = true;
	l->last_rx_ns = l->last_hb_ns = now_ns();
	n->peers[peer].l[l->stream] = l;
	/* device threads reach it from now on (and it is never freed
	 * before net_free) */
	atomic_store_explicit(&n->peers[peer].dl[l->stream], l, memory_order_release);
	char sec[sizeof(n->security)];
	tls_conn_describe(l->c, sec, sizeof(sec));
	pthread_mutex_lock(&n->mu);
	if (!n->security[0])
		memcpy(n->security, sec, sizeof(sec));
	pthread_mutex_unlock(&n->mu);
	check_links(n);
}

/* ---- recovery: redialing and resuming a broken link ---- */

/* The resumed link is UP again: resend what the peer lacks, then go on. */
static void resumed_up(struct link *l, uint64_t peer_last)
{
	struct net *n = l->net;
	uint64_t now = now_ns();
	link_replay_from(l, peer_last);
	unsigned resend = 0;
	uint64_t bytes = 0;
	for (struct ctrl_frame *c = l->rp_next; c; c = c->next) {
		resend++;
		bytes += c->len + c->pay_len;
	}
	link_set_state(l, LS_UP);
	l->last_rx_ns = l->last_hb_ns = now;
	l->deadline_ns = 0;
	l->retry_delay_ns = REDIAL_MIN_NS;
	atomic_fetch_add_explicit(&n->reconnects, 1, memory_order_relaxed);
	status_log(n, "link to host %d (%s) resumed after %.0f ms: resending %u frames (%llu bytes)",
		   l->peer, l->addr, (double)(now - l->broken_at_ns) / 1e6, resend,
		   (unsigned long long)bytes);
	link_arm_write(l);
	/* records may already sit in OpenSSL's buffer: the net thread reads
	 * them and writes the resend (recv_defer_cb), then the stream thread
	 * takes the link */
	event_active(l->ev_defer, EV_READ, 0);
}

void rdv_redial(struct link *l)
{
	struct net *n = l->net;
	char err[256];
	int fd = conn_connect_start(l->addr, err, sizeof(err));
	if (fd < 0) {
		l->retry_at_ns = now_ns() + l->retry_delay_ns;
		l->retry_delay_ns = l->retry_delay_ns * 2 > REDIAL_MAX_NS ? REDIAL_MAX_NS
									   : l->retry_delay_ns * 2;
		return;
	}
	struct conn *c = rdv_conn_new(n, fd, false);
	if (!c || link_attach_conn(l, c)) {
		l->retry_at_ns = now_ns() + l->retry_delay_ns;
		return;
	}
	link_set_state(l, LS_RECONNECTING);
	/* an attempt that stalls is given up for the next one */
	double t = n->connect_timeout_s < 5 ? n->connect_timeout_s : 5;
	l->deadline_ns = now_ns() + sec_ns(t);
	link_arm_write(l);
}

void rdv_link_resumed(struct link *l, const Meshrun__LinkHello *h)
{
	struct net *n = l->net;
	char why[300];
	struct wire_self self = net_wire_self(n);
	if (wire_check_link_answer(&self, l->peer, l->addr, (unsigned)l->stream, true, h, why,
				   sizeof(why)) ||
	    wire_check_resume_seq(h->host_id, h->last_seq, l->tx_seq, why, sizeof(why))) {
		status_log(n, "%s", why);
		link_conn_failed(l, -EPROTO, why);
		return;
	}
	resumed_up(l, h->last_seq);
}

/* A redial from host id that passed the checks (job id, identity, a link
 * that can resume): its connection replaces the link's broken one.
 * Nothing before this touches the link it claims. */
static void resume_accepted_locked(struct link *t, struct link *l, const Meshrun__LinkHello *h);

static void resume_accepted(struct link *t, int id, const Meshrun__LinkHello *h)
{
	struct link *l = t->net->peers[id].l[h->stream];
	link_lock(l);
	resume_accepted_locked(t, l, h);
	link_unlock(l);
}

static void resume_accepted_locked(struct link *t, struct link *l, const Meshrun__LinkHello *h)
{
	if (l->state == LS_UP && !link_break(l, "the peer redialed")) {
		rdv_refuse_conn(t, "this link cannot be resumed now");
		return;
	}
	/* the connection moves; the temporary link dies without it */
	struct conn *c = t->c;
	event_del(t->ev_read);
	event_del(t->ev_resume);
	link_disarm_write(t);
	t->c = NULL;
	link_kill(t);
	if (link_attach_conn(l, c)) {
		link_lost(l, -ENOMEM, "out of memory resuming the link");
		return;
	}
	link_set_state(l, LS_HELLO);
	if (send_resume_hello(l)) {
		link_lost(l, -ENOMEM, "out of memory resuming the link");
		return;
	}
	resumed_up(l, h->last_seq);
}

void rdv_accept_link_hello(struct link *l, const Meshrun__LinkHello *h)
{
	struct net *n = l->net;
	char why[400];
	int id = (int)h->host_id;
	struct wire_self self = net_wire_self(n);
	if (wire_check_link_hello(&self, h, why, sizeof(why))) {
		rdv_refuse_conn(l, why);
		return;
	}
	if (!tls_peer_is_host(l->c, id, why, sizeof(why))) {
		rdv_refuse_conn(l, why);
		return;
	}
	const struct link *o = n->peers[id].l[h->stream];
	struct wire_link_view v = {
		.exists = o != NULL,
		.resumable = n->replay_cap && o && o->was_up &&
			     (o->state == LS_UP || o->state == LS_BROKEN),
		.tx_seq = o ? o->tx_seq : 0,
	};
	if (wire_check_link_join(&v, h, why, sizeof(why))) {
		rdv_refuse_conn(l, why);
		return;
	}
	if (h->resume) {
		resume_accepted(l, id, h);
		return;
	}
	l->stream = (int)h->stream;
	send_link_hello(l);
	rdv_link_up(l, id);
}
