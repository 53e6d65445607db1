/* What the net thread shares with the control thread (ready, closed, the
 * first failure, under n->mu) and how it speaks to the operator (log lines,
 * the operation in progress for failure messages). Calls nothing else in
 * net/. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "net/net_int.h"

void status_log(struct net *n, const char *fmt, ...)
{
	char line[768];
	int used = snprintf(line, sizeof(line), "host %d: ", n->host_id);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + used, sizeof(line) - (size_t)used, fmt, ap);
	va_end(ap);
	if (n->log)
		n->log(n->log_ctx, line);
	else
		fprintf(stderr, "meshrun: %s\n", line);
}

/* The source of addr: its host part ("127.0.0.1:5000" -> "127.0.0.1",
 * "[::1]:5000" -> "::1"). */
static void source_of(const char *addr, char *out, size_t len)
{
	const char *colon = strrchr(addr, ':');
	size_t n = colon && strchr(addr, ':') == colon ? (size_t)(colon - addr) : strlen(addr);
	if (addr[0] == '[' && strchr(addr, ']'))
		snprintf(out, len, "%.*s", (int)(strchr(addr, ']') - addr - 1), addr + 1);
	else
		snprintf(out, len, "%.*s", (int)n, addr);
}

static void flush_one(struct net *n, struct refused_src *r, uint64_t now)
{
	char why[800];
	size_t used = 0;
	why[0] = 0;
	for (int i = 0; i < REFUSED_REASONS && r->why[i].n && used < sizeof(why); i++)
		used += (size_t)snprintf(why + used, sizeof(why) - used, "%s%u x %s", i ? "; " : "",
					 r->why[i].n, r->why[i].text);
	if (r->other && used < sizeof(why))
		snprintf(why + used, sizeof(why) - used, "; %u for other reasons", r->other);
	if (r->more)
		status_log(n, "refused %u more connections from %s in the last %.0f s: %s", r->more,
			   r->host, (double)(now - r->since_ns) / 1e9, why);
	memset(r, 0, sizeof(*r));
}

/* Counts one more refusal of r for reason. */
static void count_reason(struct refused_src *r, const char *reason)
{
	r->more++;
	for (int i = 0; i < REFUSED_REASONS; i++) {
		if (!r->why[i].n) {
			snprintf(r->why[i].text, sizeof(r->why[i].text), "%s", reason);
			r->why[i].n = 1;
			return;
		}
		if (!strncmp(r->why[i].text, reason, sizeof(r->why[i].text) - 1)) {
			r->why[i].n++;
			return;
		}
	}
	r->other++;
}

void status_log_refused(struct net *n, const char *what, const char *addr, const char *reason)
{
	char host[64];
	uint64_t now = now_ns();
	struct refused_src *r = NULL, *oldest = &n->refused[0];
	snprintf(n->last_refused, sizeof(n->last_refused), "%s from %s: %s", what, addr, reason);
	source_of(addr, host, sizeof(host));
	for (int i = 0; i < REFUSED_SOURCES && !r; i++) {
		struct refused_src *s = &n->refused[i];
		if (s->host[0] && !strcmp(s->host, host))
			r = s;
		else if (!s->host[0] || (oldest->host[0] && s->since_ns < oldest->since_ns))
			oldest = s;
	}
	if (r && now - r->since_ns < REFUSED_LOG_NS) {
		count_reason(r, reason);
		return;
	}
	if (!r) {
		r = oldest;
		if (r->host[0])
			flush_one(n, r, now);
	} else {
		flush_one(n, r, now);
	}
	snprintf(r->host, sizeof(r->host), "%s", host);
	r->since_ns = now;
	status_log(n, "refused %s from %s: %s", what, addr, reason);
}

void status_flush_refused(struct net *n, bool all)
{
	uint64_t now = now_ns();
	for (int i = 0; i < REFUSED_SOURCES; i++) {
		struct refused_src *r = &n->refused[i];
		if (r->host[0] && (all || now - r->since_ns >= REFUSED_LOG_NS))
			flush_one(n, r, now);
	}
}

static const char *op_name(uint32_t op)
{
	switch (op) {
	case MESHRUN__COLL_OP__COLL_ALL_GATHER: return "all_gather";
	case MESHRUN__COLL_OP__COLL_REDUCE_SCATTER: return "reduce_scatter";
	case MESHRUN__COLL_OP__COLL_ALL_REDUCE: return "all_reduce";
	case MESHRUN__COLL_OP__COLL_ALL_TO_ALL: return "all_to_all";
	case MESHRUN__COLL_OP__COLL_PERMUTE: return "permute";
	case MESHRUN__COLL_OP__COLL_BROADCAST: return "broadcast";
	case MESHRUN__COLL_OP__COLL_BARRIER: return "barrier";
	case MESHRUN__COLL_OP__COLL_P2P: return "p2p";
	default: return NULL;
	}
}

void status_activity(struct net *n, char *buf, size_t len)
{
	const char *name = op_name(atomic_load_explicit(&n->last_op, memory_order_relaxed));
	if (name)
		snprintf(buf, len, " during %s step %llu", name,
			 (unsigned long long)atomic_load_explicit(&n->last_step, memory_order_relaxed));
	else
		buf[0] = 0;
}

void status_set_ready(struct net *n)
{
	pthread_mutex_lock(&n->mu);
	n->ready = true;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
}

void status_set_closed(struct net *n)
{
	pthread_mutex_lock(&n->mu);
	n->closed = true;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
}

bool status_record(struct net *n, int status, const char *msg)
{
	bool first = false;
	pthread_mutex_lock(&n->mu);
	if (!n->status) {
		n->status = status < 0 ? status : NET_ERR;
		snprintf(n->msg, sizeof(n->msg), "%s", msg);
		first = true;
	}
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
	return first;
}

int status_failed(struct net *n)
{
	pthread_mutex_lock(&n->mu);
	int s = n->status;
	pthread_mutex_unlock(&n->mu);
	return s;
}
