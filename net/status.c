/* What the net thread shares with the control thread (ready, closed, the
 * first failure, under n->mu) and how it speaks to the operator (log lines,
 * the operation in progress for failure messages). Calls nothing else in
 * net/. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

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
